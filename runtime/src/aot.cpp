#include "kvouter/aot.h"

#include <algorithm>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>

#include "kvouter/cuda_probe.h"
#include "kvouter/device_cache.h"
#include "kvouter/errors.h"
#include "kvouter/vulkan_probe.h"

namespace kvouter::halide {

namespace {

std::string (*error_source)() = nullptr;

std::vector<AotVariant>& variants() {
  static std::vector<AotVariant> v;
  return v;
}

bool spec_matches(const Specialization& variant, const Specialization& need) {
  auto ok = [](int v, int n) { return v == 0 || v == n; };
  return variant.dtype == need.dtype && ok(variant.D, need.D) && ok(variant.page_size, need.page_size) && ok(variant.block_size, need.block_size) &&
         ok(variant.qhead, need.qhead) && ok(variant.T, need.T);
}

int specificity(const Specialization& s) {
  return (s.D != 0) + (s.page_size != 0) + (s.block_size != 0) + (s.qhead != 0) + (s.T != 0);
}

}  // namespace

// Lavapipe (llvmpipe) ends all of a shader invocation's loops after 65535 iterations in total
// (Mesa's LP_MAX_TGSI_LOOP_ITERATIONS) and carries on: the results are silently wrong. The generic
// Vulkan variant (vulkan_generic_forward) loops (D + 2) / 32 x chunks x (D + 2) times per thread;
// on a CPU Vulkan device a shape past the limit is refused instead.
void check_generic_vulkan_loops(const AotVariant& v, const Plan& plan) {
  if (!is_vulkan_target(v.target) || specificity(v.spec) != 0) return;
  const auto devices = vulkan_devices();
  if (devices.empty() || devices.front().type != "cpu") return;
  int64_t chunk = 32;
  if (auto at = v.knobs.find("chunk="); at != std::string::npos) chunk = std::stoll(v.knobs.substr(at + 6));
  const Specialization s = Specialization::of(plan);
  const int64_t iterations = (s.D + 2 + 31) / 32 * ((s.block_size + chunk - 1) / chunk) * (s.D + 2);
  constexpr int64_t kLavapipeLoopLimit = 65535;
  if (iterations > kLavapipeLoopLimit) {
    throw BackendError("aot: " + v.name + " needs about " + std::to_string(iterations) + " loop iterations per thread at D " +
                       std::to_string(s.D) + ", block " + std::to_string(s.block_size) + ": more than the " +
                       std::to_string(kLavapipeLoopLimit) + " that " + devices.front().name +
                       " runs before it ends a shader's loops (its results would be wrong); use a GPU, or a variant "
                       "specialised for this shape");
  }
}

namespace {

class AotBackend final : public Backend {
 public:
  explicit AotBackend(const BackendConfig& cfg) : schedule_(cfg.schedule), target_(cfg.target.empty() ? "host" : cfg.target) {
    std::map<std::string, std::string> knobs = cfg.params;
    if (auto it = knobs.find("variant"); it != knobs.end()) {
      variant_ = it->second;
      knobs.erase(it);
      const AotVariant* v = nullptr;
      for (const auto& x : aot_variants()) v = x.name == variant_ ? &x : v;
      if (!v) {
        std::string have;
        for (const auto& x : aot_variants()) {
          if (x.schedule == schedule_ && x.target == target_) have += (have.empty() ? "" : ", ") + x.name;
        }
        throw BackendError("--param variant: no generated variant named '" + variant_ + "' (" + schedule_ + " for " +
                           target_ + " has: " + (have.empty() ? "none" : have) + ")");
      }
      if (v->schedule != schedule_ || v->target != target_) {
        throw BackendError("--param variant: '" + variant_ + "' is schedule '" + v->schedule + "' for target '" + v->target +
                           "', not '" + schedule_ + "' for '" + target_ + "'");
      }
    }
    for (const auto& [k, v] : knobs) {
      if (k != "T") throw BackendError("--param " + k + ": the aot backend runs generated variants; only T (the plan's tile size) and variant (one generated variant by name) may be set, other knobs need `kvouter export`");
      (void)v;
    }
    knobs_ = checked_knobs(knobs);
    bool any = false;
    for (const auto& v : aot_variants()) any |= v.schedule == schedule_ && v.target == target_;
    if (!any) {
      std::set<std::string> kinds;  // each schedule@target once
      for (const auto& v : aot_variants()) kinds.insert(v.schedule + "@" + v.target);
      std::string have;
      for (const auto& k : kinds) have += (have.empty() ? "" : ", ") + k;
      throw BackendError("aot: no generated kernel for schedule '" + schedule_ + "' and target '" + target_ + "' (have: " + have + ")");
    }
  }
  std::string name() const override { return "aot"; }
  std::string schedule() const override { return schedule_; }
  std::string target() const override { return target_; }
  std::map<std::string, std::string> params() const override {
    return {{"T", knobs_.at("T")}, {"variant", last_variant_}};
  }
  PlanOptions plan_options() const override {
    PlanOptions o{tile_edges_of(knobs_)};
    // GPU targets: batches whose arrays the step runner can hold (kvouter/device_cache.h).
    if (is_vulkan_target(target_) || is_cuda_target(target_)) {
      o.max_batch_partial_floats = DeviceStepRunner::max_batch_partial_floats(target_);
    }
    return o;
  }
  Outputs run(const Plan& plan, const InputsView& in) override {
    Outputs res = outputs_for(plan.problem);
    run_into(plan, in, res);
    return res;
  }
  void run_into(const Plan& plan, const InputsView& in, const OutputsView& out) override {
    const AotVariant& v = aot_select(schedule_, target_, plan, variant_);
    last_variant_ = v.name;
    check_generic_vulkan_loops(v, plan);
    const Kernels k = aot_kernels(v);
    timing_.compile_ms = 0;
    try {
      run_kernels(k, plan, in, out, &timing_, kernel_timing_, &partials_);
    } catch (const BackendError& e) {
      throw BackendError(std::string(e.what()) + (error_source ? ": " + error_source() : std::string()));
    }
  }

 private:
  std::string schedule_, target_;
  std::map<std::string, std::string> knobs_;
  std::string variant_;  // empty: the most specific variant that fits the plan
  HostArray<float> partials_;  // host kernels' partials, reused across calls (run_kernels)
  std::string last_variant_ = "-";
};

}  // namespace

void aot_register(const AotVariant& v) { variants().push_back(v); }

namespace {
std::vector<AotKvWriter>& kv_writers() {
  static std::vector<AotKvWriter> w;
  return w;
}
}  // namespace

void aot_register_kv_writer(const AotKvWriter& w) { kv_writers().push_back(w); }

const AotKvWriter& aot_kv_writer(const std::string& target, int bits) {
  for (const auto& w : kv_writers()) {
    if (w.target == target && w.bits == bits) return w;
  }
  throw BackendError("device cache: no generated KV writer for target '" + target + "' and " + std::to_string(bits) +
                     "-bit elements (generators/CMakeLists.txt builds host-vulkan and host-cuda; call "
                     "register_generated_aot_kernels() first)");
}

namespace {
std::vector<AotDecodePlan>& decode_plans() {
  static std::vector<AotDecodePlan> p;
  return p;
}
}  // namespace

void aot_register_decode_plan(const AotDecodePlan& p) { decode_plans().push_back(p); }

const AotDecodePlan& aot_decode_plan(const std::string& target) {
  for (const auto& p : decode_plans()) {
    if (p.target == target) return p;
  }
  throw BackendError("device step: no generated decode plan for target '" + target +
                     "' (generators/CMakeLists.txt builds host-vulkan, host-cuda and host; call "
                     "register_generated_aot_kernels() first)");
}

std::shared_ptr<const DeviceKit> generated_device_kit(const std::string& target) {
  if (is_vulkan_target(target)) {
    require_vulkan_device();
  } else if (is_cuda_target(target)) {
    require_cuda_device();
  } else {
    throw BackendError("device cache: target '" + target + "' is not a GPU target (host-vulkan or host-cuda)");
  }
  static std::mutex mu;
  static std::map<std::string, std::shared_ptr<const DeviceKit>> kits;
  std::lock_guard<std::mutex> lock(mu);
  auto& kit = kits[target];
  if (!kit) {
    const AotKvWriter& w32 = aot_kv_writer(target, 32);
    const AotKvWriter& w16 = aot_kv_writer(target, 16);
    kit = std::make_shared<const DeviceKit>(DeviceKit{target, w32.device(), w32.write, w16.write, aot_decode_plan(target).plan});
  }
  return kit;
}

Kernels aot_kernels(const AotVariant& v) {
  return {v.forward, v.combine, "aot", v.device ? v.device() : nullptr,
          v.device ? generated_device_kit(v.target) : nullptr, v.name};
}

void set_aot_error_source(std::string (*source)()) { error_source = source; }

const std::vector<AotVariant>& aot_variants() { return variants(); }

bool aot_variant_is_generic(const std::string& name) {
  for (const auto& v : variants()) {
    if (v.name == name) return specificity(v.spec) == 0;
  }
  return false;
}

namespace {

// The variants of (schedule, target) that fit the plan, the most specific first (in generation
// order among equals).
std::vector<const AotVariant*> fitting(const std::string& schedule, const std::string& target, const Plan& plan) {
  const Specialization need = Specialization::of(plan);
  std::vector<const AotVariant*> fit;
  for (const auto& v : variants()) {
    if (v.schedule == schedule && v.target == target && spec_matches(v.spec, need)) fit.push_back(&v);
  }
  std::stable_sort(fit.begin(), fit.end(),
                   [](const AotVariant* a, const AotVariant* b) { return specificity(a->spec) > specificity(b->spec); });
  return fit;
}

}  // namespace

const AotVariant& aot_select(const std::string& schedule, const std::string& target, const Plan& plan,
                             const std::string& name) {
  for (const AotVariant* v : fitting(schedule, target, plan)) {
    if (name.empty() || v->name == name) return *v;
  }
  throw BackendError("aot: no generated variant of '" + schedule + "' for target '" + target + "'" +
                     (name.empty() ? "" : " named '" + name + "'") + " fits " + Specialization::of(plan).str());
}

std::vector<std::string> aot_fitting(const std::string& schedule, const std::string& target, const Plan& plan) {
  std::vector<std::string> names;
  for (const AotVariant* v : fitting(schedule, target, plan)) names.push_back(v->name);
  return names;
}

std::unique_ptr<Backend> make_aot_backend(const BackendConfig& cfg) {
  // Here rather than in a registry, so that every way of making the backend gets them: the
  // device checks, and with the Vulkan one the setting Halide 21's allocator needs (made
  // directly without it, the GPU benchmark's AOT kernels wrote all-zero outputs on lavapipe).
  if (is_vulkan_target(cfg.target)) require_vulkan_device();
  if (is_cuda_target(cfg.target)) require_cuda_device();
  return std::make_unique<AotBackend>(cfg);
}

}  // namespace kvouter::halide
