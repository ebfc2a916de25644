// vk_pipeline_stats: what the Vulkan driver made of a Halide-generated kernel. Compiles each SPIR-V
// module (one per kernel, as experiments/gpu/spirv_dis.py --spv-dir writes them) into a compute
// pipeline on the first Vulkan device and prints the driver's statistics for it
// (VK_KHR_pipeline_executable_properties: on NVIDIA e.g. registers, shared and local memory).
// No counters and no compiler of our own: the Vulkan counterpart of `ptxas -v` for the CUDA
// target's PTX, which is how the README compares the two targets' code for the same schedule.
//
//   vk_pipeline_stats K0.spv [K1.spv ...]
//
// The descriptor set layout is read off the module (OpDecorate DescriptorSet/Binding and the
// Block / BufferBlock decoration of each variable's type), so any Halide Vulkan kernel works.
// The modules go through the runtime's SPIR-V stage first, as in a kernel launch
// (KVOUTER_SPIRV_STAGE=off: Halide's module as generated), so the two can be compared.
// Exit status: 0 with the statistics, 2 on bad input or a pipeline the driver rejects, 77 when
// the device has no pipeline statistics (lavapipe in CI: the layout and the pipeline are still
// built and checked).
#include <vulkan/vulkan.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "kvouter/spirv_stage.h"

namespace {

constexpr int kNoStatistics = 77;

// A zeroed Vulkan structure of type T with its sType set.
template <class T>
T vk(VkStructureType type) {
  T x{};
  x.sType = type;
  return x;
}

// Vulkan's two-call enumeration: get(&count, nullptr), then get(&count, data), each element
// starting as `init` (for the structures with an sType).
template <class T, class Get>
std::vector<T> enumerate(Get get, const T& init = T{}) {
  uint32_t n = 0;
  get(&n, nullptr);
  std::vector<T> out(n, init);
  get(&n, out.data());
  out.resize(n);
  return out;
}

struct Binding {
  uint32_t set = 0, binding = 0;
  VkDescriptorType type = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER;
};

[[noreturn]] void fail(const std::string& what) {
  std::fprintf(stderr, "vk_pipeline_stats: %s\n", what.c_str());
  std::exit(2);
}

void check(VkResult r, const char* what) {
  if (r != VK_SUCCESS) fail(std::string(what) + " failed (VkResult " + std::to_string(r) + ")");
}

std::vector<uint32_t> read_spirv(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(path + ": cannot be read");
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (bytes.size() < 20 || bytes.size() % 4)
    fail(path + ": not a SPIR-V module (size " + std::to_string(bytes.size()) + ")");
  std::vector<uint32_t> words(bytes.size() / 4);
  std::memcpy(words.data(), bytes.data(), bytes.size());
  if (words[0] != 0x07230203u) fail(path + ": not a SPIR-V module (bad magic)");
  return words;
}

// The resource bindings of a module: every variable with a DescriptorSet and a Binding; a uniform
// buffer where its pointee type is decorated Block in the Uniform storage class, else a storage
// buffer (BufferBlock, or the StorageBuffer class).
std::vector<Binding> reflect(const std::vector<uint32_t>& w, const std::string& path) {
  std::map<uint32_t, uint32_t> set_of, binding_of, pointee_of, class_of_ptr;
  std::set<uint32_t> block;
  std::vector<std::pair<uint32_t, uint32_t>> variables;  // (id, pointer type)
  for (size_t pos = 5; pos < w.size();) {
    const uint32_t count = w[pos] >> 16, op = w[pos] & 0xFFFF;
    if (count == 0 || pos + count > w.size())
      fail(path + ": truncated instruction at word " + std::to_string(pos));
    const uint32_t* a = &w[pos + 1];
    if (op == 71 && count >= 3) {  // OpDecorate target decoration [literal]
      if (a[1] == 34 && count >= 4) set_of[a[0]] = a[2];
      if (a[1] == 33 && count >= 4) binding_of[a[0]] = a[2];
      if (a[1] == 2) block.insert(a[0]);  // Block (BufferBlock is 3)
    } else if (op == 32 && count >= 4) {  // OpTypePointer result class type
      class_of_ptr[a[0]] = a[1];
      pointee_of[a[0]] = a[2];
    } else if (op == 59 && count >= 4) {  // OpVariable type result class
      variables.push_back({a[1], a[0]});
    }
    pos += count;
  }
  std::vector<Binding> out;
  for (const auto& [id, ptr] : variables) {
    if (!set_of.count(id) || !binding_of.count(id)) continue;
    Binding b{set_of[id], binding_of[id], VK_DESCRIPTOR_TYPE_STORAGE_BUFFER};
    if (class_of_ptr[ptr] == 2 && block.count(pointee_of[ptr]))
      b.type = VK_DESCRIPTOR_TYPE_UNIFORM_BUFFER;
    if (b.set != 0)
      fail(path + ": descriptor set " + std::to_string(b.set) +
           " (Halide's kernels use set 0 only)");
    out.push_back(b);
  }
  return out;
}

std::string value_of(const VkPipelineExecutableStatisticKHR& s) {
  switch (s.format) {
    case VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_BOOL32_KHR:
      return s.value.b32 ? "true" : "false";
    case VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_INT64_KHR:
      return std::to_string(s.value.i64);
    case VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_UINT64_KHR:
      return std::to_string(s.value.u64);
    case VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_FLOAT64_KHR:
      return std::to_string(s.value.f64);
    default:
      return "?";
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || std::string(argv[1]) == "--help") {
    std::fprintf(stderr, "usage: vk_pipeline_stats K0.spv [K1.spv ...]\n");
    return argc < 2 ? 2 : 0;
  }
  auto app = vk<VkApplicationInfo>(VK_STRUCTURE_TYPE_APPLICATION_INFO);
  app.pApplicationName = "vk_pipeline_stats";
  app.apiVersion = VK_API_VERSION_1_3;
  auto ici = vk<VkInstanceCreateInfo>(VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO);
  ici.pApplicationInfo = &app;
  VkInstance instance;
  check(vkCreateInstance(&ici, nullptr, &instance), "vkCreateInstance (no Vulkan driver?)");
  const auto phys = enumerate<VkPhysicalDevice>(
      [&](uint32_t* n, VkPhysicalDevice* p) { vkEnumeratePhysicalDevices(instance, n, p); });
  if (phys.empty()) fail("no Vulkan device");
  VkPhysicalDevice pd = phys[0];
  VkPhysicalDeviceProperties props;
  vkGetPhysicalDeviceProperties(pd, &props);

  const auto exts = enumerate<VkExtensionProperties>([&](uint32_t* n, VkExtensionProperties* p) {
    vkEnumerateDeviceExtensionProperties(pd, nullptr, n, p);
  });
  bool has_stats = false;
  for (const auto& e : exts)
    has_stats |=
        std::string(e.extensionName) == VK_KHR_PIPELINE_EXECUTABLE_PROPERTIES_EXTENSION_NAME;

  const auto qf = enumerate<VkQueueFamilyProperties>([&](uint32_t* n, VkQueueFamilyProperties* p) {
    vkGetPhysicalDeviceQueueFamilyProperties(pd, n, p);
  });
  const uint32_t nq = static_cast<uint32_t>(qf.size());
  uint32_t family = nq;
  for (uint32_t i = 0; i < nq; ++i) {
    if (qf[i].queueFlags & VK_QUEUE_COMPUTE_BIT) {
      family = i;
      break;
    }
  }
  if (family == nq) fail(std::string(props.deviceName) + " has no compute queue");
  const float priority = 1.f;
  auto qci = vk<VkDeviceQueueCreateInfo>(VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO);
  qci.queueFamilyIndex = family;
  qci.queueCount = 1;
  qci.pQueuePriorities = &priority;
  // What Halide's kernels may use (vk_int64; 8/16-bit types only with vk_int8/vk_int16).
  VkPhysicalDeviceFeatures supported;
  vkGetPhysicalDeviceFeatures(pd, &supported);
  VkPhysicalDeviceFeatures features{};
  features.shaderInt64 = supported.shaderInt64;
  features.robustBufferAccess = supported.robustBufferAccess;  // Halide's runtime enables it too
  auto exec = vk<VkPhysicalDevicePipelineExecutablePropertiesFeaturesKHR>(
      VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PIPELINE_EXECUTABLE_PROPERTIES_FEATURES_KHR);
  exec.pipelineExecutableInfo = VK_TRUE;
  const char* ext_name = VK_KHR_PIPELINE_EXECUTABLE_PROPERTIES_EXTENSION_NAME;
  auto dci = vk<VkDeviceCreateInfo>(VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO);
  dci.pNext = has_stats ? &exec : nullptr;
  dci.queueCreateInfoCount = 1;
  dci.pQueueCreateInfos = &qci;
  dci.enabledExtensionCount = has_stats ? 1 : 0;
  dci.ppEnabledExtensionNames = &ext_name;
  dci.pEnabledFeatures = &features;
  VkDevice device;
  check(vkCreateDevice(pd, &dci, nullptr, &device), "vkCreateDevice");
  auto get_props = reinterpret_cast<PFN_vkGetPipelineExecutablePropertiesKHR>(
      vkGetDeviceProcAddr(device, "vkGetPipelineExecutablePropertiesKHR"));
  auto get_stats = reinterpret_cast<PFN_vkGetPipelineExecutableStatisticsKHR>(
      vkGetDeviceProcAddr(device, "vkGetPipelineExecutableStatisticsKHR"));
  has_stats = has_stats && get_props && get_stats;
  std::printf("device: %s (driver %u.%u)\n", props.deviceName,
              VK_VERSION_MAJOR(props.driverVersion), VK_VERSION_MINOR(props.driverVersion));

  for (int f = 1; f < argc; ++f) {
    const std::string path = argv[f];
    std::vector<uint32_t> words = read_spirv(path);
    // What the driver gets through the runtime: the module after the SPIR-V stage, unless
    // KVOUTER_SPIRV_STAGE=off (then Halide's module as generated).
    if (kvouter::spirv::stage_enabled()) {
      kvouter::spirv::RewriteReport rep;
      try {
        words = kvouter::spirv::rewrite(words, &rep);
      } catch (const kvouter::spirv::SpirvError& e) {
        fail(path + ": " + e.what());
      }
      std::printf("%s: SPIR-V stage on: %d NonWritable, %d NonReadable, %d of %d barriers narrowed, %d removed%s\n",
                  path.c_str(), rep.non_writable, rep.non_readable, rep.barriers_narrowed, rep.barriers,
                  rep.barriers_removed, rep.fence_kept_because.empty() ? "" : ("; fences kept: " + rep.fence_kept_because).c_str());
    } else {
      std::printf("%s: SPIR-V stage off (KVOUTER_SPIRV_STAGE)\n", path.c_str());
    }
    const std::vector<Binding> bindings = reflect(words, path);
    std::vector<VkDescriptorSetLayoutBinding> lb;
    for (const auto& b : bindings) {
      lb.push_back({b.binding, b.type, 1, VK_SHADER_STAGE_COMPUTE_BIT, nullptr});
    }
    auto dl =
        vk<VkDescriptorSetLayoutCreateInfo>(VK_STRUCTURE_TYPE_DESCRIPTOR_SET_LAYOUT_CREATE_INFO);
    dl.bindingCount = static_cast<uint32_t>(lb.size());
    dl.pBindings = lb.data();
    VkDescriptorSetLayout set_layout;
    check(vkCreateDescriptorSetLayout(device, &dl, nullptr, &set_layout),
          "vkCreateDescriptorSetLayout");
    auto pl = vk<VkPipelineLayoutCreateInfo>(VK_STRUCTURE_TYPE_PIPELINE_LAYOUT_CREATE_INFO);
    pl.setLayoutCount = 1;
    pl.pSetLayouts = &set_layout;
    VkPipelineLayout layout;
    check(vkCreatePipelineLayout(device, &pl, nullptr, &layout), "vkCreatePipelineLayout");
    auto sm = vk<VkShaderModuleCreateInfo>(VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO);
    sm.codeSize = words.size() * 4;
    sm.pCode = words.data();
    VkShaderModule module;
    check(vkCreateShaderModule(device, &sm, nullptr, &module), "vkCreateShaderModule");
    // The entry point: the module's first OpEntryPoint (Halide emits one kernel per module).
    std::string entry;
    for (size_t pos = 5; pos < words.size() && entry.empty();) {
      const uint32_t count = words[pos] >> 16, op = words[pos] & 0xFFFF;
      if (op == 15 && count >= 4) entry = reinterpret_cast<const char*>(&words[pos + 3]);
      pos += count ? count : 1;
    }
    if (entry.empty()) fail(path + ": no OpEntryPoint");
    auto cp = vk<VkComputePipelineCreateInfo>(VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO);
    cp.flags = has_stats ? VK_PIPELINE_CREATE_CAPTURE_STATISTICS_BIT_KHR : 0;
    cp.stage = {VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO,
                nullptr,
                0,
                VK_SHADER_STAGE_COMPUTE_BIT,
                module,
                entry.c_str(),
                nullptr};
    cp.layout = layout;
    VkPipeline pipeline;
    check(vkCreateComputePipelines(device, VK_NULL_HANDLE, 1, &cp, nullptr, &pipeline),
          ("vkCreateComputePipelines for " + path).c_str());
    std::printf("%s: entry %s, %zu bindings, pipeline built\n", path.c_str(), entry.c_str(),
                bindings.size());
    if (has_stats) {
      auto pi = vk<VkPipelineInfoKHR>(VK_STRUCTURE_TYPE_PIPELINE_INFO_KHR);
      pi.pipeline = pipeline;
      const auto xs = enumerate(
          [&](uint32_t* n, VkPipelineExecutablePropertiesKHR* p) { get_props(device, &pi, n, p); },
          vk<VkPipelineExecutablePropertiesKHR>(
              VK_STRUCTURE_TYPE_PIPELINE_EXECUTABLE_PROPERTIES_KHR));
      for (uint32_t x = 0; x < xs.size(); ++x) {
        auto ei = vk<VkPipelineExecutableInfoKHR>(VK_STRUCTURE_TYPE_PIPELINE_EXECUTABLE_INFO_KHR);
        ei.pipeline = pipeline;
        ei.executableIndex = x;
        const auto st = enumerate(
            [&](uint32_t* n, VkPipelineExecutableStatisticKHR* p) { get_stats(device, &ei, n, p); },
            vk<VkPipelineExecutableStatisticKHR>(
                VK_STRUCTURE_TYPE_PIPELINE_EXECUTABLE_STATISTIC_KHR));
        std::printf("  executable %u (%s, subgroup %u):\n", x, xs[x].name, xs[x].subgroupSize);
        for (const auto& s : st) std::printf("    %s = %s\n", s.name, value_of(s).c_str());
      }
    }
    vkDestroyPipeline(device, pipeline, nullptr);
    vkDestroyShaderModule(device, module, nullptr);
    vkDestroyPipelineLayout(device, layout, nullptr);
    vkDestroyDescriptorSetLayout(device, set_layout, nullptr);
  }
  vkDestroyDevice(device, nullptr);
  vkDestroyInstance(instance, nullptr);
  if (!has_stats) {
    std::printf("no pipeline statistics: %s lacks %s\n", props.deviceName,
                VK_KHR_PIPELINE_EXECUTABLE_PROPERTIES_EXTENSION_NAME);
    return kNoStatistics;
  }
  return 0;
}
