// The one measurement core: how every tool checks and times one backend on one planned case, and
// the one record it writes. `kvouter run`, `compare` and `demo`, `kvouter_bench`,
// `kvouter_gpu_bench`, the sweeps and the tuner all time through measure() and quote its median;
// the JSON tools write measurement_record()'s fields. It links no compiler (libHalide), so that the
// GPU benchmark, carried to the GPU machine, uses it too.
//
// The timer is the backend's own (RunTiming): forward + combine, each synchronised with its device;
// compile time, uploads and read-backs are outside it and reported apart. The plan is made outside
// it. Repetitions run inside one backend call where the backend can repeat its kernels on the
// uploaded inputs (the Halide backends: KernelTiming), else as one call each (direct, dense), which
// allocate their outputs before their clock starts.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli_util.h"
#include "kvouter/backend.h"

namespace kvouter::experiments {

struct MeasureOptions {
  int repeats = 5;            // timed repetitions, at least
  double min_total_ms = 0;    // more repetitions (up to max_repeats) until they add up to this,
  int max_repeats = 200;      //   estimated from the first call's kernel time
  double warmup_ms = 0;       // the kernels run untimed this long before the first timed repetition
  // > 0: after the first timed repetition, stop when it is slower than this (the tuner's cut-off).
  double stop_after_first_ms = 0;
  // The first call runs untimed (JIT compile, driver set-up, caches), as a warm-up. Off: the first
  // call is timed (compile time apart), as `kvouter run --repeat 1` runs a case once.
  bool warm_call = true;
  // Checked against this before timing (the warm call's outputs), or after (without a warm call).
  const Outputs* reference = nullptr;
};

struct Measurement {
  ErrorReport err;               // against MeasureOptions::reference
  bool checked = false;          // whether a reference was given
  std::vector<double> ms;        // forward + combine of each timed repetition, in the order run
  std::vector<double> forward_ms, combine_ms;
  double compile_ms = 0;         // JIT compile (first call)
  double first_call_ms = 0;      // the warm call's kernel time (0 without one)
  double transfer_ms = 0;        // host <-> device copies of the last call (GPU targets)
  Outputs out;                   // the last repetition's outputs

  bool ok() const { return err.ok(); }
  double median() const;
  double quantile(double q) const;
  // Appends another measurement's repetitions (alternating rounds of two configurations).
  void append(const Measurement& other);
};

Measurement measure(Backend& backend, const Plan& plan, const InputsView& in, const MeasureOptions& opt = {});

// The one record schema of a measurement:
//   time_ms {median, p10, p90, min, max, n, all}, forward_ms, combine_ms (medians), compile_ms,
//   first_call_ms, transfer_ms, plan_ms, T, flops, gflops, kv_bytes, kv_gbps;
//   with a reference: ok, max_out_err, max_lse_err.
nlohmann::json measurement_record(const Measurement& m, const Plan& plan);

// The record's median, from this schema or the earlier ones (`median_ms` of the tuner's logs,
// `kernel_ms` of the GPU benchmark's files); NaN when the record has no time.
double record_median_ms(const nlohmann::json& rec);

// A GPU's datasheet figures, the ratios' denominators: NVIDIA's H200 and H100 datasheets (the
// issues' targets are ratios to the H200 SXM's), matched in order on the device's name as its
// driver gives it ("NVIDIA H200", "NVIDIA H100 80GB HBM3", ...). nullptr for another device,
// whose records then carry no ratios rather than another device's.
struct GpuDatasheet {
  const char* name_contains;
  double fp32_tflops, hbm_tbps;
};
const GpuDatasheet* gpu_datasheet(const std::string& device_name);

// 100 * rate / the datasheet's figure, or null without a datasheet.
nlohmann::json pct_of_datasheet(const GpuDatasheet* sheet, double rate, double GpuDatasheet::*figure);

}  // namespace kvouter::experiments
