// The autotuner: `kvouter tune --shape NAME --target T` (the CPU schedules for host, the Vulkan
// ones for host-vulkan). A generic loop over the schedule registry: each entry's knob axes crossed
// with T, filtered by the entry's keep() predicate keyed on shape class and target (Triton's
// autotune), plus the autoscheduled twins as candidates. Each candidate is JIT-compiled, checked
// against the Eigen float64 oracle (a wrong one is rejected with the reason logged), and timed by
// the median after warm-up (Highway's auto_tune: a robust statistic, not the minimum); clear
// losers are dropped after their first run. Every trial is appended to a JSONL log as it
// finishes, so a rerun resumes; the winner goes into a JSON database keyed by shape class,
// target, machine fingerprint and Halide version, which the CLI's default choice reads.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "kvouter/inputs.h"

namespace kvouter::experiments {

struct Candidate {
  std::string schedule;
  std::map<std::string, std::string> knobs;
  std::string key() const;
};

struct ShapeClass {
  std::string name;  // e.g. "D128_b64_p16_q8_prefill"
  int64_t D = 0, block_size = 0, page_size = 0, qhead = 0;
  bool decode = false;  // mean queries per sequence <= 4
  static ShapeClass of(const Inputs& in);
};

// The search space after keep(): the CPU schedules for a host target, the Vulkan ones for a
// Vulkan target, each registry entry's axes (pipeline::ScheduleInfo) crossed with T and pruned by
// the entry's keep() (the shared-memory schedules to the device's shared memory per workgroup).
std::vector<Candidate> tuning_space(const ShapeClass& shape, const std::string& target);
constexpr uint64_t kMinSharedBytes = 32 * 1024;  // the smallest seen (lavapipe)
bool keep(const Candidate& c, const ShapeClass& shape, const std::string& target,
          uint64_t max_shared_bytes = kMinSharedBytes);

// The point of the search space that the untuned default runs on a CPU target (what `kvouter
// run` takes for this case without the tuning database): default_schedule()'s schedule for the
// case (cpu_decode for a decode step, else cpu_tiled), with the knobs the JIT then resolves: the
// registry entry's defaults over the target's, the chunk at most the block. A sampled tune always
// measures it, so that a sampled winner is never slower than the default it replaces.
Candidate untuned_default(const Inputs& in, const ShapeClass& shape, const std::string& target);

struct TuneOptions {
  std::string shape = "tiny";
  std::string target = "host";
  std::string db = "experiments/results/tuning_db.json";
  std::string log;          // default: experiments/results/tune_<shape>_<target>.jsonl
  int repeats = 5;          // timed runs per candidate (after one warm-up)
  double drop_factor = 3;   // a first run this many times slower than the best median is dropped
  int max_candidates = 0;   // 0 = all
  double warmup_ms = -1;    // before each candidate's timed runs; < 0 = 2000 on a Vulkan target, else 0
};

int run_tune(const TuneOptions& opt);

// The database's winner for this case's shape class on this machine, if any.
struct TunedChoice {
  std::string schedule;
  std::map<std::string, std::string> knobs;
  double median_ms = 0;
};
std::optional<TunedChoice> lookup_tuned(const Inputs& in, const std::string& target, const std::string& db);

}  // namespace kvouter::experiments
