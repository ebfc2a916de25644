// Device-to-host copies on Vulkan through a host-cached staging buffer of our own. Halide 21's
// halide_copy_to_host stages through uncached, coherent host memory, and reading that with the
// CPU ran at about 30 MB/s on the H200's driver (4 MB of out/lse: 142 ms; docs/vulkan.md limit
// 14). Here the copy is recorded on Halide's own device and queue (taken with its context lock),
// behind a barrier on every earlier compute write, into HOST_CACHED memory.
#include "kvouter/vulkan_readback.h"

#include <dlfcn.h>
#include <vulkan/vulkan.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <type_traits>
#include <mutex>

#include "kvouter/host_copy.h"

namespace kvouter::halide {

namespace {

VulkanContextFns context_fns;
std::mutex mu;

struct Fns {
  PFN_vkGetDeviceProcAddr get_device = nullptr;
  PFN_vkGetPhysicalDeviceMemoryProperties memory_properties = nullptr;
  PFN_vkCreateBuffer create_buffer = nullptr;
  PFN_vkDestroyBuffer destroy_buffer = nullptr;
  PFN_vkGetBufferMemoryRequirements requirements = nullptr;
  PFN_vkAllocateMemory allocate = nullptr;
  PFN_vkFreeMemory free = nullptr;
  PFN_vkBindBufferMemory bind = nullptr;
  PFN_vkMapMemory map = nullptr;
  PFN_vkInvalidateMappedMemoryRanges invalidate = nullptr;
  PFN_vkFlushMappedMemoryRanges flush = nullptr;
  PFN_vkCreateCommandPool create_pool = nullptr;
  PFN_vkAllocateCommandBuffers allocate_commands = nullptr;
  PFN_vkBeginCommandBuffer begin = nullptr;
  PFN_vkEndCommandBuffer end = nullptr;
  PFN_vkResetCommandBuffer reset = nullptr;
  PFN_vkCmdPipelineBarrier barrier = nullptr;
  PFN_vkCmdCopyBuffer copy = nullptr;
  PFN_vkQueueSubmit submit = nullptr;
  PFN_vkCreateFence create_fence = nullptr;
  PFN_vkWaitForFences wait = nullptr;
  PFN_vkResetFences reset_fence = nullptr;
  PFN_vkDestroyFence destroy_fence = nullptr;
  PFN_vkDestroyCommandPool destroy_pool = nullptr;
};

// One staging buffer, command buffer and fence for the process's Vulkan device (Halide's one
// context), kept for the process's life; and a second command buffer and fence for the one
// submission that may be in flight while the host works (vulkan_write_device_async).
struct Staging {
  VkDevice device = VK_NULL_HANDLE;
  Fns f;
  VkBuffer buffer = VK_NULL_HANDLE;
  VkDeviceMemory memory = VK_NULL_HANDLE;
  void* mapped = nullptr;
  bool coherent = false;
  VkDeviceSize size = 0;
  VkCommandPool pool = VK_NULL_HANDLE;
  VkCommandBuffer commands = VK_NULL_HANDLE;
  VkFence fence = VK_NULL_HANDLE;
  VkCommandBuffer async_commands = VK_NULL_HANDLE;
  VkFence async_fence = VK_NULL_HANDLE;
  bool async_pending = false;  // async_commands submitted, async_fence not yet waited for
};
Staging staging;

// With mu held: the submission in flight, if any, waited for. False where the wait failed.
bool finish_async_locked() {
  if (!staging.async_pending) return true;
  const Fns& f = staging.f;
  const bool ok = f.wait(staging.device, 1, &staging.async_fence, VK_TRUE, UINT64_MAX) == VK_SUCCESS;
  f.reset_fence(staging.device, 1, &staging.async_fence);
  staging.async_pending = false;
  return ok;
}

// At exit, before Halide's runtime destroys the device (its destructor runs after the atexit
// handlers): every object made here, destroyed.
void release_staging() {
  std::lock_guard<std::mutex> lock(mu);
  if (!staging.device) return;
  finish_async_locked();
  const Fns& f = staging.f;
  if (staging.buffer) {
    f.destroy_buffer(staging.device, staging.buffer, nullptr);
    f.free(staging.device, staging.memory, nullptr);
  }
  f.destroy_fence(staging.device, staging.fence, nullptr);
  f.destroy_fence(staging.device, staging.async_fence, nullptr);
  f.destroy_pool(staging.device, staging.pool, nullptr);
  staging = Staging{};
}

template <class T>
bool load(PFN_vkGetInstanceProcAddr gipa, VkInstance instance, const char* name, T* out) {
  *out = reinterpret_cast<T>(gipa(instance, name));
  return *out != nullptr;
}

bool init(VkInstance instance, VkDevice device, uint32_t family) {
  if (staging.device == device) return true;
  if (staging.device) finish_async_locked();
  static void* lib = dlopen("libvulkan.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) return false;
  auto gipa = reinterpret_cast<PFN_vkGetInstanceProcAddr>(dlsym(lib, "vkGetInstanceProcAddr"));
  if (!gipa) return false;
  Fns f;
  if (!load(gipa, instance, "vkGetDeviceProcAddr", &f.get_device) ||
      !load(gipa, instance, "vkGetPhysicalDeviceMemoryProperties", &f.memory_properties)) {
    return false;
  }
  auto dev = [&](const char* name, auto* out) {
    *out = reinterpret_cast<std::remove_pointer_t<decltype(out)>>(f.get_device(device, name));
    return *out != nullptr;
  };
  if (!dev("vkCreateBuffer", &f.create_buffer) || !dev("vkDestroyBuffer", &f.destroy_buffer) ||
      !dev("vkGetBufferMemoryRequirements", &f.requirements) || !dev("vkAllocateMemory", &f.allocate) ||
      !dev("vkFreeMemory", &f.free) || !dev("vkBindBufferMemory", &f.bind) || !dev("vkMapMemory", &f.map) ||
      !dev("vkInvalidateMappedMemoryRanges", &f.invalidate) || !dev("vkFlushMappedMemoryRanges", &f.flush) ||
      !dev("vkCreateCommandPool", &f.create_pool) ||
      !dev("vkAllocateCommandBuffers", &f.allocate_commands) || !dev("vkBeginCommandBuffer", &f.begin) ||
      !dev("vkEndCommandBuffer", &f.end) || !dev("vkResetCommandBuffer", &f.reset) ||
      !dev("vkCmdPipelineBarrier", &f.barrier) || !dev("vkCmdCopyBuffer", &f.copy) || !dev("vkQueueSubmit", &f.submit) ||
      !dev("vkCreateFence", &f.create_fence) || !dev("vkWaitForFences", &f.wait) || !dev("vkResetFences", &f.reset_fence) ||
      !dev("vkDestroyFence", &f.destroy_fence) || !dev("vkDestroyCommandPool", &f.destroy_pool)) {
    return false;
  }
  VkCommandPoolCreateInfo pi{VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO, nullptr,
                             VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT, family};
  VkCommandPool pool = VK_NULL_HANDLE;
  if (f.create_pool(device, &pi, nullptr, &pool) != VK_SUCCESS) return false;
  VkCommandBufferAllocateInfo ai{VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO, nullptr, pool,
                                 VK_COMMAND_BUFFER_LEVEL_PRIMARY, 2};
  VkCommandBuffer commands[2] = {VK_NULL_HANDLE, VK_NULL_HANDLE};
  if (f.allocate_commands(device, &ai, commands) != VK_SUCCESS) {
    f.destroy_pool(device, pool, nullptr);
    return false;
  }
  VkFenceCreateInfo fi{VK_STRUCTURE_TYPE_FENCE_CREATE_INFO, nullptr, 0};
  VkFence fences[2] = {VK_NULL_HANDLE, VK_NULL_HANDLE};
  for (VkFence& fence : fences) {
    if (f.create_fence(device, &fi, nullptr, &fence) != VK_SUCCESS) {
      for (VkFence made : fences) {
        if (made) f.destroy_fence(device, made, nullptr);
      }
      f.destroy_pool(device, pool, nullptr);
      return false;
    }
  }
  static const bool registered = (std::atexit(release_staging), true);
  (void)registered;
  staging = Staging{};
  staging.device = device;
  staging.f = f;
  staging.pool = pool;
  staging.commands = commands[0];
  staging.fence = fences[0];
  staging.async_commands = commands[1];
  staging.async_fence = fences[1];
  return true;
}

struct HostBuffer {
  VkBuffer buffer = VK_NULL_HANDLE;
  VkDeviceMemory memory = VK_NULL_HANDLE;
  void* mapped = nullptr;
  bool coherent = false;
};

// A host-cached, mapped buffer of `bytes` on the staging's device (init() first); false without
// host-cached memory.
bool make_host_buffer(VkPhysicalDevice physical, VkDeviceSize bytes, HostBuffer* out) {
  const Fns& f = staging.f;
  VkBufferCreateInfo bi{VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO, nullptr, 0, bytes,
                        VK_BUFFER_USAGE_TRANSFER_DST_BIT | VK_BUFFER_USAGE_TRANSFER_SRC_BIT | VK_BUFFER_USAGE_STORAGE_BUFFER_BIT,
                        VK_SHARING_MODE_EXCLUSIVE,
                        0, nullptr};
  VkBuffer buffer = VK_NULL_HANDLE;
  if (f.create_buffer(staging.device, &bi, nullptr, &buffer) != VK_SUCCESS) return false;
  VkMemoryRequirements req{};
  f.requirements(staging.device, buffer, &req);
  VkPhysicalDeviceMemoryProperties props{};
  f.memory_properties(physical, &props);
  // Host-visible and cached (reads at memory speed); coherent where the device offers both.
  int best = -1, best_score = -1;
  for (uint32_t i = 0; i < props.memoryTypeCount; ++i) {
    if (!(req.memoryTypeBits & (1u << i))) continue;
    const VkMemoryPropertyFlags fl = props.memoryTypes[i].propertyFlags;
    if (!(fl & VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT)) continue;
    const int score = ((fl & VK_MEMORY_PROPERTY_HOST_CACHED_BIT) ? 2 : 0) + ((fl & VK_MEMORY_PROPERTY_HOST_COHERENT_BIT) ? 1 : 0);
    if (score > best_score) best = static_cast<int>(i), best_score = score;
  }
  if (best < 0 || best_score < 2) {
    f.destroy_buffer(staging.device, buffer, nullptr);
    return false;  // no cached host memory: Halide's own copy is as good
  }
  VkMemoryAllocateInfo mi{VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO, nullptr, req.size, static_cast<uint32_t>(best)};
  VkDeviceMemory memory = VK_NULL_HANDLE;
  void* mapped = nullptr;
  if (f.allocate(staging.device, &mi, nullptr, &memory) != VK_SUCCESS ||
      f.bind(staging.device, buffer, memory, 0) != VK_SUCCESS ||
      f.map(staging.device, memory, 0, VK_WHOLE_SIZE, 0, &mapped) != VK_SUCCESS) {
    if (memory) f.free(staging.device, memory, nullptr);
    f.destroy_buffer(staging.device, buffer, nullptr);
    return false;
  }
  out->buffer = buffer;
  out->memory = memory;
  out->mapped = mapped;
  out->coherent = (props.memoryTypes[best].propertyFlags & VK_MEMORY_PROPERTY_HOST_COHERENT_BIT) != 0;
  return true;
}

bool reserve(VkPhysicalDevice physical, VkDeviceSize bytes) {
  if (bytes <= staging.size) return true;
  const Fns& f = staging.f;
  if (staging.buffer) {
    f.destroy_buffer(staging.device, staging.buffer, nullptr);
    f.free(staging.device, staging.memory, nullptr);
    staging.buffer = VK_NULL_HANDLE;
    staging.size = 0;
  }
  bytes = std::max<VkDeviceSize>(bytes, VkDeviceSize{1} << 20);
  HostBuffer h;
  if (!make_host_buffer(physical, bytes, &h)) return false;
  staging.buffer = h.buffer;
  staging.memory = h.memory;
  staging.mapped = h.mapped;
  staging.coherent = h.coherent;
  staging.size = bytes;
  return true;
}

}  // namespace

void set_vulkan_context_fns(const VulkanContextFns& fns) {
  std::lock_guard<std::mutex> lock(mu);
  context_fns = fns;
}

namespace {

// The VkBuffer behind a whole allocation of Halide 21's Vulkan runtime: its device handle is a
// MemoryRegion whose first member is the VkBuffer's handle (every allocation here, never a crop).
VkBuffer vk_buffer_of(const halide_buffer_t* buf) {
  const auto* region = reinterpret_cast<void* const*>(buf->device);
  return *static_cast<const VkBuffer*>(region[0]);
}

// Halide's Vulkan context, held for this object's life (ok false where it could not be taken).
struct HeldContext {
  halide_vulkan_memory_allocator* allocator = nullptr;
  VkInstance instance = VK_NULL_HANDLE;
  VkDevice device = VK_NULL_HANDLE;
  VkPhysicalDevice physical = VK_NULL_HANDLE;
  VkQueue queue = VK_NULL_HANDLE;
  uint32_t family = 0;
  VkDebugUtilsMessengerEXT messenger = VK_NULL_HANDLE;
  bool ok = false;
  HeldContext() {
    ok = context_fns.acquire && context_fns.release &&
         context_fns.acquire(nullptr, &allocator, &instance, &device, &physical, &queue, &family, &messenger, false) == 0;
  }
  ~HeldContext() {
    if (ok) context_fns.release(nullptr, instance, device, queue, messenger);
  }
  HeldContext(const HeldContext&) = delete;
  HeldContext& operator=(const HeldContext&) = delete;
};

// With Halide's context held and the staging at least `bytes`: before(mapped) fills the staging,
// record(commands) records the copies, after(mapped) reads it; one submission, waited for.
// mapped: a buffer of our own that the copies also read (flushed first) or write (invalidated
// after), where it is not coherent.
template <class Before, class Record, class After>
bool with_staging(int64_t bytes, Before before, Record record, After after, VkDeviceMemory mapped_memory = VK_NULL_HANDLE,
                  bool mapped_coherent = true) {
  HeldContext held;
  if (!held.ok) return false;
  const VkDevice device = held.device;
  const VkQueue queue = held.queue;
  bool ok = init(held.instance, device, held.family) && reserve(held.physical, static_cast<VkDeviceSize>(bytes));
  if (ok) {
    const Fns& f = staging.f;
    before(staging.mapped);
    if (!staging.coherent && staging.memory) {
      VkMappedMemoryRange r{VK_STRUCTURE_TYPE_MAPPED_MEMORY_RANGE, nullptr, staging.memory, 0, VK_WHOLE_SIZE};
      ok = f.flush(device, 1, &r) == VK_SUCCESS;
    }
    if (ok && mapped_memory && !mapped_coherent) {
      VkMappedMemoryRange r{VK_STRUCTURE_TYPE_MAPPED_MEMORY_RANGE, nullptr, mapped_memory, 0, VK_WHOLE_SIZE};
      ok = f.flush(device, 1, &r) == VK_SUCCESS;
    }
    f.reset(staging.commands, 0);
    VkCommandBufferBeginInfo bi{VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO, nullptr,
                                VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT, nullptr};
    ok = ok && f.begin(staging.commands, &bi) == VK_SUCCESS;
    if (ok) {
      record(f, staging.commands);
      ok = f.end(staging.commands) == VK_SUCCESS;
    }
    if (ok) {
      VkSubmitInfo si{VK_STRUCTURE_TYPE_SUBMIT_INFO, nullptr, 0, nullptr, nullptr, 1, &staging.commands, 0, nullptr};
      ok = f.submit(queue, 1, &si, staging.fence) == VK_SUCCESS &&
           f.wait(device, 1, &staging.fence, VK_TRUE, UINT64_MAX) == VK_SUCCESS;
      f.reset_fence(device, 1, &staging.fence);
    }
    if (ok && !staging.coherent && staging.memory) {
      VkMappedMemoryRange r{VK_STRUCTURE_TYPE_MAPPED_MEMORY_RANGE, nullptr, staging.memory, 0, VK_WHOLE_SIZE};
      ok = f.invalidate(device, 1, &r) == VK_SUCCESS;
    }
    if (ok && mapped_memory && !mapped_coherent) {
      VkMappedMemoryRange r{VK_STRUCTURE_TYPE_MAPPED_MEMORY_RANGE, nullptr, mapped_memory, 0, VK_WHOLE_SIZE};
      ok = f.invalidate(device, 1, &r) == VK_SUCCESS;
    }
    if (ok) after(staging.mapped);
  }
  return ok;
}

// Around a batch of uploads: every earlier use of the queue (kernels reading or writing the
// arrays, copies) before the copies write ...
void barrier_before_writes(const Fns& f, VkCommandBuffer commands) {
  VkMemoryBarrier mb{VK_STRUCTURE_TYPE_MEMORY_BARRIER, nullptr,
                     VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_READ_BIT |
                         VK_ACCESS_TRANSFER_WRITE_BIT,
                     VK_ACCESS_TRANSFER_WRITE_BIT};
  f.barrier(commands, VK_PIPELINE_STAGE_ALL_COMMANDS_BIT, VK_PIPELINE_STAGE_TRANSFER_BIT, 0, 1, &mb, 0, nullptr, 0, nullptr);
}

// ... and the copies before every later command of the queue (Halide's kernels among them, in
// later submissions too).
void barrier_after_writes(const Fns& f, VkCommandBuffer commands) {
  VkMemoryBarrier mb{VK_STRUCTURE_TYPE_MEMORY_BARRIER, nullptr, VK_ACCESS_TRANSFER_WRITE_BIT,
                     VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_READ_BIT |
                         VK_ACCESS_TRANSFER_WRITE_BIT};
  f.barrier(commands, VK_PIPELINE_STAGE_TRANSFER_BIT, VK_PIPELINE_STAGE_ALL_COMMANDS_BIT, 0, 1, &mb, 0, nullptr, 0, nullptr);
}

bool usable(const halide_buffer_t* buf) {
  return buf && buf->device && context_fns.acquire && context_fns.release && context_fns.interface &&
         buf->device_interface == context_fns.interface();
}

}  // namespace

bool vulkan_copies_serve(const halide_buffer_t* buf) {
  std::lock_guard<std::mutex> lock(mu);
  return usable(buf);
}

bool vulkan_read_device(const halide_buffer_t* buf, int64_t bytes, void* dst) {
  if (bytes <= 0) return false;
  std::lock_guard<std::mutex> lock(mu);
  if (!usable(buf)) return false;
  const VkBuffer src = vk_buffer_of(buf);
  return with_staging(
      bytes, [](void*) {},
      [&](const Fns& f, VkCommandBuffer commands) {
        // Every earlier write of the queue (kernels, copies) before the copy reads.
        VkMemoryBarrier mb{VK_STRUCTURE_TYPE_MEMORY_BARRIER, nullptr, VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_WRITE_BIT,
                           VK_ACCESS_TRANSFER_READ_BIT};
        f.barrier(commands, VK_PIPELINE_STAGE_ALL_COMMANDS_BIT, VK_PIPELINE_STAGE_TRANSFER_BIT, 0, 1, &mb, 0, nullptr, 0,
                  nullptr);
        VkBufferCopy region_copy{0, 0, static_cast<VkDeviceSize>(bytes)};
        f.copy(commands, src, staging.buffer, 1, &region_copy);
        VkMemoryBarrier hb{VK_STRUCTURE_TYPE_MEMORY_BARRIER, nullptr, VK_ACCESS_TRANSFER_WRITE_BIT, VK_ACCESS_HOST_READ_BIT};
        f.barrier(commands, VK_PIPELINE_STAGE_TRANSFER_BIT, VK_PIPELINE_STAGE_HOST_BIT, 0, 1, &hb, 0, nullptr, 0, nullptr);
      },
      [&](void* mapped) { host_copy(dst, mapped, bytes); });
}

bool vulkan_write_device(const std::vector<VulkanWrite>& writes) {
  if (writes.empty()) return true;
  std::lock_guard<std::mutex> lock(mu);
  // Each write at the next 256-byte offset of the staging.
  auto span = [](const VulkanWrite& w) { return (w.bytes + 255) / 256 * 256; };
  int64_t total = 0, direct = 0;
  const VulkanMappedBuffer* from = nullptr;  // (one at most)
  for (const VulkanWrite& w : writes) {
    if (!usable(w.dst) || w.bytes < w.src_bytes || w.src_bytes < 0) return false;
    if (w.from) {
      // Copied whole from the mapping: its bytes past src_bytes are the caller's zeros.
      if ((from && from != w.from) || !w.from->holds(w.src, w.bytes) || w.from->device_ != staging.device) return false;
      from = w.from;
      direct += w.bytes;
    } else {
      total += span(w);
    }
  }
  if (total == 0 && direct == 0) return true;
  return with_staging(
      total,
      [&](void* mapped) {
        char* at = static_cast<char*>(mapped);
        for (const VulkanWrite& w : writes) {
          if (w.from) continue;
          host_copy(at, w.src, w.src_bytes);
          host_copy(at + w.src_bytes, nullptr, w.bytes - w.src_bytes);
          at += span(w);
        }
      },
      [&](const Fns& f, VkCommandBuffer commands) {
        barrier_before_writes(f, commands);
        int64_t offset = 0;
        for (const VulkanWrite& w : writes) {
          if (w.from) {
            if (w.bytes > 0) {
              const auto at = static_cast<const char*>(w.src) - static_cast<const char*>(w.from->mapped_);
              VkBufferCopy c{static_cast<VkDeviceSize>(at), 0, static_cast<VkDeviceSize>(w.bytes)};
              f.copy(commands, reinterpret_cast<VkBuffer>(w.from->buffer_), vk_buffer_of(w.dst), 1, &c);
            }
            continue;
          }
          if (w.bytes > 0) {
            VkBufferCopy c{static_cast<VkDeviceSize>(offset), 0, static_cast<VkDeviceSize>(w.bytes)};
            f.copy(commands, staging.buffer, vk_buffer_of(w.dst), 1, &c);
          }
          offset += span(w);
        }
        barrier_after_writes(f, commands);
      },
      [](void*) {}, from ? reinterpret_cast<VkDeviceMemory>(from->memory_) : VK_NULL_HANDLE, from ? from->coherent_ : true);
}

bool vulkan_write_device_async(const std::vector<VulkanWrite>& writes) {
  std::lock_guard<std::mutex> lock(mu);
  if (writes.empty()) return true;
  const VulkanMappedBuffer* from = writes[0].from;
  for (const VulkanWrite& w : writes) {
    if (!usable(w.dst) || !w.from || w.from != from || w.bytes < w.src_bytes || w.src_bytes < 0 ||
        !from->holds(w.src, w.bytes)) {
      return false;
    }
  }
  // The last one's wait first, outside Halide's context lock (kernel launches take it).
  if (!finish_async_locked()) return false;  // (the one command buffer and fence: reused below)
  HeldContext held;
  if (!held.ok || !init(held.instance, held.device, held.family) || from->device_ != staging.device) return false;
  const Fns& f = staging.f;
  const auto memory = reinterpret_cast<VkDeviceMemory>(from->memory_);
  if (!from->coherent_) {
    VkMappedMemoryRange r{VK_STRUCTURE_TYPE_MAPPED_MEMORY_RANGE, nullptr, memory, 0, VK_WHOLE_SIZE};
    if (f.flush(held.device, 1, &r) != VK_SUCCESS) return false;
  }
  VkCommandBuffer commands = staging.async_commands;
  f.reset(commands, 0);
  VkCommandBufferBeginInfo bi{VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO, nullptr,
                              VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT, nullptr};
  if (f.begin(commands, &bi) != VK_SUCCESS) return false;
  barrier_before_writes(f, commands);
  for (const VulkanWrite& w : writes) {
    if (w.bytes <= 0) continue;
    const auto at = static_cast<const char*>(w.src) - static_cast<const char*>(from->mapped_);
    VkBufferCopy c{static_cast<VkDeviceSize>(at), 0, static_cast<VkDeviceSize>(w.bytes)};
    f.copy(commands, reinterpret_cast<VkBuffer>(from->buffer_), vk_buffer_of(w.dst), 1, &c);
  }
  barrier_after_writes(f, commands);
  if (f.end(commands) != VK_SUCCESS) return false;
  VkSubmitInfo si{VK_STRUCTURE_TYPE_SUBMIT_INFO, nullptr, 0, nullptr, nullptr, 1, &commands, 0, nullptr};
  if (f.submit(held.queue, 1, &si, staging.async_fence) != VK_SUCCESS) return false;
  staging.async_pending = true;
  return true;
}

bool vulkan_finish_writes() {
  std::lock_guard<std::mutex> lock(mu);
  return finish_async_locked();
}

bool vulkan_read_device(const std::vector<VulkanRead>& reads, const VulkanMappedBuffer& into) {
  if (reads.empty()) return true;
  std::lock_guard<std::mutex> lock(mu);
  if (!into.mapped_ || into.device_ != staging.device) return false;
  for (const VulkanRead& r : reads) {
    if (r.bytes < 0 || !usable(r.src) || !into.holds(r.dst, r.bytes)) return false;
  }
  return with_staging(
      0, [](void*) {},
      [&](const Fns& f, VkCommandBuffer commands) {
        // Every earlier write of the queue (kernels, copies) before the copies read.
        VkMemoryBarrier mb{VK_STRUCTURE_TYPE_MEMORY_BARRIER, nullptr, VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_WRITE_BIT,
                           VK_ACCESS_TRANSFER_READ_BIT};
        f.barrier(commands, VK_PIPELINE_STAGE_ALL_COMMANDS_BIT, VK_PIPELINE_STAGE_TRANSFER_BIT, 0, 1, &mb, 0, nullptr, 0,
                  nullptr);
        for (const VulkanRead& r : reads) {
          if (r.bytes == 0) continue;
          const auto at = static_cast<const char*>(r.dst) - static_cast<const char*>(into.mapped_);
          VkBufferCopy c{0, static_cast<VkDeviceSize>(at), static_cast<VkDeviceSize>(r.bytes)};
          f.copy(commands, vk_buffer_of(r.src), reinterpret_cast<VkBuffer>(into.buffer_), 1, &c);
        }
        VkMemoryBarrier hb{VK_STRUCTURE_TYPE_MEMORY_BARRIER, nullptr, VK_ACCESS_TRANSFER_WRITE_BIT, VK_ACCESS_HOST_READ_BIT};
        f.barrier(commands, VK_PIPELINE_STAGE_TRANSFER_BIT, VK_PIPELINE_STAGE_HOST_BIT, 0, 1, &hb, 0, nullptr, 0, nullptr);
      },
      [](void*) {}, reinterpret_cast<VkDeviceMemory>(into.memory_), into.coherent_);
}

// --- VulkanMappedBuffer ------------------------------------------------------------------------

VulkanMappedBuffer::~VulkanMappedBuffer() {
  std::lock_guard<std::mutex> lock(mu);
  release();
}

void VulkanMappedBuffer::release() {
  // (After release_staging at exit the device is Halide's to destroy, with what lives on it.)
  if (device_ && device_ == staging.device && buffer_) {
    finish_async_locked();  // (a copy from this mapping may be in flight)
    staging.f.destroy_buffer(staging.device, reinterpret_cast<VkBuffer>(buffer_), nullptr);
    staging.f.free(staging.device, reinterpret_cast<VkDeviceMemory>(memory_), nullptr);
  }
  device_ = nullptr;
  buffer_ = memory_ = 0;
  mapped_ = nullptr;
  size_ = 0;
}

bool VulkanMappedBuffer::holds(const void* p, int64_t bytes) const {
  const auto* c = static_cast<const char*>(p);
  const auto* m = static_cast<const char*>(mapped_);
  return mapped_ && bytes >= 0 && c >= m && c + bytes <= m + size_;
}

void* VulkanMappedBuffer::reserve(int64_t bytes) {
  std::lock_guard<std::mutex> lock(mu);
  if (mapped_ && bytes <= size_ && device_ == staging.device) return mapped_;
  HeldContext held;
  if (!held.ok) return nullptr;
  release();
  HostBuffer h;
  const int64_t size = std::max<int64_t>(bytes, 64);
  if (init(held.instance, held.device, held.family) && make_host_buffer(held.physical, static_cast<VkDeviceSize>(size), &h)) {
    device_ = held.device;
    buffer_ = reinterpret_cast<uint64_t>(h.buffer);
    memory_ = reinterpret_cast<uint64_t>(h.memory);
    mapped_ = h.mapped;
    size_ = size;
    coherent_ = h.coherent;
  }
  return mapped_;
}

bool vulkan_host_read_barrier(const VulkanMappedBuffer& m) {
  std::lock_guard<std::mutex> lock(mu);
  if (!m.mapped_ || m.device_ != staging.device) return false;
  return with_staging(
      0, [](void*) {},
      [](const Fns& f, VkCommandBuffer commands) {
        VkMemoryBarrier hb{VK_STRUCTURE_TYPE_MEMORY_BARRIER, nullptr, VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_WRITE_BIT,
                           VK_ACCESS_HOST_READ_BIT};
        f.barrier(commands, VK_PIPELINE_STAGE_ALL_COMMANDS_BIT, VK_PIPELINE_STAGE_HOST_BIT, 0, 1, &hb, 0, nullptr, 0, nullptr);
      },
      [](void*) {}, reinterpret_cast<VkDeviceMemory>(m.memory_), m.coherent_);
}

// --- VulkanMappedAlias ---------------------------------------------------------------------------

namespace {

// Halide 21's MemoryRegion (src/runtime/internal/memory_resources.h), as its Vulkan runtime reads
// a buffer argument's region at a kernel launch: an owning region's handle points at the VkBuffer,
// and its range (head and tail offsets) bounds the bytes bound to the kernel.
struct HalideMemoryRegion {
  void* handle;
  size_t offset, size, head_offset, tail_offset;
  bool dedicated, is_owner;
  int visibility, usage, caching;
  size_t alignment, nearest_multiple;
};
// (The layout is Halide 21's own: another Halide version must be checked against its source first.)
static_assert(HALIDE_VERSION_MAJOR == 21, "VulkanMappedAlias mirrors Halide 21's MemoryRegion");

}  // namespace

struct VulkanMappedAlias::Region : HalideMemoryRegion {};

VulkanMappedAlias::VulkanMappedAlias() : region_(std::make_unique<Region>()) {}
VulkanMappedAlias::~VulkanMappedAlias() = default;

bool VulkanMappedAlias::point_at(const VulkanMappedBuffer& m, int64_t offset, int64_t bytes, const halide_buffer_t* like) {
  std::lock_guard<std::mutex> lock(mu);
  // (A buffer of another runtime, the JIT's, lives on another device: not this mapping's.)
  if (!usable(like) || m.device_ != staging.device || !m.mapped_ || offset < 0 || bytes <= 0 || offset + bytes > m.size_) {
    return false;
  }
  vk_buffer_ = m.buffer_;
  *region_ = Region{};
  region_->handle = &vk_buffer_;
  region_->size = static_cast<size_t>(offset + bytes);
  region_->head_offset = static_cast<size_t>(offset);
  region_->dedicated = true;
  region_->is_owner = true;
  return true;
}

uint64_t VulkanMappedAlias::device() const { return reinterpret_cast<uint64_t>(region_.get()); }

}  // namespace kvouter::halide
