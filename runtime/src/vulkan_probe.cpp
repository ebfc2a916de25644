#include "kvouter/vulkan_probe.h"

#include <dlfcn.h>
#include <vulkan/vulkan.h>

#include <cstdlib>
#include <algorithm>
#include <limits>
#include <mutex>

#include "kvouter/errors.h"
#include "vulkan_float_controls.h"

namespace kvouter {

namespace {

// The devices, found once per process. The instance that found them is kept, never destroyed:
// destroying it lets the loader unload the driver, and lavapipe (Mesa 22.3.6) leaves a 128-byte
// allocation made at its start-up behind, which LeakSanitizer then reports from an unloaded
// module in every process that asked (measured under the asan preset). Kept, the driver stays
// loaded and that allocation reachable; the device list does not change during a process.
std::vector<VulkanDevice> find_vulkan_devices(std::string* why) {
  std::vector<VulkanDevice> out;
  auto fail = [&](const std::string& w) {
    if (why) *why = w;
    return out;
  };
  void* lib = dlopen("libvulkan.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) return fail("the Vulkan loader libvulkan.so.1 cannot be loaded");
  auto get = reinterpret_cast<PFN_vkGetInstanceProcAddr>(dlsym(lib, "vkGetInstanceProcAddr"));
  if (!get) return fail("libvulkan.so.1 has no vkGetInstanceProcAddr");
  auto create = reinterpret_cast<PFN_vkCreateInstance>(get(nullptr, "vkCreateInstance"));
  // Vulkan 1.2's property structures (float controls) are only filled for an instance of 1.2 or later.
  auto instance_version = reinterpret_cast<PFN_vkEnumerateInstanceVersion>(get(nullptr, "vkEnumerateInstanceVersion"));
  uint32_t loader_version = VK_API_VERSION_1_0;
  if (instance_version) instance_version(&loader_version);
  VkApplicationInfo app{VK_STRUCTURE_TYPE_APPLICATION_INFO, nullptr, "kvouter", 1, "kvouter", 1,
                        std::min<uint32_t>(loader_version, VK_API_VERSION_1_3)};
  VkInstanceCreateInfo ci{VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO, nullptr, 0, &app, 0, nullptr, 0, nullptr};
  VkInstance inst = VK_NULL_HANDLE;
  if (!create || create(&ci, nullptr, &inst) != VK_SUCCESS) {
    return fail("vkCreateInstance failed: no Vulkan driver (ICD) is installed or it failed to initialise");
  }
  auto enumerate = reinterpret_cast<PFN_vkEnumeratePhysicalDevices>(get(inst, "vkEnumeratePhysicalDevices"));
  auto props = reinterpret_cast<PFN_vkGetPhysicalDeviceProperties>(get(inst, "vkGetPhysicalDeviceProperties"));
  uint32_t n = 0;
  if (enumerate && enumerate(inst, &n, nullptr) == VK_SUCCESS && n > 0) {
    std::vector<VkPhysicalDevice> devs(n);
    enumerate(inst, &n, devs.data());
    for (auto d : devs) {
      VkPhysicalDeviceProperties p{};
      props(d, &p);
      const char* type = p.deviceType == VK_PHYSICAL_DEVICE_TYPE_CPU              ? "cpu"
                         : p.deviceType == VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU   ? "discrete-gpu"
                         : p.deviceType == VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU ? "integrated-gpu"
                         : p.deviceType == VK_PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU    ? "virtual-gpu"
                                                                                  : "other";
      VulkanDevice dev{p.deviceName, type, p.apiVersion, p.limits.maxStorageBufferRange,
                       p.limits.maxComputeSharedMemorySize};
      VkPhysicalDeviceFloatControlsProperties fc;
      detail::float_controls(get, inst, app.apiVersion, d, &fc);
      dev.denorm_preserve_float32 = fc.shaderDenormPreserveFloat32 == VK_TRUE;
      dev.denorm_flush_float32 = fc.shaderDenormFlushToZeroFloat32 == VK_TRUE;
      out.push_back(std::move(dev));
    }
  }
  if (out.empty()) return fail("the Vulkan loader found no physical device");
  return out;
}

}  // namespace

std::vector<VulkanDevice> vulkan_devices(std::string* why) {
  static std::string reason;
  static const std::vector<VulkanDevice> devices = find_vulkan_devices(&reason);
  if (why && devices.empty()) *why = reason;
  return devices;
}

std::vector<std::string> vulkan_instance_layers() {
  std::vector<std::string> out;
  void* lib = dlopen("libvulkan.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) return out;
  auto get = reinterpret_cast<PFN_vkGetInstanceProcAddr>(dlsym(lib, "vkGetInstanceProcAddr"));
  auto enumerate = get ? reinterpret_cast<PFN_vkEnumerateInstanceLayerProperties>(
                             get(nullptr, "vkEnumerateInstanceLayerProperties"))
                       : nullptr;
  uint32_t n = 0;
  if (enumerate && enumerate(&n, nullptr) == VK_SUCCESS && n > 0) {
    std::vector<VkLayerProperties> layers(n);
    if (enumerate(&n, layers.data()) == VK_SUCCESS) {
      for (uint32_t i = 0; i < n; ++i) out.push_back(layers[i].layerName);
    }
  }
  return out;
}

int64_t vulkan_max_buffer_floats() {
  static const int64_t floats = [] {
    uint64_t bytes = 0;
    for (const auto& d : vulkan_devices()) bytes = bytes == 0 ? d.max_storage_buffer_bytes : std::min(bytes, d.max_storage_buffer_bytes);
    const int64_t f = static_cast<int64_t>(bytes / sizeof(float)) - 16;
    return std::max<int64_t>(0, std::min<int64_t>(f, std::numeric_limits<int32_t>::max() - 16));
  }();
  return floats;
}

void require_vulkan_device() {
  static std::once_flag once;
  static std::string reason;
  static bool ok = false;
  std::call_once(once, [] {
    ok = !vulkan_devices(&reason).empty();
    // Halide 21's Vulkan allocator rounds the region of a kernel's scalar-argument uniform buffer
    // down to 64 bytes: a kernel with 84 bytes of scalar arguments (the forward's, with its int32
    // tile arrays' strides last) then read zeros for them on lavapipe (robust buffer access), and
    // every edge looked empty. Rounding every region up to 64 bytes fixes it (measured, docs/vulkan.md
    // limit 1). The device buffers are padded to 64 bytes as well (round64, device_detail.h). A caller's
    // own setting wins. Set here, once, before Halide's Vulkan runtime first reads it.
    setenv("HL_VK_ALLOC_CONFIG", kHalideVulkanAllocConfig, 0);
  });
  if (!ok) throw BackendError("vulkan: no usable Vulkan device: " + reason);
}

}  // namespace kvouter
