// Sweeps: `kvouter sweep experiments/configs/NAME.yaml`. A grid of shapes (SPEC §5 bases with
// lists of overrides: sparsity, block size, context length, heads...) times a list of runs
// (backend, schedule, knobs, target). Every point is checked against the float64 oracle, then
// timed; its record is appended to a JSONL file the moment it is measured, so a kill loses
// nothing and a rerun resumes by skipping the points it has. `--shard K/N` takes every N-th
// point (a Slurm job array: experiments/slurm/sweep_array.sh), and `kvouter sweep-merge` joins
// the shards.
#pragma once

#include <string>
#include <vector>

namespace kvouter::experiments {

struct SweepOptions {
  std::string config;
  std::string out;        // default: experiments/results/sweep_<name>[.shardK-of-N].jsonl
  int shard = 1, shards = 1;
  std::string point;      // run only this point id (the repro command of a record)
  std::string results_dir = "experiments/results";
};

int run_sweep(const SweepOptions& opt);
int merge_sweeps(const std::string& out, const std::vector<std::string>& inputs);

}  // namespace kvouter::experiments
