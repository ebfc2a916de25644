// Check, then time: one backend on one planned case, against a reference, in one process
// (never time without checking). Shared by the tuner, the sweeps and the benchmarks' reports.
#pragma once

#include <string>
#include <vector>

#include "cli_util.h"
#include "kvouter/backend.h"

namespace kvouter::experiments {

struct Measurement {
  ErrorReport err;
  std::vector<double> ms;  // sorted wall times of the timed runs (forward + combine)
  double compile_ms = 0;
  bool ok() const { return err.ok(); }
  double quantile(double q) const;  // 0.5 = median
};

// Runs once (warm-up, JIT compile) and checks against `ref`; if correct, times `repeats` runs.
// With stop_after_first_ms > 0, stops after the first timed run when it is slower than that.
// With warmup_ms > 0, the first timed run's kernels first run untimed that long (KernelTiming: a
// GPU's clock rises only under load).
Measurement measure(Backend& backend, const Plan& plan, const InputsView& in, const Outputs& ref, int repeats,
                    double stop_after_first_ms = 0, double warmup_ms = 0);

}  // namespace kvouter::experiments
