// The whole inference step on a device-resident cache (kvouter/device_cache.h), as an engine runs
// it: kvouter_gpu_bench --loop N. See step_loop.cpp.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "kvouter/backend.h"

namespace kvouter::experiments {

struct StepLoopOptions {
  std::string target, schedule;
  int steps = 64;
  // The cache holds the case's whole pool (pool_pages, its reachable pages spread over it, in
  // segments where one buffer cannot hold it) instead of only the pages a selection reaches.
  bool full_pool = false;
  uint64_t seed = 5;
  // The engine writes each step's q into the runner's staging (DeviceStepRunner::q_staging) and
  // reads out/lse where the runner reads them back (read_outputs()): no host copy in the step.
  // Otherwise q is its own array, copied in by the step, and out/lse are copied into its own.
  bool in_place = false;
  // With in_place: q's upload may go ahead of the plan (DeviceStepRunner::set_q_ahead).
  bool q_ahead = true;
  // With in_place: on Vulkan, out/lse written by the combine into the runner's host memory
  // (DeviceStepRunner::set_outputs_in_place); false: read back from device memory.
  bool outputs_in_place = true;
  // The block tables written once into the runner (DeviceStepRunner::write_block_tables) and each
  // step run on them (StepInputs::resident_tables: a decode step's tiles built on the device).
  // Otherwise each step passes the engine's host tables.
  bool resident_tables = false;
  // With resident tables: decode steps planned on the device (1), on the host (0), or as the
  // runner's default for the target (-1; DeviceStepRunner::default_decode_plan_on_device).
  int decode_plan_on_device = -1;
  // After step 0 (timed as the others), its kernels run again untimed for this long: the H200's
  // driver holds a Vulkan load at its idle SM clock until the GPU has been busy a while
  // (docs/vulkan.md), and a loop's steps alone did not always raise it.
  double warmup_ms = 0;
  // With in_place: each step through DeviceStepRunner::step_and_read with this many parts
  // (set_overlap_parts; CUDA overlaps their copies and kernels), then the same step again with
  // its phases one by one (step(), read_outputs()), whose kernels the overlapped step is measured
  // against and whose outputs it must equal bit for bit. 0: step() alone.
  int overlap_parts = 0;
  // The host plan's tasks (DeviceStepRunner::set_plan_tasks); -1: the runner's default.
  int plan_tasks = -1;
  // Before each step, the runner's host plan of the same inputs, timed alone (DeviceStepRunner::
  // host_plan; the step's own plan then finds their lines in the caches): where the step's plan
  // time goes, its work or its first touch of the inputs after the device waits. Always the whole
  // host plan: where the step builds a decode step's tiles on the device (CUDA, resident tables)
  // the host's part of its plan is smaller. Not with overlap_parts.
  bool plan_probe = false;
  // With in_place: q written into the staging with streaming stores (halide::host_copy_streaming)
  // instead of memcpy, so that q's lines do not evict what the step's plan reads from the host's
  // caches (whether that shortens the plan is not settled: experiments/results/gpu/README.md,
  // 2026-12-08).
  bool q_streaming = false;
};

// Runs `steps` steps of the case on a fresh cache: its pages written once, then per step (decode:
// one query per sequence) one appended token per sequence, a new selection and a new query;
// prefill steps repeat the case. Per step: append, plan, uploads, kernels, readback. The first
// and last steps' outputs are checked: decode against the CPU direct baseline of that step's
// inputs (check_with_direct), prefill against `reference` (the same inputs' outputs) when given.
nlohmann::json run_step_loop(const Inputs& in, const StepLoopOptions& opt, bool check_with_direct,
                             const Outputs* reference = nullptr);

}  // namespace kvouter::experiments
