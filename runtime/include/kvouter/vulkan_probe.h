// Finding a Vulkan device before Halide touches one: Halide 21's Vulkan runtime aborts the process
// when no instance or device can be created, so the runtime asks the Vulkan loader itself first.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kvouter {

struct VulkanDevice {
  std::string name;
  std::string type;  // "cpu", "discrete-gpu", "integrated-gpu", "virtual-gpu", "other"
  uint32_t api_version = 0;
  uint64_t max_storage_buffer_bytes = 0;  // VkPhysicalDeviceLimits::maxStorageBufferRange
  uint64_t max_shared_bytes = 0;          // VkPhysicalDeviceLimits::maxComputeSharedMemorySize
  // VkPhysicalDeviceFloatControlsProperties::shaderDenormPreserveFloat32 (Vulkan 1.2 devices;
  // false below): whether a shader may ask the device to keep float32 subnormals.
  bool denorm_preserve_float32 = false;
  bool denorm_flush_float32 = false;  // ...::shaderDenormFlushToZeroFloat32
};

// The physical devices the loader reports (empty when there is no loader, no driver or no
// device). Never aborts.
std::vector<VulkanDevice> vulkan_devices(std::string* why = nullptr);

// The instance layers the Vulkan loader can enable (empty without a loader).
std::vector<std::string> vulkan_instance_layers();

// The most floats one device buffer of the Vulkan pipelines may hold: the smallest storage-buffer
// range of the devices present (Halide may pick any), within Halide's int32 indexing, less the
// runtime's 64-byte padding. 0 when there is no device.
int64_t vulkan_max_buffer_floats();

// HL_VK_ALLOC_CONFIG (pool MB : min block MB : max block MB : max blocks : round-to bytes) the
// runtime sets for Halide 21's Vulkan allocator unless the caller set it.
inline constexpr const char* kHalideVulkanAllocConfig = "0:64:0:0:64";

// Throws BackendError with the reason when no Vulkan device can be used. Must run before the
// first Vulkan pipeline call (sets HL_VK_ALLOC_CONFIG, see vulkan_probe.cpp).
void require_vulkan_device();

}  // namespace kvouter
