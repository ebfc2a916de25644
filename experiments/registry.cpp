#include "registry.h"

#include <algorithm>

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

void register_all_backends() {
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
           if (c.schedule.empty()) c.schedule = is_vulkan_target(c.target) ? default_vulkan_schedule() : default_cpu_schedule();
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
           if (c.schedule.empty()) c.schedule = is_vulkan_target(c.target) || is_cuda_target(c.target) ? default_vulkan_schedule() : default_cpu_schedule();
           return halide::make_aot_backend(c);  // checks the device
         }});
}

const char* default_backend() { return "jit"; }
const char* default_cpu_schedule() { return "cpu_tiled"; }
// Measured on the H200 through Vulkan with warm clocks (README "Vulkan (GPU)"): vulkan_tiled
// 936 ms on gpu-prefill against vulkan_onepass's 1142 and vulkan_fused's 1445; on gpu-decode
// 5.8-6.1 ms against 5.6 and 7.0 (within 10 %). On lavapipe about 30x faster than vulkan_fused.
// (On the CUDA target vulkan_onepass is the fastest: 0.90 / 199 ms.)
const char* default_vulkan_schedule() { return "vulkan_tiled"; }
std::string default_target() {
  // Vulkan only on a real GPU: measured on the H200, the Vulkan kernels beat this project's CPU
  // paths on the GPU shapes (README "Vulkan"); on lavapipe (a CPU device) they are slower than
  // the CPU schedules, so a CPU Vulkan device never becomes the default.
  for (const auto& d : vulkan_devices()) {
    if (d.type != "cpu") return "host-vulkan";
  }
  return "host";
}


}  // namespace kvouter::experiments
