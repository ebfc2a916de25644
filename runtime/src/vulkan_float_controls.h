// A physical device's float controls (VkPhysicalDeviceFloatControlsProperties, core in Vulkan
// 1.2), as the device probe (vulkan_probe.cpp) and the SPIR-V stage's device hook
// (spirv_hook.cpp) read them. Internal to the runtime.
#pragma once
#include <vulkan/vulkan.h>

namespace kvouter::detail {

// False, with *fc all false, below Vulkan 1.2 (the instance's or the device's) or without the
// query; else true with *fc as the device reports it.
inline bool float_controls(PFN_vkGetInstanceProcAddr get, VkInstance instance, uint32_t instance_api,
                           VkPhysicalDevice physical, VkPhysicalDeviceFloatControlsProperties* fc) {
  *fc = VkPhysicalDeviceFloatControlsProperties{};
  fc->sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FLOAT_CONTROLS_PROPERTIES;
  if (!get || instance == VK_NULL_HANDLE || instance_api < VK_API_VERSION_1_2) return false;
  auto props = reinterpret_cast<PFN_vkGetPhysicalDeviceProperties>(get(instance, "vkGetPhysicalDeviceProperties"));
  auto props2 = reinterpret_cast<PFN_vkGetPhysicalDeviceProperties2>(get(instance, "vkGetPhysicalDeviceProperties2"));
  if (!props || !props2) return false;
  VkPhysicalDeviceProperties p{};
  props(physical, &p);
  if (p.apiVersion < VK_API_VERSION_1_2) return false;
  VkPhysicalDeviceProperties2 p2{};
  p2.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2;
  p2.pNext = fc;
  props2(physical, &p2);
  fc->pNext = nullptr;
  return true;
}

}  // namespace kvouter::detail
