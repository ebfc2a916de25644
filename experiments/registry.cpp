#include "registry.h"

#include <algorithm>
#include <mutex>

#include "../reference/dense_eigen.h"
#include "../reference/direct.h"
#include "kvouter/backend.h"
#include "kvouter/errors.h"
#include "kvouter/aot.h"
#include "kvouter/aot_kernels.h"
#include "kvouter/jit.h"
#include "kvouter/vulkan_probe.h"
#include "schedules.h"

namespace kvouter::experiments {

namespace {

void register_all_backends_once() {
  auto& r = BackendRegistry::instance();
  auto host = [] { return std::vector<std::string>{"host"}; };
  r.add({"direct", "seed-style KV-outer C++ (8-lane SIMD, threads over work units): the baseline",
         [] { return std::vector<std::string>{"seed-simd8"}; }, host, reference::make_direct_backend});
  r.add({"dense", "Eigen dense masked attention (float): the oracle's algorithm as a baseline",
         [] { return std::vector<std::string>{"eigen-f32"}; }, host, reference::make_dense_backend});
  r.add({"jit", "Halide pipelines JIT-compiled on demand for (schedule, knobs, target, shape)",
         [] {
           std::vector<std::string> names;
           for (const auto& s : pipeline::all_schedules()) names.push_back(s.name);
           return names;
         },
         [] {
           std::vector<std::string> t = {"host"};
           if (!vulkan_devices().empty()) t.push_back("host-vulkan");
           return t;
         },
         [](const BackendConfig& cfg) {
           BackendConfig c = cfg;
           if (c.schedule.empty()) c.schedule = is_vulkan_target(c.target) ? default_gpu_schedule(c.target) : default_cpu_schedule();
           const pipeline::ScheduleInfo* info = pipeline::find_schedule(c.schedule);
           if (!info) {
             std::string known;
             for (const auto& s : pipeline::all_schedules()) known += (known.empty() ? "" : ", ") + s.name;
             throw BackendError("--schedule: expected one of {" + known + "}, got '" + c.schedule + "'");
           }
           for (const auto& [k, v] : info->default_params) c.params.emplace(k, v);  // unless set
           return halide::make_jit_backend(c, info->autoscheduler, info->device);
         }});
  halide::register_generated_aot_kernels();
  r.add({"aot", "Halide pipelines generated at build time (no compiler at run time)",
         [] {
           std::vector<std::string> names;
           for (const auto& v : halide::aot_variants()) {
             if (std::find(names.begin(), names.end(), v.schedule) == names.end()) names.push_back(v.schedule);
           }
           return names;
         },
         [] {
           std::vector<std::string> targets;
           for (const auto& v : halide::aot_variants()) {
             if (std::find(targets.begin(), targets.end(), v.target) == targets.end()) targets.push_back(v.target);
           }
           return targets;
         },
         [](const BackendConfig& cfg) {
           BackendConfig c = cfg;
           if (c.schedule.empty()) c.schedule = is_vulkan_target(c.target) || is_cuda_target(c.target) ? default_gpu_schedule(c.target) : default_cpu_schedule();
           return halide::make_aot_backend(c);  // checks the device
         }});
}

}  // namespace

// Once per process: the registry is not locked, and threads that each call this before making a
// backend (the JIT's concurrency test does) must not write it while another reads it.
void register_all_backends() {
  static std::once_flag once;
  std::call_once(once, register_all_backends_once);
}

const char* default_backend() { return "jit"; }
const char* default_cpu_schedule() { return "cpu_tiled"; }
// The fastest correct schedule measured on each kind of device (kernel medians, warm clocks, the
// SPIR-V stage on; per shape class the tuning database's entries take precedence):
// - a GPU through Vulkan: vulkan_onepass. Measured on the NVIDIA H200 only: gpu-decode 2.32 ms
//   against vulkan_tiled's 2.77 (experiments/results/gpu/2026-12-01/gpu_bench_variants_robust_on.json);
//   on gpu-prefill vulkan_tiled is 3.6 % faster (311 against 322 ms, gpu_bench_stage_on.json there),
//   which the database's H200 entry for that shape class picks.
// - CUDA (H200): vulkan_onepass, 0.87 ms against 1.41 on gpu-decode (gpu_bench_stage_on.json).
// - a CPU Vulkan device (lavapipe in CI): vulkan_tiled, about 30x faster there than vulkan_fused
//   (docs/vulkan.md).
namespace {

// A Vulkan GPU, not a CPU device such as lavapipe.
bool vulkan_gpu_present() {
  const auto devices = vulkan_devices();
  return std::any_of(devices.begin(), devices.end(), [](const VulkanDevice& d) { return d.type != "cpu"; });
}

}  // namespace

const char* default_gpu_schedule(const std::string& target) {
  return is_cuda_target(target) || vulkan_gpu_present() ? "vulkan_onepass" : "vulkan_tiled";
}
std::string default_target() {
  // Vulkan only on a real GPU: measured on the H200, the Vulkan kernels beat this project's CPU
  // paths on the GPU shapes (docs/vulkan.md); on lavapipe (a CPU device) they are slower than
  // the CPU schedules, so a CPU Vulkan device never becomes the default.
  return vulkan_gpu_present() ? "host-vulkan" : "host";
}


}  // namespace kvouter::experiments
