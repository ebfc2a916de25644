// Copies between the host and Vulkan device buffers at memory speed, through host-cached staging
// of our own (vulkan_readback.cpp says why Halide's own copies are not used for them).
#pragma once

#include <HalideRuntime.h>

#include <cstdint>
#include <memory>
#include <vector>

struct halide_vulkan_memory_allocator;
struct VkInstance_T;
struct VkDevice_T;
struct VkPhysicalDevice_T;
struct VkQueue_T;
struct VkDebugUtilsMessengerEXT_T;

namespace kvouter::halide {

// Halide's Vulkan context lock (halide_vulkan_acquire_context / release_context), which lives in
// the generated kernels' runtime: the generated registry hands it over.
struct VulkanContextFns {
  int (*acquire)(void*, halide_vulkan_memory_allocator**, VkInstance_T**, VkDevice_T**, VkPhysicalDevice_T**,
                 VkQueue_T**, uint32_t*, VkDebugUtilsMessengerEXT_T**, bool) = nullptr;
  int (*release)(void*, VkInstance_T*, VkDevice_T*, VkQueue_T*, VkDebugUtilsMessengerEXT_T*) = nullptr;
  const halide_device_interface_t* (*interface)() = nullptr;  // buffers of other devices are refused
};
void set_vulkan_context_fns(const VulkanContextFns& fns);

// Whether `buf` is a Vulkan allocation of the runtime whose context these copies use (the AOT
// kernels'; the JIT's runtime is another, with a device of its own).
bool vulkan_copies_serve(const halide_buffer_t* buf);

// Copies the first `bytes` of `buf`'s Vulkan allocation (a whole allocation of Halide's Vulkan
// runtime, never a crop) into `dst`, after every write queued before it. False when it cannot
// (no context functions, no host-cached memory type): the caller then uses halide_copy_to_host.
bool vulkan_read_device(const halide_buffer_t* buf, int64_t bytes, void* dst);

// Host-to-device writes, several in one submission through the same staging: dst's allocation
// gets src_bytes from src, then zeros up to `bytes` (a whole allocation of Halide's Vulkan runtime,
// never a crop). After every use of the queue queued before it, and before any after it. False
// when it cannot (as vulkan_read_device): the caller then uses halide_copy_to_device.
class VulkanMappedBuffer;
struct VulkanWrite {
  const halide_buffer_t* dst = nullptr;
  const void* src = nullptr;
  int64_t src_bytes = 0;
  int64_t bytes = 0;
  // src lies in this buffer's mapping: copied from there by the device, with no host copy.
  const VulkanMappedBuffer* from = nullptr;
};
bool vulkan_write_device(const std::vector<VulkanWrite>& writes);

// As vulkan_write_device for writes copied from one mapping (`from` set on each), but returns once
// they are submitted, so that the host works while the device copies: vulkan_finish_writes()
// waits for them (a later submission waits for them in the queue by itself). One such submission
// is in flight at a time: the next waits for the last. The mapping's bytes must stay as they are
// until the wait. False when it cannot (as vulkan_write_device; nothing submitted).
bool vulkan_write_device_async(const std::vector<VulkanWrite>& writes);
bool vulkan_finish_writes();  // false where the wait failed

// Device-to-host reads, several in one submission, straight into `into`'s mapping (each dst a
// pointer into it; no host copy). False when it cannot: the caller then reads each otherwise.
struct VulkanRead {
  const halide_buffer_t* src = nullptr;  // a whole allocation of Halide's Vulkan runtime
  int64_t bytes = 0;
  void* dst = nullptr;
};
bool vulkan_read_device(const std::vector<VulkanRead>& reads, const VulkanMappedBuffer& into);

// Host-cached memory of our own, mapped for its life, on Halide's Vulkan device: an engine writes
// its q there and reads its outputs there, and the device copies to and from it directly.
class VulkanMappedBuffer {
 public:
  VulkanMappedBuffer() = default;
  ~VulkanMappedBuffer();
  VulkanMappedBuffer(const VulkanMappedBuffer&) = delete;
  VulkanMappedBuffer& operator=(const VulkanMappedBuffer&) = delete;
  // At least `bytes` (its contents lost when it grows); nullptr where there is no Vulkan context or
  // no host-cached memory (the caller then stages through memory of its own).
  void* reserve(int64_t bytes);
  void* data() const { return mapped_; }
  int64_t size() const { return size_; }  // changes only when the mapping is made anew
  // Whether [p, p + bytes) lies in the mapping.
  bool holds(const void* p, int64_t bytes) const;

 private:
  friend bool vulkan_write_device(const std::vector<VulkanWrite>& writes);
  friend bool vulkan_write_device_async(const std::vector<VulkanWrite>& writes);
  friend bool vulkan_read_device(const std::vector<VulkanRead>& reads, const VulkanMappedBuffer& into);
  friend class VulkanMappedAlias;
  friend bool vulkan_host_read_barrier(const VulkanMappedBuffer& m);
  void release();
  VkDevice_T* device_ = nullptr;
  uint64_t buffer_ = 0, memory_ = 0;  // VkBuffer, VkDeviceMemory
  void* mapped_ = nullptr;
  int64_t size_ = 0;
  bool coherent_ = false;
};

// Every earlier device write of the queue (kernels, copies) made visible to the host's reads of
// `m` (one submission holding only that barrier, waited for; the mapping invalidated where it is
// not coherent): Halide's kernel launches record none, and a queue's wait alone does not make
// device writes visible to the host. False where it could not.
bool vulkan_host_read_barrier(const VulkanMappedBuffer& m);

// Bytes [offset, offset + bytes) of a mapping as a Halide Vulkan device buffer's memory, for
// kernels to write straight into host memory (the host reads it there after
// vulkan_host_read_barrier). Its device handle stands in for an allocation of Halide 21's Vulkan runtime: a
// region laid out as the runtime's MemoryRegion, which its kernel launches read (the VkBuffer, the
// range). Only kernel arguments: never a buffer for Halide's copies, crops or frees. Valid while
// the mapping is not made anew (reserve() growing it) and point_at is not called again.
class VulkanMappedAlias {
 public:
  VulkanMappedAlias();
  ~VulkanMappedAlias();
  VulkanMappedAlias(const VulkanMappedAlias&) = delete;
  VulkanMappedAlias& operator=(const VulkanMappedAlias&) = delete;
  // For kernels that take `like` (a Vulkan allocation of the runtime whose context these copies
  // use): false where `like` is another runtime's, or the range does not lie in the mapping.
  bool point_at(const VulkanMappedBuffer& m, int64_t offset, int64_t bytes, const halide_buffer_t* like);
  uint64_t device() const;  // halide_buffer_t::device (device_interface: like's)

 private:
  struct Region;
  std::unique_ptr<Region> region_;
  uint64_t vk_buffer_ = 0;  // the region's handle points here
};

}  // namespace kvouter::halide
