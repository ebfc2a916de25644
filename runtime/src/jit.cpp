#include "kvouter/jit.h"

#include <Halide.h>
#include <dlfcn.h>

#include <filesystem>
#include <future>
#include <mutex>
#include <sstream>
#include <thread>

#include "kvouter/device_cache.h"
#include "kvouter_autoscheduler_params.h"
#include "kvouter/errors.h"
#include "kvouter/host_alloc.h"
#include "kvouter/prefetch.h"
#include "kvouter/spirv_stage.h"
#include "kvouter/vulkan_probe.h"
#include "kvouter/stats.h"

namespace kvouter::halide {

namespace {

std::string join_knobs(const std::map<std::string, std::string>& m) {
  std::string s;
  for (const auto& [k, v] : m) s += (s.empty() ? "" : ",") + k + "=" + v;
  return s;
}

// The shared runtime's default handlers, as the AOT registry installs them: the kernels' host
// allocations through kvouter/host_alloc.h, and the SPIR-V stage (kvouter/spirv_stage.h) in
// front of the Vulkan loader. JIT code takes both from the shared runtime's defaults (a pipeline's
// own jit_handlers() do not reach the Vulkan runtime's loader); the other defaults are kept.
void install_jit_handlers() {
  static std::once_flag once;
  std::call_once(once, [] {
    Halide::JITHandlers h = Halide::Internal::JITSharedRuntime::set_default_handlers({});
    h.custom_get_library_symbol = &spirv::get_library_symbol;
    h.custom_malloc = [](Halide::JITUserContext* ctx, size_t bytes) { return host_malloc(ctx, bytes); };
    h.custom_free = [](Halide::JITUserContext* ctx, void* ptr) { host_free(ctx, ptr); };
    Halide::Internal::JITSharedRuntime::set_default_handlers(h);
  });
}

Halide::Target to_target(const std::string& target) {
  install_jit_handlers();
  if (target.empty() || target == "host") return Halide::get_host_target();
  // Parsing "host-vulkan" makes Halide query the Vulkan device (for vk_v13 and the like), and
  // Halide's runtime aborts the process when there is none: look for one first.
  if (is_vulkan_target(target)) {
    require_vulkan_device();
  }
  if (!Halide::Target::validate_target_string(target)) {
    throw BackendError("--target: '" + target + "' is not a Halide target string");
  }
  Halide::Target t(target);
  // The pipelines index with 64-bit integers in places; Halide's Vulkan codegen needs vk_int64
  // for that (without it compilation fails).
  if (t.has_feature(Halide::Target::Vulkan)) t = t.with_feature(Halide::Target::VulkanInt64);
  return t;
}

// A Halide error as one line of text: its lines joined, and a word where Halide gave none (the
// Mullapudi2016 plugin throws some errors with an empty message from apply_autoscheduler).
std::string halide_error_text(const Halide::Error& e, const std::string& autoscheduler) {
  std::string text;
  for (const char* c = e.what(); *c; ++c) {
    if (*c == '\n' || *c == '\r') {
      if (!text.empty() && text.back() != ' ') text += ' ';
    } else {
      text += *c;
    }
  }
  while (!text.empty() && text.back() == ' ') text.pop_back();
  if (text.empty() || text == "Error:") {
    text += text.empty() ? "" : " ";
    text += autoscheduler.empty() ? "(Halide gave no message)"
                                  : "(Halide gave no message; the " + autoscheduler + " autoscheduler's twin)";
  }
  return text;
}

// The autoscheduler plugins ship beside libHalide.so in the wheel.
void load_autoscheduler(const std::string& name) {
  static std::mutex mu;
  static std::map<std::string, bool> loaded;
  std::lock_guard<std::mutex> lock(mu);
  if (loaded[name]) return;
  Dl_info info{};
  if (!dladdr(reinterpret_cast<void*>(&Halide::load_plugin), &info) || !info.dli_fname) {
    throw BackendError("jit: cannot locate libHalide.so to find the autoscheduler plugins");
  }
  std::string lower = name;
  for (auto& ch : lower) ch = static_cast<char>(std::tolower(ch));
  const auto path = std::filesystem::path(info.dli_fname).parent_path() / ("libautoschedule_" + lower + ".so");
  if (!std::filesystem::exists(path)) throw BackendError("jit: autoscheduler plugin missing: " + path.string());
  Halide::load_plugin(path.string());
  loaded[name] = true;
}

// Every Generator is built into a Pipeline here (create_callable_from_generator() would do neither of
// these): its autoscheduler applied for the twins (Halide 21's AbstractGenerator::
// compile_to_callable skips it), and the externs the generated CPU code may call given to the JIT
// (kvouter/prefetch.h; an AOT build links them).
Halide::Callable compile_generator(const Halide::Target& t, const std::string& gen,
                                   const Halide::GeneratorParamsMap& gp, const std::string& autoscheduler) {
  Halide::AutoschedulerParams asp;  // no name: none
  if (!autoscheduler.empty()) {
    load_autoscheduler(autoscheduler);
    asp = Halide::AutoschedulerParams(autoscheduler, autoscheduler_params(autoscheduler, t.has_gpu_feature()));
  }
  auto g = Halide::Internal::get_registered_generators().create(gen, Halide::GeneratorContext(t, asp));
  g->set_generatorparam_values(gp);
  Halide::Pipeline p = g->build_pipeline();
  if (!autoscheduler.empty()) p.apply_autoscheduler(t, asp);
  p.set_jit_externs({{"kvouter_prefetch_l2", Halide::JITExtern(&kvouter_prefetch_l2)}});
  std::vector<Halide::Argument> args;
  for (const auto& a : g->arginfos()) {
    if (a.dir != Halide::Internal::ArgInfoDirection::Input) continue;
    for (const Halide::Parameter& prm : g->input_parameter(a.name)) {
      args.emplace_back(prm.name(), prm.is_buffer() ? Halide::Argument::InputBuffer : Halide::Argument::InputScalar,
                        prm.type(), prm.dimensions(), prm.get_argument_estimates());
    }
  }
  return p.compile_to_callable(args, t);
}

// The device cache's writers (generators/kvouter_kv_write) compiled for a JIT Vulkan target, once
// per target: the JIT's kernels read buffers of the JIT's own Vulkan runtime, so the cache they
// read is written by kernels of that runtime too.
std::shared_ptr<const DeviceKit> jit_device_kit(const Halide::Target& target, const halide_device_interface_t* dev) {
  static std::mutex mu;
  static std::map<std::string, std::shared_ptr<const DeviceKit>> kits;
  std::lock_guard<std::mutex> lock(mu);
  auto& kit = kits[target.to_string()];
  if (!kit) {
    // Freed device allocations are returned, not kept for reuse: Halide 21's Vulkan allocator
    // handed a kept region's smaller buffer object to a new allocation (docs/vulkan.md limit 15).
    Halide::Internal::JITSharedRuntime::reuse_device_allocations(false);
    auto writer = [&target](int bits) -> KvWriteFn {
      // 16-bit elements need the target's 16-bit integers (as storage_target adds them).
      const Halide::Target t = bits == 16 ? target.with_feature(Halide::Target::VulkanInt16) : target;
      Halide::Callable w = Halide::create_callable_from_generator(t, "kvouter_kv_write", {{"bits", std::to_string(bits)}});
      return [w](halide_buffer_t* rows, halide_buffer_t* page, halide_buffer_t* slot, halide_buffer_t* pool) {
        return w(rows, page, slot, pool);
      };
    };
    Halide::Callable plan = Halide::create_callable_from_generator(target, "kvouter_decode_plan");
    DecodePlanFn decode_plan = [plan](halide_buffer_t* step, halide_buffer_t* tables, int32_t tq, int32_t hkv, int32_t topk,
                                      int32_t bs, int32_t ps, int32_t num_pages, halide_buffer_t* pages,
                                      halide_buffer_t* limit, halide_buffer_t* pidx) {
      return plan(step, tables, tq, hkv, topk, bs, ps, num_pages, pages, limit, pidx);
    };
    kit = std::make_shared<const DeviceKit>(DeviceKit{target.to_string(), dev, writer(32), writer(16), decode_plan});
  }
  return kit;
}

std::shared_ptr<const CompiledKernels> compile(const JitRequest& req) {
  const Stopwatch t0;
  Halide::Target target = to_target(req.target);
  const bool vulkan = target.has_feature(Halide::Target::Vulkan);  // to_target found the device
  if (vulkan) target = Halide::Target(storage_target(target.to_string(), req.spec.dtype));

  const GeneratorParams params = generator_params(req.schedule, req.knobs, req.spec);
  Halide::GeneratorParamsMap fwd, comb;
  for (const auto& [k, v] : params.forward) fwd[k] = v;
  for (const auto& [k, v] : params.combine) comb[k] = v;
  auto ck = std::make_shared<CompiledKernels>();
  try {
    Halide::Callable f = compile_generator(target, "kvouter_forward", fwd, req.autoscheduler);
    Halide::Callable c = compile_generator(target, "kvouter_combine", comb, req.autoscheduler);
    ck->kernels.forward = [f](halide_buffer_t* q, halide_buffer_t* k, halide_buffer_t* v, halide_buffer_t* head,
                              halide_buffer_t* pages, halide_buffer_t* query, halide_buffer_t* limit, float scale,
                              halide_buffer_t* part) { return f(q, k, v, head, pages, query, limit, scale, part); };
    ck->kernels.combine = [c](halide_buffer_t* part, halide_buffer_t* pidx, halide_buffer_t* out,
                              halide_buffer_t* lse) { return c(part, pidx, out, lse); };
  } catch (const Halide::Error& e) {
    throw BackendError("jit: compiling schedule '" + req.schedule + "' with knobs {" + join_knobs(req.knobs) +
                       "} for " + target.to_string() + " failed: " + halide_error_text(e, req.autoscheduler));
  }
  ck->kernels.origin = "jit";
  ck->kernels.name = req.key();
  if (vulkan) {
    ck->kernels.device = Halide::get_device_interface_for_device_api(Halide::DeviceAPI::Vulkan, target);
    try {
      ck->kernels.kit = jit_device_kit(target, ck->kernels.device);
    } catch (const Halide::Error& e) {
      throw BackendError("jit: compiling the device cache's writer and decode plan (kvouter_kv_write, kvouter_decode_plan) for " + target.to_string() +
                         " failed: " + halide_error_text(e, ""));
    }
  }
  ck->target = target.to_string();
  ck->compile_ms = t0.ms();
  return ck;
}

struct Cache {
  std::mutex mu;
  std::map<std::string, std::shared_future<std::shared_ptr<const CompiledKernels>>> entries;
};

Cache& cache() {
  static Cache c;
  return c;
}

class JitBackend final : public Backend {
 public:
  JitBackend(const BackendConfig& cfg, std::string autoscheduler, const std::string& device)
      : schedule_(cfg.schedule), autoscheduler_(std::move(autoscheduler)), knobs_(checked_knobs(cfg.params)),
        target_(resolve_target(cfg.target)) {
    const Halide::Target t = to_target(target_);
    if (t.has_gpu_feature() && !t.has_feature(Halide::Target::Vulkan)) {
      throw BackendError("--target " + target_ + ": the jit backend schedules Vulkan only (host-vulkan); the GPU shapes' kernels for host-cuda are generated ahead of time (--backend aot)");
    }
    const bool vulkan_target = t.has_feature(Halide::Target::Vulkan);
    if ((device == "vulkan") != vulkan_target) {
      throw BackendError("--schedule " + schedule_ + " is a " + device + " schedule, but --target " + target_ +
                         (vulkan_target ? " is a Vulkan target" : " has no GPU feature (use host-vulkan)"));
    }
  }
  std::string name() const override { return "jit"; }
  std::string schedule() const override { return schedule_; }
  std::string target() const override { return target_; }
  std::map<std::string, std::string> params() const override { return knobs_; }
  PlanOptions plan_options() const override {
    PlanOptions o{tile_edges_of(knobs_)};
    // Vulkan: batches whose arrays the step runner can hold (kvouter/device_cache.h).
    if (to_target(target_).has_feature(Halide::Target::Vulkan)) {
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
    Specialization spec = Specialization::of(plan);
    if (!autoscheduler_.empty()) spec = spec.with_extents(plan);
    JitRequest req{schedule_, autoscheduler_, knobs_, target_, spec};
    const Stopwatch t0;
    auto ck = jit_compile(req);
    // Cache hits cost microseconds; only a real compile is reported as compile time.
    const double waited = t0.ms();
    timing_.compile_ms = waited > 1.0 ? ck->compile_ms : 0.0;
    try {
      run_kernels(ck->kernels, plan, in, out, &timing_, kernel_timing_, &partials_);
    } catch (const Halide::Error& e) {
      throw BackendError("jit: running " + ck->kernels.description() + " failed: " + halide_error_text(e, ""));
    }
  }

 private:
  std::string schedule_, autoscheduler_;
  std::map<std::string, std::string> knobs_;
  std::string target_;
  HostArray<float> partials_;  // host kernels' partials, reused across calls (run_kernels)
};

}  // namespace

std::string JitRequest::key() const {
  return schedule + "|" + autoscheduler + "|" + join_knobs(knobs) + "|" + target + "|" + spec.str();
}

std::map<std::string, std::string> autoscheduler_params(const std::string& autoscheduler, bool gpu_target) {
  const std::string cores = std::to_string(std::max(1u, std::thread::hardware_concurrency()));
  const std::string device = gpu_target ? "gpu" : "cpu";
  std::istringstream table(detail::kAutoschedulerParamsTable);
  for (std::string line; std::getline(table, line);) {
    std::istringstream fields(line);
    std::string name, dev;
    if (!(fields >> name >> dev) || name[0] == '#' || name != autoscheduler || dev != device) continue;
    std::map<std::string, std::string> params;
    for (std::string kv; fields >> kv;) {
      const size_t eq = kv.find('=');
      const std::string value = kv.substr(eq + 1);
      params[kv.substr(0, eq)] = value == "CORES" ? cores : value;
    }
    return params;
  }
  throw BackendError("autoscheduler " + autoscheduler + " on the " + device +
                     ": no parameters in schedules/autoscheduler_params.txt");
}

std::string resolve_target(const std::string& target) { return to_target(target).to_string(); }

std::shared_ptr<const CompiledKernels> jit_compile(const JitRequest& req) {
  Cache& c = cache();
  const std::string key = req.key();
  std::promise<std::shared_ptr<const CompiledKernels>> promise;
  std::shared_future<std::shared_ptr<const CompiledKernels>> fut;
  bool owner = false;
  {
    std::lock_guard<std::mutex> lock(c.mu);
    auto it = c.entries.find(key);
    if (it == c.entries.end()) {
      fut = promise.get_future().share();
      c.entries.emplace(key, fut);
      owner = true;
    } else {
      fut = it->second;
    }
  }
  if (owner) {
    try {
      promise.set_value(compile(req));
    } catch (...) {
      {
        std::lock_guard<std::mutex> lock(c.mu);
        c.entries.erase(key);  // a failed compile is not cached: the next request retries
      }
      promise.set_exception(std::current_exception());
    }
  }
  return fut.get();
}

size_t jit_cache_size() {
  std::lock_guard<std::mutex> lock(cache().mu);
  return cache().entries.size();
}

std::unique_ptr<Backend> make_jit_backend(const BackendConfig& cfg, const std::string& autoscheduler,
                                          const std::string& device) {
  return std::make_unique<JitBackend>(cfg, autoscheduler, device);
}

}  // namespace kvouter::halide
