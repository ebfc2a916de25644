// Google Benchmark over SPEC §5's CPU shapes, every registered backend and schedule, in one run;
// and the plan of one step (plan/<shape>, plan_checked_tables/<shape>: KVOUTER_BENCH_PLAN_SHAPES,
// by default decode and gpu-decode), on the calling thread; plan_heads_at_once/<shape> is
// plan_checked_tables with the KV heads on Halide's thread pool; plan_decode_layout/<shape> is
// plan_checked_tables in the fixed decode layout, and plan_decode_layout_at_once its query ranges on
// Halide's thread pool (as the device step plans a decode step); plan_on_device/<shape> is the host's
// part of a decode step whose tiles the device builds from its resident block tables.
// Each (backend, shape) is checked against the float64 oracle, then timed, by the measurement core
// (measure.h; a wrong result skips the row with an error). Names: fwd+combine/<backend>/<schedule>/<shape>.
// Counters: GFLOP/s (kIsRate), % of the measured FP32 peak, ratio to the direct baseline measured
// in the same process, and the forward / combine split. KVOUTER_BENCH_DTYPES adds each shape in
// 16-bit storage (<shape>@float16, <shape>@bfloat16), with its ratio to float32 (x_float32).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>

#include "../reference/dense_eigen.h"
#include "case_gen.h"
#include "cli_util.h"
#include "kvouter/errors.h"
#include "kvouter/jit.h"
#include "kvouter/plan.h"
#include "kvouter/pool_memory.h"
#include "kvouter/stats.h"
#include "measure.h"
#include "provenance.h"
#include "registry.h"
#include "roofline.h"
#include "schedule_registry.h"

namespace kx = kvouter::experiments;
using namespace kvouter;

namespace {

// Every backend reads `view`, a view of `in`: its K and V arrays lie, as an engine's pool does,
// on 2 MiB pages where the kernel gives them (Tensor's large arrays, kvouter/tensor.h; the
// huge_page_pct counter says how much of them did).
struct ShapeData {
  Inputs in;
  Outputs ref;
  InputsView view;
};

// A shape key is a SPEC shape, or "<shape>@<dtype>" for the same shape stored in a 16-bit dtype.
std::pair<std::string, Dtype> parse_shape_key(const std::string& key) {
  const auto at = key.find('@');
  Dtype t = Dtype::kFloat32;
  if (at != std::string::npos && !parse_dtype(key.substr(at + 1), &t)) {
    throw InputError("KVOUTER_BENCH_DTYPES", "float32, float16 or bfloat16", key.substr(at + 1));
  }
  return {key.substr(0, at), t};
}

// One shape's inputs at a time (the decode pool is 4.3 GB in float32): a new key frees the last.
// The oracle reads the float values; for a 16-bit key the K/V values are then dropped, and the
// backends read the bits.
ShapeData& shape_data(const std::string& key) {
  static std::map<std::string, std::unique_ptr<ShapeData>> cache;
  if (!cache.count(key)) cache.clear();
  auto& slot = cache[key];
  if (!slot) {
    const auto [shape, dtype] = parse_shape_key(key);
    kx::CaseSpec spec = kx::named_shape(shape);
    spec.dtype = dtype;
    slot = std::make_unique<ShapeData>();
    slot->in = kx::make_case(spec);
    Inputs values = slot->in;
    values.store_as(Dtype::kFloat32);
    slot->ref = reference::dense_attention<double>(values, validate(values));
    if (dtype != Dtype::kFloat32) {
      slot->in.k_pages = Tensor<float>();
      slot->in.v_pages = Tensor<float>();
    }
    slot->view = slot->in;
  }
  return *slot;
}

// The plan benchmarks' inputs: the shape's case with only the pages its selections reach (the plan
// never reads K/V, and its cost does not depend on the pool; the table keeps its full width).
const Inputs& plan_inputs(const std::string& name) {
  static std::map<std::string, std::unique_ptr<Inputs>> cache;
  auto& slot = cache[name];
  if (!slot) {
    kx::CaseSpec spec = kx::named_shape(name);
    spec.reachable_pages_only = true;
    slot = std::make_unique<Inputs>(kx::make_case(spec));
  }
  return *slot;
}

// One step's plan on one core, by a Planner reused across steps (as an engine runs it): with every
// input validated, and with the block tables trusted (checked where they were written).
// cold: before each plan (untimed), 64 MiB are written and read, as a step's staging copies and
// the engine's own work evict the plan's inputs from the caches between two plans.
// on_device: the host's part of a decode step whose tiles the device builds (Planner::plan_on_device,
// the step runner's resident block tables).
void run_plan(benchmark::State& state, std::string shape, bool checked_tables, bool parallel_heads, bool cold,
              bool decode_layout, bool on_device) {
  const Inputs& in = plan_inputs(shape);
  PlanOptions opt;
  opt.parallel_heads = parallel_heads;
  opt.decode_layout = decode_layout;
  Planner planner(opt);
  planner.plan(in);  // the arrays grow once
  std::vector<uint64_t> evict(cold ? (size_t{64} << 20) / 8 : 0);
  uint64_t sink = 0;
  for (auto _ : state) {
    if (cold) {
      state.PauseTiming();
      for (size_t i = 0; i < evict.size(); i += 8) sink += evict[i] += i;
      state.ResumeTiming();
    }
    const Plan& plan = on_device        ? planner.plan_on_device(in)
                       : checked_tables ? planner.plan_checked_tables(in)
                                        : planner.plan(in);
    benchmark::DoNotOptimize(plan.tiles.num_tiles);
  }
  benchmark::DoNotOptimize(sink);
  if (on_device) planner.plan_checked_tables(in);  // the counters' edges and tiles
  const Plan& plan = planner.current();
  state.counters["edges"] = static_cast<double>(plan.edges);
  state.counters["tiles"] = static_cast<double>(plan.tiles.num_tiles);
  state.counters["ns_per_edge"] = benchmark::Counter(static_cast<double>(plan.edges),
                                                     benchmark::Counter::kIsIterationInvariantRate |
                                                         benchmark::Counter::kInvert);
}

const kx::Roofline& roofline() {
  static kx::Roofline r = kx::measure_roofline();
  return r;
}

std::map<std::string, double>& direct_seconds() {
  static std::map<std::string, double> m;
  return m;
}

// Seconds of each (backend, schedule, shape) in float32, for the 16-bit rows' x_float32.
std::map<std::string, double>& float32_seconds() {
  static std::map<std::string, double> m;
  return m;
}

void run_case(benchmark::State& state, BackendConfig cfg, std::string shape) {
  ShapeData& data = shape_data(shape);
  std::unique_ptr<Backend> backend;
  try {
    backend = BackendRegistry::instance().make(cfg);
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
    return;
  }
  const Plan plan = make_plan(data.view, backend->plan_options());
  // The measurement core (experiments/measure.h), as `kvouter run`, the sweeps and the tuner time:
  // checked against the oracle first, then at least 5 repetitions and 1.5 s of them. One benchmark
  // iteration reports their median.
  kx::MeasureOptions mo;
  mo.repeats = 5;
  mo.min_total_ms = 1500;
  mo.reference = &data.ref;
  kx::Measurement m;
  try {
    m = kx::measure(*backend, plan, data.view, mo);
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
    return;
  }
  if (!m.ok()) {
    state.SkipWithError(("wrong result: max|err| " + std::to_string(m.err.max_out_err)).c_str());
    return;
  }
  const double secs = m.median() / 1e3;
  // What an engine pays per call: run_into's wall time, one kernel repetition, into outputs it
  // keeps (the plan made before, as the engine's plan() is; the host backends' work is all here).
  std::vector<double> call_ms;
  if (cfg.backend != "direct" && cfg.backend != "dense") {
    Outputs outs = outputs_for(plan.problem);  // (measure() left the backend at one repetition)
    for (int i = 0; i < 7; ++i) {
      const Stopwatch t;
      backend->run_into(plan, data.view, outs);
      call_ms.push_back(t.ms());
    }
  }
  for (auto _ : state) state.SetIterationTime(secs);
  state.counters["n"] = static_cast<double>(m.ms.size());
  state.counters["p10_ms"] = m.quantile(0.1);
  state.counters["p90_ms"] = m.quantile(0.9);
  state.counters["GFLOP/s"] = plan.flops() / secs / 1e9;
  state.counters["pct_peak"] = 100.0 * plan.flops() / secs / 1e9 / roofline().fma_gflops;
  state.counters["fwd_ms"] = median(m.forward_ms);
  state.counters["combine_ms"] = median(m.combine_ms);
  state.counters["plan_ms"] = plan.plan_ms;
  state.counters["compile_ms"] = m.compile_ms;
  state.counters["kv_GB/s"] = plan.kv_unit_bytes() / secs / 1e9;
  state.counters["pct_roofline"] = 100.0 * kx::roofline_bound_ms(plan, data.in, roofline()) / 1e3 / secs;
  // The paged bound: the K/V bytes at the read bandwidth of chunks the size of one page's slice
  // (page_size x D x storage bytes) at random places, measured once per chunk size.
  const Problem& pb = plan.problem;
  const size_t chunk = static_cast<size_t>(pb.page_size * pb.D * dtype_bytes(pb.dtype));
  static std::map<size_t, double> paged_gbps;
  if (!paged_gbps.count(chunk)) paged_gbps[chunk] = kx::paged_read_gbps(chunk);
  state.counters["paged_read_GB/s"] = paged_gbps[chunk];
  state.counters["pct_paged_bound"] = 100.0 * plan.kv_unit_bytes() / (paged_gbps[chunk] * 1e9) / secs;
  state.counters["max_err"] = m.err.max_out_err;
  if (!call_ms.empty()) {
    state.counters["call_ms"] = median(call_ms);
    state.counters["call_over_kernels"] = median(call_ms) / m.median();
  }
  // The share of K and V on huge pages (the case's arrays of 2 MiB or more, kvouter/tensor.h).
  double kv_bytes = 0, kv_huge = 0;
  for (const StorageView* sv : {&data.view.k_pages, &data.view.v_pages}) {
    const size_t bytes = static_cast<size_t>(sv->numel() * sv->element_bytes());
    kv_bytes += static_cast<double>(bytes);
    kv_huge += static_cast<double>(huge_bytes_of(sv->data, bytes));
  }
  if (kv_bytes > 0) state.counters["huge_page_pct"] = 100.0 * kv_huge / kv_bytes;
  if (cfg.backend == "direct") direct_seconds()[shape] = secs;
  const auto it = direct_seconds().find(shape);
  if (it != direct_seconds().end()) state.counters["x_direct"] = it->second / secs;
  const auto [base_shape, dtype] = parse_shape_key(shape);
  const std::string row = cfg.backend + "/" + cfg.schedule + "/" + base_shape;
  if (dtype == Dtype::kFloat32) {
    float32_seconds()[row] = secs;
  } else if (const auto f = float32_seconds().find(row); f != float32_seconds().end()) {
    state.counters["x_float32"] = f->second / secs;
  }
}

// A comma-separated list from the environment (an empty value: none), else the defaults.
std::vector<std::string> env_list(const char* name, std::vector<std::string> defaults) {
  const char* v = std::getenv(name);
  if (!v) return defaults;
  std::vector<std::string> out;
  const std::string all = v;
  for (size_t pos = 0; pos < all.size();) {
    const size_t next = std::min(all.find(',', pos), all.size());
    out.push_back(all.substr(pos, next - pos));
    pos = next + 1;
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  kx::register_all_backends();
  const std::vector<std::string> base_shapes = env_list("KVOUTER_BENCH_SHAPES", {"tiny", "prefill", "decode"});
  // Storage dtypes: float32 first, so that each 16-bit row has its ratio to float32 (x_float32).
  const std::vector<std::string> dtypes = env_list("KVOUTER_BENCH_DTYPES", {"float32"});
  std::vector<std::string> shapes;
  for (const auto& shape : base_shapes) {
    for (const auto& dtype : dtypes) shapes.push_back(dtype == "float32" ? shape : shape + "@" + dtype);
  }
  for (const auto& key : shapes) parse_shape_key(key);  // an unknown dtype fails here, with its name
  // How to reproduce every row: revision, Halide version, target, and the command.
  benchmark::AddCustomContext("git_rev", kx::git_revision());
  benchmark::AddCustomContext("halide_version", kx::halide_version());
  benchmark::AddCustomContext("machine", kx::machine_fingerprint());
  benchmark::AddCustomContext("host_target", halide::resolve_target("host"));
  benchmark::AddCustomContext("repro", "make build && build/bin/kvouter_bench --benchmark_out=FILE "
                                       "--benchmark_out_format=json (KVOUTER_BENCH_SHAPES=tiny,prefill,decode, "
                                       "KVOUTER_BENCH_DTYPES=float32[,float16,bfloat16], "
                                       "KVOUTER_BENCH_PLAN_SHAPES=decode,gpu-decode)");
  benchmark::AddCustomContext("fp32_peak_gflops", std::to_string(roofline().fma_gflops));
  benchmark::AddCustomContext("read_gbps", std::to_string(roofline().read_gbps));
  const std::vector<std::string> plan_shapes = env_list("KVOUTER_BENCH_PLAN_SHAPES", {"decode", "gpu-decode"});
  for (const auto& shape : plan_shapes) {
    for (int mode : {0, 1, 2, 3, 4, 5, 6, 7}) {
      const char* name = mode == 0   ? "plan/"
                         : mode == 1 ? "plan_checked_tables/"
                         : mode == 2 ? "plan_heads_at_once/"
                         : mode == 3 ? "plan_checked_tables_cold/"
                         : mode == 4 ? "plan_decode_layout/"
                         : mode == 5 ? "plan_decode_layout_cold/"
                         : mode == 6 ? "plan_decode_layout_at_once/"
                                     : "plan_on_device/";
      benchmark::RegisterBenchmark((name + shape).c_str(), run_plan, shape, mode > 0, mode == 2 || mode == 6, mode == 3 || mode == 5,
                                   mode >= 4, mode == 7)
          ->Unit(benchmark::kMicrosecond)
          ->MinTime(0.2)
          ->Repetitions(5)
          ->ReportAggregatesOnly(true);
    }
  }
  for (const auto& shape : shapes) {
    // direct first, so every later row of the shape has its ratio to the baseline.
    std::vector<const BackendInfo*> order;
    for (const auto& b : BackendRegistry::instance().all()) {
      if (b.name == "direct") order.insert(order.begin(), &b);
      else order.push_back(&b);
    }
    for (const BackendInfo* b : order) {
      for (const auto& sched : b->schedules()) {
        // The host's rows only: a GPU schedule (its own benchmark is kvouter_gpu_bench) would
        // only record its refusal of the host target.
        const pipeline::ScheduleInfo* info = pipeline::find_schedule(sched);
        if (info && info->device != "cpu") continue;
        BackendConfig cfg{b->name, sched, {}, ""};
        benchmark::RegisterBenchmark(("fwd+combine/" + b->name + "/" + sched + "/" + shape).c_str(),
                                     run_case, cfg, shape)
            ->UseManualTime()
            ->Unit(benchmark::kMillisecond)
            ->Iterations(1);
      }
    }
  }
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
