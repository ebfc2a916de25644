// The SPIR-V stage's place in front of the Vulkan driver (kvouter/spirv_stage.h). Halide's Vulkan
// runtime obtains vkGetInstanceProcAddr through halide_get_library_symbol; the stage hands back
// a wrapper, which hands back wrappers of vkGetDeviceProcAddr and vkCreateShaderModule, so every
// module Halide creates passes through spirv::rewrite() just before the driver (and, when
// enabled, the validation layer) sees it.
#include <dlfcn.h>
#include <vulkan/vulkan.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "kvouter/spirv_stage.h"
#include "vulkan_float_controls.h"

namespace kvouter::spirv {

namespace {

std::atomic<PFN_vkGetInstanceProcAddr> real_get_instance_proc{nullptr};
std::atomic<PFN_vkGetDeviceProcAddr> real_get_device_proc{nullptr};
std::atomic<PFN_vkCreateShaderModule> instance_create_shader_module{nullptr};  // the loader's trampoline
std::atomic<PFN_vkCreateDevice> real_create_device{nullptr};
std::atomic<VkInstance> last_instance{VK_NULL_HANDLE};  // the instance Halide asked vkCreateDevice of

std::mutex mu;
std::map<VkDevice, PFN_vkCreateShaderModule> device_create_shader_module;  // guarded by mu
std::set<VkDevice> devices_preserving_denorms;                              // guarded by mu
StageStats stats;                                                          // guarded by mu

PFN_vkCreateShaderModule create_shader_module_for(VkDevice device) {
  {
    std::lock_guard<std::mutex> lock(mu);
    auto it = device_create_shader_module.find(device);
    if (it != device_create_shader_module.end()) return it->second;
  }
  return instance_create_shader_module.load();
}

void dump(int64_t n, const char* what, const uint32_t* words, size_t count) {
  static const char* dir = std::getenv("KVOUTER_SPIRV_DUMP");
  if (!dir || !*dir) return;
  const std::string path = std::string(dir) + "/" + std::to_string(n) + "." + what + ".spv";
  if (FILE* f = std::fopen(path.c_str(), "wb")) {
    std::fwrite(words, sizeof(uint32_t), count, f);
    std::fclose(f);
  }
}

VKAPI_ATTR VkResult VKAPI_CALL staged_create_shader_module(VkDevice device, const VkShaderModuleCreateInfo* info,
                                                           const VkAllocationCallbacks* allocator,
                                                           VkShaderModule* module) {
  const PFN_vkCreateShaderModule real = create_shader_module_for(device);
  if (!real) return VK_ERROR_INITIALIZATION_FAILED;
  if (!stage_enabled() || !info || !info->pCode || info->codeSize % 4 != 0) {
    return real(device, info, allocator, module);
  }
  const size_t count = info->codeSize / 4;
  int64_t n = 0;
  RewriteOptions options;
  {
    std::lock_guard<std::mutex> lock(mu);
    n = stats.modules++;
    options.denorm_preserve_32 = devices_preserving_denorms.count(device) > 0;
  }
  dump(n, "in", info->pCode, count);
  RewriteReport rep;
  std::vector<uint32_t> words;
  try {
    words = rewrite(info->pCode, count, &rep, options);
  } catch (const SpirvError&) {
    std::lock_guard<std::mutex> lock(mu);
    stats.errors++;
    return real(device, info, allocator, module);
  }
  {
    std::lock_guard<std::mutex> lock(mu);
    stats.rewritten += rep.changed() ? 1 : 0;
    stats.fences_kept += rep.fence_kept_because.empty() ? 0 : 1;
    stats.non_writable += rep.non_writable;
    stats.non_readable += rep.non_readable;
    stats.barriers_narrowed += rep.barriers_narrowed;
    stats.barriers_removed += rep.barriers_removed;
    stats.denorm_preserve += rep.denorm_preserve > 0 ? 1 : 0;
  }
  dump(n, "out", words.data(), words.size());
  VkShaderModuleCreateInfo staged = *info;
  staged.pCode = words.data();
  staged.codeSize = words.size() * sizeof(uint32_t);
  return real(device, &staged, allocator, module);
}

// Whether modules for devices of `physical` get DenormPreserve 32: the device keeps float32
// subnormals when asked (VkPhysicalDeviceFloatControlsProperties, core in Vulkan 1.2, where
// SPV_KHR_float_controls needs no device extension).
bool preserves_denorms(VkPhysicalDevice physical) {
  // Halide 21 creates its instance for Vulkan 1.3.
  VkPhysicalDeviceFloatControlsProperties fc;
  const bool v12 = detail::float_controls(real_get_instance_proc.load(), last_instance.load(), VK_API_VERSION_1_3, physical, &fc);
  return asks_denorm_preserve(v12, fc.shaderDenormPreserveFloat32 == VK_TRUE);
}

void note_device(VkPhysicalDevice physical, VkDevice device) {
  const bool preserve = preserves_denorms(physical);
  std::lock_guard<std::mutex> lock(mu);
  stats.devices_created++;
  if (!preserve) {
    devices_preserving_denorms.erase(device);  // a handle a destroyed device had may come back
  } else if (devices_preserving_denorms.insert(device).second) {
    stats.devices_preserving_denorms++;
  }
}

// Halide 21 enables every feature the device offers, robustBufferAccess among them: each buffer
// access is then bounds-checked by the device, and an out-of-range read returns 0 instead of
// failing. With robust_access() off the device is created without it (the features Halide asked
// for are restored in its structures after the call).
VKAPI_ATTR VkResult VKAPI_CALL staged_create_device(VkPhysicalDevice physical, const VkDeviceCreateInfo* info,
                                                    const VkAllocationCallbacks* allocator, VkDevice* device) {
  const PFN_vkCreateDevice real = real_create_device.load();
  if (!real) return VK_ERROR_INITIALIZATION_FAILED;
  if (robust_access() || !info) {
    const VkResult r = real(physical, info, allocator, device);
    if (r == VK_SUCCESS && device) note_device(physical, *device);
    return r;
  }
  std::vector<std::pair<VkBool32*, VkBool32>> restore;
  auto clear = [&](const VkPhysicalDeviceFeatures* f) {
    if (!f || !f->robustBufferAccess) return;
    auto* flag = const_cast<VkBool32*>(&f->robustBufferAccess);
    restore.push_back({flag, *flag});
    *flag = VK_FALSE;
  };
  clear(info->pEnabledFeatures);
  for (auto* next = static_cast<const VkBaseInStructure*>(info->pNext); next; next = next->pNext) {
    if (next->sType == VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2) {
      clear(&reinterpret_cast<const VkPhysicalDeviceFeatures2*>(next)->features);
    }
  }
  const VkResult r = real(physical, info, allocator, device);
  for (auto& [flag, value] : restore) *flag = value;
  if (r == VK_SUCCESS && device) note_device(physical, *device);
  if (r == VK_SUCCESS && !restore.empty()) {
    std::lock_guard<std::mutex> lock(mu);
    stats.devices_without_robust_access++;
  }
  return r;
}

VKAPI_ATTR PFN_vkVoidFunction VKAPI_CALL staged_get_device_proc(VkDevice device, const char* name) {
  const PFN_vkGetDeviceProcAddr real = real_get_device_proc.load();
  if (!real || !name) return nullptr;
  const PFN_vkVoidFunction f = real(device, name);
  if (!f) return f;
  if (std::strcmp(name, "vkCreateShaderModule") == 0) {
    std::lock_guard<std::mutex> lock(mu);
    device_create_shader_module[device] = reinterpret_cast<PFN_vkCreateShaderModule>(f);
    return reinterpret_cast<PFN_vkVoidFunction>(&staged_create_shader_module);
  }
  if (std::strcmp(name, "vkGetDeviceProcAddr") == 0) return reinterpret_cast<PFN_vkVoidFunction>(&staged_get_device_proc);
  return f;
}

VKAPI_ATTR PFN_vkVoidFunction VKAPI_CALL staged_get_instance_proc(VkInstance instance, const char* name) {
  const PFN_vkGetInstanceProcAddr real = real_get_instance_proc.load();
  if (!real || !name) return nullptr;
  const PFN_vkVoidFunction f = real(instance, name);
  if (!f) return f;
  if (std::strcmp(name, "vkGetInstanceProcAddr") == 0) {
    return reinterpret_cast<PFN_vkVoidFunction>(&staged_get_instance_proc);
  }
  if (std::strcmp(name, "vkGetDeviceProcAddr") == 0) {
    real_get_device_proc = reinterpret_cast<PFN_vkGetDeviceProcAddr>(f);
    return reinterpret_cast<PFN_vkVoidFunction>(&staged_get_device_proc);
  }
  if (std::strcmp(name, "vkCreateDevice") == 0) {
    if (instance != VK_NULL_HANDLE) last_instance = instance;
    real_create_device = reinterpret_cast<PFN_vkCreateDevice>(f);
    return reinterpret_cast<PFN_vkVoidFunction>(&staged_create_device);
  }
  if (std::strcmp(name, "vkCreateShaderModule") == 0) {
    instance_create_shader_module = reinterpret_cast<PFN_vkCreateShaderModule>(f);
    return reinterpret_cast<PFN_vkVoidFunction>(&staged_create_shader_module);
  }
  return f;
}

}  // namespace

bool robust_access() {
  static const bool on = [] {
    const char* e = std::getenv("KVOUTER_VK_ROBUST_ACCESS");
    return !(e && (std::strcmp(e, "off") == 0 || std::strcmp(e, "0") == 0));
  }();
  return on;
}

StageStats stage_stats() {
  std::lock_guard<std::mutex> lock(mu);
  return stats;
}

void* get_library_symbol(void* lib, const char* name) {
  // Halide's own default on POSIX: dlsym on the library (a null handle is RTLD_DEFAULT).
  void* sym = dlsym(lib, name);
  if (sym && name && std::strcmp(name, "vkGetInstanceProcAddr") == 0) {
    real_get_instance_proc = reinterpret_cast<PFN_vkGetInstanceProcAddr>(sym);
    return reinterpret_cast<void*>(&staged_get_instance_proc);
  }
  return sym;
}

}  // namespace kvouter::spirv
