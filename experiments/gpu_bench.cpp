// kvouter_gpu_bench: SPEC §5's GPU shapes through the AOT Vulkan kernels, in one process, on the
// same inputs, each schedule checked against the CPU `direct` baseline and against the others.
// It links no compiler (libHalide) at all: built here, carried to the GPU machine with its Vulkan
// loader (experiments/results/gpu/README.md), it needs only libc there.
//
//   kvouter_gpu_bench [--shapes gpu-decode,gpu-prefill] [--schedules vulkan_slices,vulkan_onepass,...]
//                     [--targets host-vulkan,host-cuda] [--all-variants] [--reps 5] [--json FILE]
//                     [--warmup-ms 2000] [--case-dir DIR] [--no-check] [--variants-generic]
//                     [--dtypes float32,bfloat16,float16] [--loop 64] [--loop-pools reachable,full] [--loop-only]
//                     [--loop-staging copy,in_place,in_place_after_plan,in_place_read_back,overlapped<N>] [--loop-tables host,resident,resident-device,resident-host]
//                     [--loop-plan-tasks N,...] [--loop-plan-probe] [--loop-q-streaming]
//
// --dtypes runs each shape in each storage dtype (SPEC section 1; float32 first), each run with its
// ratio to the same schedule's float32 run (x_float32) and its K/V bytes at the storage size.
//
// Each schedule runs its default variant for the shape (the first generated); --all-variants runs
// every generated variant that fits (the knob points of generators/CMakeLists.txt).
//
// Timing: the measurement core (measure.h), as every tool times: a first call (driver compile,
// device set-up) apart, then one call that uploads the inputs once, runs the kernels untimed for
// --warmup-ms, then --reps times back to back (KernelTiming). Without the warm-up the H200's driver keeps Vulkan kernels at its idle SM clock
// (345 MHz instead of 1980; measured, docs/vulkan.md).
//
// --loop N runs, after each shape's kernels, the whole step N times on a device-resident cache
// (step_loop.h) with the first schedule on each target, its step 0's kernels then run untimed
// for --warmup-ms: decode with one appended token per
// sequence and a new selection per step; prefill (at most 3 steps) with its pages written once.
// --loop-pools: the cache holds the pages a selection reaches (reachable) and/or the shape's
// whole pool (full: in segments where one buffer cannot hold it).
// --loop-staging: the engine's q and out/lse in its own arrays, copied by the step (copy), and/or
// q written into the runner's staging and out/lse read where the runner reads them back
// (in_place: DeviceStepRunner::q_staging, read_outputs()); in_place_after_plan: the same with q's
// upload after the plan (DeviceStepRunner::set_q_ahead(false); on Vulkan it otherwise goes up
// while the host plans); in_place_read_back: on Vulkan out/lse read back from device memory
// instead of written by the combine into host memory (DeviceStepRunner::set_outputs_in_place(false));
// overlapped<N> (e.g. overlapped4): in_place through
// DeviceStepRunner::step_and_read in N parts (on CUDA their copies overlap their kernels), each
// step then run again phase by phase, whose kernels the step is measured against and whose
// outputs it must equal bit for bit.
// --loop-tables: the engine's block tables passed at each step (host), and/or written once into
// the runner (resident: DeviceStepRunner::write_block_tables; a decode step's tiles then built on
// the device or the host as the runner's default for the target says; resident-device and
// resident-host choose).
// --loop-plan-tasks: each loop again with the host plan in this many tasks on Halide's thread pool
// (DeviceStepRunner::set_plan_tasks: 1 the calling thread, 0 one per hardware thread; default:
// the runner's default for the target). --loop-plan-probe: before each step (outside it), the
// same inputs' host plan timed alone (DeviceStepRunner::host_plan). --loop-q-streaming: in the
// loops whose staging is not copy, q written into the staging with streaming stores
// (halide::host_copy_streaming) instead of memcpy (the JSON's q_write).
//
// Exit status 1 when any checked result differs from its reference (the JSON says which).
//
// --case-dir writes each shape's inputs (npy, as `kvouter run` reads them) and the first
// schedule's outputs there, for experiments/torch_compare.py to run PyTorch on the same data.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "kvouter/stats.h"
#include <set>
#include <sstream>
#include <thread>
#include <tuple>

#include "case_gen.h"
#include "cli_util.h"
#include "direct.h"
#include "kvouter/aot.h"
#include "kvouter/aot_kernels.h"
#include "kvouter/case_io.h"
#include "kvouter/cuda_probe.h"
#include "kvouter/errors.h"
#include "kvouter/plan.h"
#include "kvouter/spirv_stage.h"
#include "kvouter/vulkan_probe.h"
#include "measure.h"
#include "provenance.h"
#include "step_loop.h"

namespace kvouter::experiments {
namespace {

using json = nlohmann::json;

// N of a --loop-staging "overlapped<N>", or -1.
int overlap_parts_of(const std::string& staging) {
  const std::string prefix = "overlapped";
  if (staging.rfind(prefix, 0) != 0 || staging.size() == prefix.size() || staging.size() > prefix.size() + 3) return -1;
  int n = 0;
  for (char c : staging.substr(prefix.size())) {
    if (c < '0' || c > '9') return -1;
    n = n * 10 + (c - '0');
  }
  return n >= 1 ? n : -1;
}

constexpr double kMaxCheckedFlops = 2e11;

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string x; std::getline(ss, x, ',');) {
    if (!x.empty()) out.push_back(x);
  }
  return out;
}


json errors_json(const Outputs& got, const Outputs& ref) {
  const ErrorReport e = compare_outputs(got, ref);
  return {{"max_out_err", e.max_out_err}, {"max_lse_err", e.max_lse_err}, {"within_tolerance", e.ok()}};
}

int run(int argc, char** argv) {
  std::vector<std::string> shapes = {"gpu-decode", "gpu-prefill"}, schedules = {"vulkan_slices", "vulkan_onepass", "vulkan_tiled", "vulkan_fused", "vulkan_rows"};
  std::vector<std::string> targets = {"host-vulkan"}, dtypes = {"float32"};
  int reps = 5;
  double warmup_ms = 2000;
  bool check = true, all_variants = false, generic_variants = false;
  std::string json_path, case_dir;
  int loop = 0;
  bool loop_only = false;  // the step loops alone (no kernel runs, no CPU baseline of the case)
  std::vector<std::string> loop_pools = {"reachable"};
  std::vector<std::string> loop_staging = {"copy"};
  std::vector<std::string> loop_tables = {"host"};
  std::vector<std::string> loop_plan_tasks = {"default"};
  bool loop_plan_probe = false;
  bool loop_q_streaming = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) throw InputError(a, "a value", "nothing");
      return argv[++i];
    };
    if (a == "--help" || a == "-h") {
      std::printf(
          "usage: kvouter_gpu_bench [--shapes gpu-decode,gpu-prefill] [--schedules vulkan_slices,...]\n"
          "                         [--targets host-vulkan,host-cuda] [--dtypes float32,bfloat16,float16]\n"
          "                         [--all-variants] [--variants-generic] [--reps 5] [--warmup-ms 2000]\n"
          "                         [--json FILE] [--case-dir DIR] [--no-check]\n"
          "                         [--loop N] [--loop-pools reachable,full] [--loop-only]\n"
          "                         [--loop-staging copy,in_place,in_place_after_plan,in_place_read_back,overlapped<N>]\n"
          "                         [--loop-tables host,resident,resident-device,resident-host]\n"
          "                         [--loop-plan-tasks default,1,2,4,...] [--loop-plan-probe] [--loop-q-streaming]\n"
          "  the GPU shapes through the AOT kernels, checked against the CPU direct baseline and timed\n"
          "  by the measurement core; --loop N adds the whole device-resident step N times. Exit 1 when\n"
          "  a result differs from its reference; 2 on bad arguments (experiments/results/gpu/README.md)\n");
      return 0;
    }
    if (a == "--shapes") shapes = split(next());
    else if (a == "--schedules") schedules = split(next());
    else if (a == "--reps") reps = std::stoi(next());
    else if (a == "--warmup-ms") warmup_ms = std::stod(next());
    else if (a == "--json") json_path = next();
    else if (a == "--case-dir") case_dir = next();
    else if (a == "--no-check") check = false;
    else if (a == "--all-variants") all_variants = true;
    else if (a == "--variants-generic") generic_variants = true;
    else if (a == "--targets") targets = split(next());
    else if (a == "--dtypes") dtypes = split(next());
    else if (a == "--loop") loop = std::stoi(next());
    else if (a == "--loop-pools") loop_pools = split(next());
    else if (a == "--loop-only") loop_only = true;
    else if (a == "--loop-staging") loop_staging = split(next());
    else if (a == "--loop-tables") loop_tables = split(next());
    else if (a == "--loop-plan-tasks") loop_plan_tasks = split(next());
    else if (a == "--loop-plan-probe") loop_plan_probe = true;
    else if (a == "--loop-q-streaming") loop_q_streaming = true;
    else throw InputError("argument", "--shapes/--schedules/--targets/--dtypes/--all-variants/--variants-generic/--reps/--warmup-ms/--json/--case-dir/--no-check/--loop/--loop-pools/--loop-only/--loop-staging/--loop-tables/--loop-plan-tasks/--loop-plan-probe/--loop-q-streaming", a);
  }
  for (const auto& p : loop_pools) {
    if (p != "reachable" && p != "full") throw InputError("--loop-pools", "reachable and/or full", p);
  }
  if (loop_q_streaming && (loop <= 0 || std::all_of(loop_staging.begin(), loop_staging.end(), [](const std::string& m) { return m == "copy"; }))) {
    throw InputError("--loop-q-streaming", "with --loop N and an in-place --loop-staging (the engine writes q into the staging)",
                     loop <= 0 ? "no --loop" : "--loop-staging copy");
  }
  for (const auto& p : loop_staging) {
    if (p != "copy" && p != "in_place" && p != "in_place_after_plan" && p != "in_place_read_back" && overlap_parts_of(p) <= 0) {
      throw InputError("--loop-staging", "copy, in_place, in_place_after_plan, in_place_read_back and/or overlapped<N> (N >= 1)", p);
    }
  }
  std::vector<int> plan_tasks;  // -1: the runner's default
  if (loop_plan_tasks.empty()) throw InputError("--loop-plan-tasks", "default and/or task counts", "an empty list");
  for (const auto& p : loop_plan_tasks) {
    char* end = nullptr;
    const long n = p == "default" ? -1 : std::strtol(p.c_str(), &end, 10);
    if (p != "default" && (p.empty() || *end != '\0' || n < 0 || n > 4096)) {
      throw InputError("--loop-plan-tasks", "default and/or task counts (0: one per hardware thread, 1: the calling thread)", p);
    }
    plan_tasks.push_back(static_cast<int>(n));
  }
  for (const auto& p : loop_tables) {
    if (p != "host" && p != "resident" && p != "resident-device" && p != "resident-host") {
      throw InputError("--loop-tables", "host, resident, resident-device and/or resident-host", p);
    }
  }
  std::vector<std::pair<std::string, Dtype>> shape_dtypes;  // (shape, dtype), float32 first
  std::stable_sort(dtypes.begin(), dtypes.end(), [](const std::string& a, const std::string& b) {
    return (a == "float32") > (b == "float32");
  });
  for (const auto& shape : shapes) {
    for (const auto& d : dtypes) {
      Dtype t;
      if (!parse_dtype(d, &t)) throw InputError("--dtypes", "float32, float16 or bfloat16", d);
      shape_dtypes.emplace_back(shape, t);
    }
  }
  std::map<std::string, double> float32_ms;  // shape/key -> the float32 run's kernel ms
  halide::register_generated_aot_kernels();
  std::string device_name;
  for (const auto& target : targets) {
    if (is_vulkan_target(target)) {
      std::string why;
      const auto devices = vulkan_devices(&why);
      if (devices.empty()) throw BackendError("vulkan: " + why);
      device_name = devices[0].name;
    } else if (is_cuda_target(target)) {
      if (device_name.empty()) device_name = cuda_device_name();
    } else {
      throw InputError("--targets", "host-vulkan or host-cuda", target);
    }
  }
  const GpuDatasheet* sheet = gpu_datasheet(device_name);
  if (!sheet) std::fprintf(stderr, "no datasheet figures for %s: no ratios to its peak\n", device_name.c_str());
  const auto pct_text = [](const json& v) {
    if (v.is_null()) return std::string("n/a");
    char buf[32];
    std::snprintf(buf, sizeof(buf), "%.1f", v.get<double>());
    return std::string(buf);
  };
  json doc = {{"tool", "kvouter_gpu_bench"},
              {"git_rev", git_revision()},
              {"halide", halide_version() + " (AOT)"},
              {"machine", machine_fingerprint()},
              {"timestamp", now_iso()},
              {"device", device_name},
              {"peak_fp32_tflops", sheet ? json(sheet->fp32_tflops) : json(nullptr)},
              {"hbm_tbps", sheet ? json(sheet->hbm_tbps) : json(nullptr)},
              {"reps", reps},
              {"warmup_ms", warmup_ms},
              {"spirv_stage", spirv::stage_enabled() ? "on" : "off"},
              {"vk_robust_access", spirv::robust_access() ? "on" : "off"},
              {"results", json::array()}};
  for (const auto& [shape_name, dtype] : shape_dtypes) {
    const std::string& shape = shape_name;
    const std::string label = dtype == Dtype::kFloat32 ? shape : shape + "@" + dtype_name(dtype);
    const Stopwatch t0;
    // Only the pages a selection reaches (CaseSpec::reachable_pages_only): gpu-decode's full pool
    // (2 x 17 GB) exceeds one Vulkan storage buffer (4 GiB on the H200) and Halide 21's int32
    // indexing, its selected pages (2 x 1.9 GB) do not; and filling the full pool cost about a
    // minute of device time per run.
    CaseSpec spec = named_shape(shape);
    spec.reachable_pages_only = true;
    spec.dtype = dtype;
    const Inputs in = make_case(spec);
    const int64_t pool_pages = in.block_tables.numel();  // one physical page per logical page
    const double gen_s = t0.ms() / 1000.0;
    std::fprintf(stderr, "%s: generated in %.1f s; K/V pool %lld -> %lld pages\n", label.c_str(), gen_s,
                 static_cast<long long>(pool_pages), static_cast<long long>(in.k_pages.shape[0]));
    if (!case_dir.empty()) save_case(case_dir + "/" + label, in);
    json shape_doc = {{"shape", shape}, {"dtype", dtype_name(dtype)}, {"pool_pages", pool_pages},
                      {"reachable_pages", in.k_pages.shape[0]}};
    // After each run: a time limit keeps what finished.
    auto write_partial = [&] {
      if (json_path.empty()) return;
      const spirv::StageStats st = spirv::stage_stats();
      doc["spirv_stage_stats"] = {{"modules", st.modules}, {"rewritten", st.rewritten},
                                  {"fences_kept", st.fences_kept}, {"errors", st.errors},
                                  {"non_writable", st.non_writable}, {"barriers_removed", st.barriers_removed},
                                  {"barriers_narrowed", st.barriers_narrowed},
                                  {"devices_without_robust_access", st.devices_without_robust_access},
                                  {"devices_created", st.devices_created},
                                  {"devices_preserving_denorms", st.devices_preserving_denorms},
                                  {"denorm_preserve", st.denorm_preserve}};
      json partial = doc;
      partial["results"].push_back(shape_doc);
      std::ofstream(json_path) << partial.dump(2) << "\n";
    };
    Outputs baseline;
    bool have_baseline = false;
    auto direct = reference::make_direct_backend({"direct", "", {}, "host"});
    const Plan direct_plan = make_plan(in, direct->plan_options());
    shape_doc["flops"] = direct_plan.flops();
    // The CPU baseline checks every schedule where it is affordable (gpu-decode: 0.2 s;
    // gpu-prefill took 39 s on the GPU machine's 16 cores); otherwise the schedules are checked
    // against each other here and against PyTorch by torch_compare.py.
    if (check && !loop_only && direct_plan.flops() <= kMaxCheckedFlops) {
      const Plan& plan = direct_plan;
      MeasureOptions once;  // timed as every other run: the measurement core, allocations outside
      once.repeats = 1;
      once.warm_call = false;
      Measurement dm = measure(*direct, plan, in, once);
      const double ms = dm.median();
      baseline = std::move(dm.out);
      have_baseline = true;
      shape_doc["direct_cpu_ms"] = ms;
      std::fprintf(stderr, "%s: direct (CPU, %u threads) %.1f ms\n", label.c_str(), std::thread::hardware_concurrency(), ms);
    }
    // The first GPU run's outputs, which every later run is compared with (only the first:
    // gpu-prefill's outputs are 1 GB each).
    std::string first_key;
    Outputs first_out;
    // (target, schedule, variant or "" = its default, key): the key is the schedule (and target,
    // where not Vulkan) for its default variant, the variant's name for the other knob points.
    std::vector<std::tuple<std::string, std::string, std::string, std::string>> runs;
    for (const auto& target : targets) {
      for (const auto& schedule : schedules) {
        std::vector<std::string> fit;
        if (all_variants) {
          // A schedule with no kernel for this target stays one run, which records the error.
          try {
            auto be = halide::make_aot_backend({"aot", schedule, {}, target});
            fit = halide::aot_fitting(schedule, target, make_plan(in, be->plan_options()));
          } catch (const BackendError&) {
          }
          // Not the generic variants (no shape specialised): on the GPU shapes they are the
          // any-shape fallback, 120 ms on gpu-decode on the H200 (results/gpu/2026-12-01) and
          // minutes on gpu-prefill; --variants-generic measures them too.
          if (!generic_variants) {
            fit.erase(std::remove_if(fit.begin(), fit.end(),
                                     halide::aot_variant_is_generic),
                      fit.end());
          }
        }
        if (fit.empty()) fit.push_back("");
        const std::string name = target == "host-vulkan" ? schedule : schedule + "@" + target;
        for (size_t i = 0; i < fit.size(); ++i) runs.emplace_back(target, schedule, fit[i], i == 0 ? name : fit[i]);
      }
    }
    if (loop_only) runs.clear();
    for (const auto& [target, schedule, variant, key] : runs) {
      json r = {{"schedule", schedule}, {"backend", "aot"}, {"target", target}};
      try {
        std::map<std::string, std::string> params;
        if (!variant.empty()) params["variant"] = variant;
        auto be = halide::make_aot_backend({"aot", schedule, params, target});
        const Plan plan = make_plan(in, be->plan_options());
        // The measurement core (measure.h): a first call (driver compile, device set-up) apart,
        // then one call that uploads once, warms up, and repeats the kernels.
        MeasureOptions mo;
        mo.repeats = reps;
        mo.warmup_ms = warmup_ms;
        Measurement t = measure(*be, plan, in, mo);
        const double ms = t.median(), flops = plan.flops(), kv_bytes = plan.kv_unit_bytes();
        const auto bp = be->params();
        r.update(measurement_record(t, plan));
        r.update({{"variant", bp.count("variant") ? bp.at("variant") : std::string()},
                  {"query_batches", static_cast<int64_t>(plan.tiles.batch_tile_begin.size()) - 1},
                  {"tflops", flops / ms / 1e9},
                  {"pct_fp32_peak", pct_of_datasheet(sheet, flops / ms / 1e9, &GpuDatasheet::fp32_tflops)},
                  {"kv_tbps", kv_bytes / ms / 1e9},
                  {"pct_hbm", pct_of_datasheet(sheet, kv_bytes / ms / 1e9, &GpuDatasheet::hbm_tbps)}});
        if (dtype == Dtype::kFloat32) {
          float32_ms[shape + "/" + key] = ms;
        } else if (auto f = float32_ms.find(shape + "/" + key); f != float32_ms.end()) {
          r["x_float32"] = f->second / ms;
        }
        if (have_baseline) r["vs_direct"] = errors_json(t.out, baseline);
        if (!first_key.empty()) r["vs_" + first_key] = errors_json(t.out, first_out);
        // Against direct where the shape has that baseline, else against the first run (whose
        // outputs the other runs and torch_compare.py are checked against).
        const std::string check =
            have_baseline ? (r["vs_direct"]["within_tolerance"].get<bool>() ? "matches direct" : "DIFFERS from direct")
            : !first_key.empty()
                ? (r["vs_" + first_key]["within_tolerance"].get<bool>() ? "matches " : "DIFFERS from ") + first_key
                : std::string("the reference of the runs after it");
        std::fprintf(stderr, "%s %s: kernels %.2f ms (fwd %.2f, comb %.2f) = %.2f TFLOP/s = %s%% FP32 peak; K/V %.2f TB/s = %s%% HBM; %s\n",
                     label.c_str(), key.c_str(), ms, median(t.forward_ms), median(t.combine_ms), flops / ms / 1e9,
                     pct_text(r["pct_fp32_peak"]).c_str(), kv_bytes / ms / 1e9, pct_text(r["pct_hbm"]).c_str(),
                     check.c_str());
        if (first_key.empty()) {
          if (!case_dir.empty()) save_outputs(case_dir + "/" + label + "/kvouter_" + schedule, t.out);
          first_key = key;
          first_out = std::move(t.out);
        }
      } catch (const std::exception& e) {
        r["error"] = e.what();
        std::fprintf(stderr, "%s %s: ERROR %s\n", label.c_str(), key.c_str(), e.what());
      }
      shape_doc["runs"].push_back(r);
      write_partial();
    }
    const bool decode = in.q.shape[0] == in.cu_seqlens_q.numel() - 1;
    for (const std::string& target : loop > 0 ? targets : std::vector<std::string>{}) {
      for (const std::string& pool : loop_pools) {
        for (const std::string& staging : loop_staging) {
          for (const std::string& tables : loop_tables) {
            for (const int tasks : plan_tasks) {
              experiments::StepLoopOptions lo{target, schedules.front(), decode ? loop : std::min(loop, 3), pool == "full"};
              lo.in_place = staging != "copy";
              lo.q_ahead = staging != "in_place_after_plan";
              lo.outputs_in_place = staging != "in_place_read_back";
              lo.warmup_ms = warmup_ms;
              lo.overlap_parts = std::max(overlap_parts_of(staging), 0);
              lo.resident_tables = tables != "host";
              lo.decode_plan_on_device = tables == "resident-device" ? 1 : tables == "resident-host" ? 0 : -1;
              lo.plan_tasks = tasks;
              lo.plan_probe = loop_plan_probe;
              lo.q_streaming = loop_q_streaming && lo.in_place;  // (a copy loop writes no q into the staging)
              try {
                json l = run_step_loop(in, lo, decode && check, decode || first_key.empty() ? nullptr : &first_out);
                l["pool"] = pool;
                shape_doc["loops"].push_back(l);
              } catch (const std::exception& e) {
                shape_doc["loops"].push_back({{"target", target}, {"pool", pool}, {"staging", staging}, {"tables", tables},
                                              {"plan_tasks", tasks}, {"plan_probe", loop_plan_probe},
                                              {"q_streaming", loop_q_streaming}, {"error", e.what()}});
                std::fprintf(stderr, "%s loop %s %s %s %s plan tasks %d%s: ERROR %s\n", label.c_str(), target.c_str(),
                             pool.c_str(), staging.c_str(), tables.c_str(), tasks, loop_plan_probe ? " (probe)" : "", e.what());
              }
              write_partial();
            }
          }
        }
      }
    }
    doc["results"].push_back(shape_doc);
  }
  std::printf("%s\n", doc.dump(2).c_str());
  {
    const spirv::StageStats st = spirv::stage_stats();
    std::fprintf(stderr, "SPIR-V stage: %lld modules, %lld rewritten, %lld with DenormPreserve 32; %lld devices created, %lld preserving denormals\n",
                 static_cast<long long>(st.modules), static_cast<long long>(st.rewritten),
                 static_cast<long long>(st.denorm_preserve), static_cast<long long>(st.devices_created),
                 static_cast<long long>(st.devices_preserving_denorms));
  }
  // A result that differs from its reference fails the run (exit 1), after everything is written.
  int differs = 0;
  for (const auto& sd : doc["results"]) {
    for (const auto& r : sd.value("runs", json::array())) {
      for (const auto& [k, v] : r.items()) {
        if (k.rfind("vs_", 0) == 0 && v.is_object() && !v.value("within_tolerance", true)) ++differs;
      }
    }
    for (const auto& l : sd.value("loops", json::array())) {
      for (const auto& c : l.value("checks", json::array())) differs += !c.value("within_tolerance", true);
      differs += !l.value("overlapped_equals_sequential", true);
    }
  }
  if (differs > 0) std::fprintf(stderr, "kvouter_gpu_bench: %d result(s) DIFFER from their reference\n", differs);
  return differs > 0 ? 1 : 0;
}

}  // namespace
}  // namespace kvouter::experiments

int main(int argc, char** argv) {
  try {
    return kvouter::experiments::run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kvouter_gpu_bench: %s\n", e.what());
    return 2;
  }
}
