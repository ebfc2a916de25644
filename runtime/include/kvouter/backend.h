// The backend interface: every backend takes the same Plan and inputs (views of caller memory)
// and returns the same Outputs (or writes them into caller memory), so tests, benchmarks, sweeps and the tuner treat them all alike.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "kvouter/plan.h"
#include "kvouter/tensor.h"

namespace kvouter {

struct Outputs {
  Tensor<float> out;  // [Tq, Hq, D]
  Tensor<float> lse;  // [Tq, Hq]
};

// Caller memory that a run writes its results into: out [Tq, Hq, D] and lse [Tq, Hq], row-major.
struct OutputsView {
  TensorView<float> out;
  TensorView<float> lse;
  OutputsView() = default;
  OutputsView(TensorView<float> o, TensorView<float> l) : out(o), lse(l) {}
  OutputsView(Outputs& o);  // NOLINT: implicit, a view of owned outputs
};

// Owned outputs of the problem's shapes (zeros).
Outputs outputs_for(const Problem& p);

// InputError naming "out" or "lse" unless the views have the problem's shapes, row-major.
void check_outputs(const OutputsView& out, const Problem& p);

// Forward results: [num_partials, qhead, D + 2] packed (o, m, l), see tile_layout.h.
struct Partials {
  Tensor<float> rows;
  static Partials empty(const Plan& plan);  // o = 0, m = kMaskedScore, l = 0
};

// Log-sum-exp combine on the host: out[t, j] = sum_r w_r o_r / sum_r w_r l_r with
// w_r = exp(m_r - max_r m_r). Empty rows give out = 0 and lse = -inf.
Outputs combine_partials(const Plan& plan, const Partials& parts);
void combine_partials(const Plan& plan, const Partials& parts, const OutputsView& out);

// Wall times of the last run, split by phase (milliseconds). With KernelTiming::reps > 1 the
// kernels ran that many times on the same buffers: forward_ms and combine_ms are the medians and
// the *_all vectors hold every repetition (one entry each for a plain run).
struct RunTiming {
  double forward_ms = 0;
  double combine_ms = 0;
  double compile_ms = 0;   // JIT compile of the last run; never counted above
  double transfer_ms = 0;  // host <-> device copies of the last run (GPU targets); never counted above
  std::vector<double> forward_all, combine_all;
};

// How the Halide backends time their kernels within one run: after the inputs are in place, the
// forward and combine run back to back for at least warmup_ms (untimed), then `reps` times,
// timed; the outputs are those of the last repetition. The warm-up matters on the lent H200: its
// driver leaves a Vulkan-only load at the idle SM clock (345 MHz instead of 1980) unless the GPU
// has been busy for a while (measured, docs/vulkan.md); repeating whole runs instead
// re-uploads the inputs between kernels, long enough for the clock to drop again.
struct KernelTiming {
  int reps = 1;
  double warmup_ms = 0;
};

// What a backend is asked to be: the CLI's --backend/--schedule/--param/--target.
struct BackendConfig {
  std::string backend;
  std::string schedule;                        // empty = the backend's default
  std::map<std::string, std::string> params;   // schedule knobs, e.g. T=16
  std::string target;                          // Halide target string; empty = default
  // The caller compares every result with an oracle itself (the tuner): the autoscheduled GPU
  // twins then skip their own check (experiments/registry.cpp).
  bool caller_checks_results = false;
};

// Which GPU API a target string (as given or resolved, e.g. "host-vulkan", "x86-64-linux-cuda")
// names.
bool is_vulkan_target(const std::string& target);
bool is_cuda_target(const std::string& target);

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  virtual std::string schedule() const { return "-"; }
  virtual std::string target() const { return "host"; }
  // Knobs actually in force (for result records).
  virtual std::map<std::string, std::string> params() const { return {}; }
  // The plan this backend wants (its tile size T).
  virtual PlanOptions plan_options() const { return {}; }
  virtual Outputs run(const Plan& plan, const InputsView& in) = 0;
  // The same, written into caller memory (checked with check_outputs). The Halide backends write
  // their results there directly; the others run() and copy. A backend serves one thread at a
  // time: its timing is its own, and so are the host Halide kernels' partials, kept from call to
  // call so that a step allocates nothing (kvouter/halide_kernels.h, run_kernels).
  virtual void run_into(const Plan& plan, const InputsView& in, const OutputsView& out);
  const RunTiming& last_timing() const { return timing_; }
  // Kernel repetitions and warm-up within each run; backends without separate kernels (direct,
  // dense) ignore it and report one repetition.
  void set_kernel_timing(KernelTiming t) { kernel_timing_ = t; }

 protected:
  RunTiming timing_;
  KernelTiming kernel_timing_;
};

struct BackendInfo {
  std::string name;
  std::string description;
  std::function<std::vector<std::string>()> schedules;  // names selectable with --schedule
  std::function<std::vector<std::string>()> targets;    // targets selectable with --target
  std::function<std::unique_ptr<Backend>(const BackendConfig&)> make;
};

// The registry of backends. Registration lines live in one place (experiments/registry.cpp);
// adding a backend is a class plus one line there.
class BackendRegistry {
 public:
  static BackendRegistry& instance();
  void add(BackendInfo info);
  const std::vector<BackendInfo>& all() const { return infos_; }
  const BackendInfo* find(const std::string& name) const;
  // Throws BackendError naming the unknown backend and listing the known ones.
  std::unique_ptr<Backend> make(const BackendConfig& cfg) const;

 private:
  std::vector<BackendInfo> infos_;
};

}  // namespace kvouter
