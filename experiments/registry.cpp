#include "registry.h"

#include <algorithm>
#include <cstdlib>
#include <mutex>

#include "../reference/dense_eigen.h"
#include "cli_util.h"
#include "../reference/direct.h"
#include "kvouter/backend.h"
#include "kvouter/errors.h"
#include "kvouter/plan.h"
#include "kvouter/aot.h"
#include "kvouter/aot_kernels.h"
#include "kvouter/jit.h"
#include "kvouter/vulkan_probe.h"
#include "schedule_registry.h"

namespace kvouter::experiments {

namespace {

// The autoscheduled GPU twins are research baselines, and Halide 21's GPU autoschedulers give
// wrong kernels for some inputs of this pipeline (docs/vulkan.md; the gpu tests' expected
// failures). So a GPU twin's result is never returned unchecked: each run is compared with the
// float64 oracle, and an input too large for the oracle is refused, unless the caller checks the
// results itself and says so (BackendConfig::caller_checks_results, as the tuner does; from the
// command line, KVOUTER_UNCHECKED_TWINS=1).
class CheckedTwin : public Backend {
 public:
  static constexpr double kMaxOracleWork = 4e8;  // multiply-adds of the dense oracle (~1 s here)

  explicit CheckedTwin(std::unique_ptr<Backend> inner) : inner_(std::move(inner)) {}
  std::string name() const override { return inner_->name(); }
  std::string schedule() const override { return inner_->schedule(); }
  std::string target() const override { return inner_->target(); }
  std::map<std::string, std::string> params() const override { return inner_->params(); }
  PlanOptions plan_options() const override { return inner_->plan_options(); }
  Outputs run(const Plan& plan, const InputsView& in) override {
    const Problem& p = plan.problem;
    double work = 0;
    for (int64_t b = 0; b < p.B; ++b) {
      work += static_cast<double>(p.qo_len(b)) * static_cast<double>(p.kv_len[static_cast<size_t>(b)]) *
              static_cast<double>(p.Hq) * static_cast<double>(p.D) * 2;
    }
    if (work > kMaxOracleWork) {
      throw BackendError(inner_->schedule() + " is an autoscheduled GPU twin with known wrong results (docs/vulkan.md); its "
                         "runs are checked against the float64 oracle, and this input is too large to check (" +
                         std::to_string(static_cast<int64_t>(work / 1e6)) + "M multiply-adds, at most " +
                         std::to_string(static_cast<int64_t>(kMaxOracleWork / 1e6)) +
                         "M). Use a manual schedule, or set KVOUTER_UNCHECKED_TWINS=1 if you check the results yourself");
    }
    inner_->set_kernel_timing(kernel_timing_);
    Outputs out = inner_->run(plan, in);
    timing_ = inner_->last_timing();
    const auto err = compare_outputs(out, reference::dense_attention<double>(in, p));
    if (!err.ok()) {
      throw BackendError(inner_->schedule() + " (an autoscheduled GPU twin) gave outputs off the float64 oracle on this input "
                         "(max|out err| " + std::to_string(err.max_out_err) + ", max|lse err| " +
                         std::to_string(err.max_lse_err) + "): a known Halide 21 autoscheduler defect (docs/vulkan.md); "
                         "no result returned");
    }
    return out;
  }

 private:
  std::unique_ptr<Backend> inner_;
};

bool unchecked_twins_allowed() {
  const char* v = std::getenv("KVOUTER_UNCHECKED_TWINS");
  return v && std::string(v) == "1";
}

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
           auto backend = halide::make_jit_backend(c, info->autoscheduler, info->device);
           if (!info->autoscheduler.empty() && info->device == "vulkan" && !c.caller_checks_results &&
               !unchecked_twins_allowed()) {
             return std::unique_ptr<Backend>(std::make_unique<CheckedTwin>(std::move(backend)));
           }
           return backend;
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
           if (c.schedule.empty()) c.schedule = default_schedule(c.target);
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
// The fastest correct CPU schedule measured on SPEC prefill: cpu_tiled, JIT 100.6 ms against
// cpu_decode's 137 and cpu_rowstream's 248; on decode cpu_decode, 24.3 against cpu_tiled's 31.6 ms
// (experiments/results/cpu_bench.json, 2026-12-07, run 4fccfa5, the Xeon host). Every CPU host of
// the tuning database (the Xeon, Zen 3 and Zen 4 hosts) took the same two (default_schedule).
const char* default_cpu_schedule() { return "cpu_tiled"; }
// The fastest correct schedule measured on each kind of device (kernel medians, warm clocks, the
// SPIR-V stage on; per shape class the tuning database's entries take precedence):
// - a GPU through Vulkan or CUDA: vulkan_slices. Measured on the NVIDIA H200 only, 2026-12-03, in
//   one run against vulkan_onepass and vulkan_tiled (experiments/results/gpu/2026-12-03/gpu_bench_slices.json):
//   CUDA gpu-decode 0.71 ms (onepass 0.83, tiled 1.38), gpu-prefill 147 ms (173, 266); Vulkan
//   gpu-decode 1.78 ms (2.18, 2.99), gpu-prefill 268 ms (336, 329).
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
  return is_cuda_target(target) || vulkan_gpu_present() ? "vulkan_slices" : "vulkan_tiled";
}
const char* default_schedule(const std::string& target) {
  return is_vulkan_target(target) || is_cuda_target(target) ? default_gpu_schedule(target) : default_cpu_schedule();
}
const char* default_schedule(const std::string& target, const Problem& p) {
  if (is_vulkan_target(target) || is_cuda_target(target)) return default_gpu_schedule(target);
  return is_decode_step(p) ? "cpu_decode" : default_cpu_schedule();
}
std::string default_target() {
  // Vulkan only on a real GPU: measured on the H200, the Vulkan kernels beat this project's CPU
  // paths on the GPU shapes (docs/vulkan.md); on lavapipe (a CPU device) they are slower than
  // the CPU schedules, so a CPU Vulkan device never becomes the default.
  return vulkan_gpu_present() ? "host-vulkan" : "host";
}


}  // namespace kvouter::experiments
