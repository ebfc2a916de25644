// The registry of named schedules. Adding a schedule is one new file in schedules/ plus one line in
// schedules/registry.cpp; it then shows up in the CLI, the tests, the benchmarks and the sweeps.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "kvouter_funcs.h"

namespace kvouter::pipeline {

struct ScheduleInfo {
  std::string name;
  std::string device;           // "cpu" or "vulkan"
  ForwardSchedule forward;      // nullptr for autoscheduled twins
  CombineSchedule combine;
  std::string autoscheduler;    // non-empty for autoscheduled twins (Adams2019, ...)
  std::string summary;
  // Knobs this schedule runs with unless the caller sets them (--param), e.g. chunk for the GPU
  // schedules, whose shared memory the chunk sizes.
  std::map<std::string, std::string> default_params = {};
};

const std::vector<ScheduleInfo>& all_schedules();
const ScheduleInfo* find_schedule(const std::string& name);

// What every CPU schedule shares: tiles in parallel (knob grain), the packed output and the
// tile's gathered query rows vectorised, and the online state computed per tile, vectorised
// over D. The state's chunk loop (update) is left to the schedule.
void cpu_tile_level(ForwardFuncs& f, const Knobs& k);

// Per-file entry points (one pair per schedule file).
void cpu_simple_forward(ForwardFuncs&, const Knobs&, const Halide::Target&);
void cpu_simple_combine(CombineFuncs&, const Knobs&, const Halide::Target&);
void cpu_tiled_forward(ForwardFuncs&, const Knobs&, const Halide::Target&);
void cpu_rowstream_forward(ForwardFuncs&, const Knobs&, const Halide::Target&);
void vulkan_tiled_forward(ForwardFuncs&, const Knobs&, const Halide::Target&);
void vulkan_rows_forward(ForwardFuncs&, const Knobs&, const Halide::Target&);
void vulkan_fused_forward(ForwardFuncs&, const Knobs&, const Halide::Target&);
void vulkan_onepass_forward(ForwardFuncs&, const Knobs&, const Halide::Target&);
void vulkan_combine(CombineFuncs&, const Knobs&, const Halide::Target&);
// GPU schedules need the shapes that size shared memory specialised, and with one_chunk the block
// processed as one chunk; throws CompileError if not.
void vulkan_require_static(const ForwardFuncs& f, const char* name, bool one_chunk);
// The generic variant of every Vulkan schedule (no shape specialised: D, page, block, qhead and T
// all from the buffers): applies the one schedule that runs any shape and returns true; returns
// false when the shapes are specialised (vulkan_tiled.cpp).
bool vulkan_generic_forward(ForwardFuncs& f, const Knobs& k);
// The Vulkan forward's GEMM stages, each with workgroups of group_rows rows of a tile
// (vulkan_tiled.cpp).
void vulkan_gemm_forward(ForwardFuncs& f, const Knobs& k, int group_rows);
// A register-tiled reduction: `acc` computed at `at` (a thread loop) in registers, its pure
// dimensions x and row unrolled, the reduction r outermost, and `step` of its r_extent steps per
// iteration unrolled where step divides r_extent (step 1: none). Halide's SPIR-V marks every
// loop DontUnroll, so this is the only unrolling a Vulkan kernel gets (vulkan_tiled.cpp).
void register_accumulator(Halide::Func acc, const Halide::LoopLevel& at, Halide::Var x, Halide::Var row,
                          Halide::RVar r, int r_extent, int step);
// vulkan_onepass: channels per staged slice of K (knob slice, at most D; 0 = the largest divisor
// of D up to 32 and up to 4096 / block floats; a slice not dividing D is lowered to one that does),
// and the shared memory of one workgroup as Halide 21 allocates it (vulkan_onepass.cpp); the
// tuner prunes with the latter.
int vulkan_onepass_slice(int D, int block, int slice = 0);
// vulkan_fused: the shared memory of one workgroup, about 4 x (4 rows D + 2 chunk D) bytes (the
// query rows, the state, the K and V chunk; vulkan_fused.cpp); the tuner prunes with it.
int64_t vulkan_fused_shared_bytes(int rows, int D, int chunk);
int64_t vulkan_onepass_shared_bytes(int rows, int D, int block, int slice = 0);

}  // namespace kvouter::pipeline
