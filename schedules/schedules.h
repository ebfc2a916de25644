// What the files of schedules/ share: helpers that several schedules apply. Each file registers
// its own schedule with register_schedule() (generators/schedule_registry.h); adding a schedule is
// one new file here, and it then shows up in the CLI, the tests, the benchmarks, the sweeps and
// the tuner.
#pragma once

#include <cstdint>
#include <string>

#include "schedule_registry.h"

namespace kvouter::pipeline {

// What every CPU schedule shares: tiles in parallel (tasks of `grain` tiles: the output's loops
// `tile` over tasks and `tile_in` within one), the packed output and the tile's gathered query
// rows vectorised, and the online state (where it is defined: not with chunk_partials) computed
// per task, vectorised over D. The state's chunk loop (update) is left to the schedule. row_lanes > 0: the query rows
// stored rows innermost and vectorised over them by row_lanes (cpu_decode), else over D.
void cpu_tile_level(ForwardFuncs& f, const Knobs& k, int row_lanes = 0);
// Where a CPU schedule computes its per-chunk stages: the state's chunk loop (st, rc), or, where
// the partials are the one chunk's own (ForwardFuncs::chunk_partials), the tile loop of the output.
Halide::LoopLevel chunk_level(const ForwardFuncs& f);

// The combines the schedules share (cpu_simple.cpp, vulkan_tiled.cpp).
void cpu_simple_combine(CombineFuncs&, const Knobs&, const Halide::Target&);
void vulkan_combine(CombineFuncs&, const Knobs&, const Halide::Target&);
// A register tile of a small product computed per chunk at `at`: a wrapper of `product`
// stores the chunk's result with `col` innermost, tiled by `cols` (vectorised by `vec`) x `rows`
// (unrolled) in a loop "co" over the column tiles, and `product` itself is computed per register
// tile there (stored `col` innermost, vectorised by `vec`, unrolled). Returns the wrapper; the
// caller schedules product's update (cpu_tiled.cpp).
Halide::Func register_tile(Halide::Func product, Halide::Var col, Halide::Var row, const Halide::LoopLevel& at,
                           int cols, int vec, int rows);
// A small matrix product `product(col, row) += ...` over `red`, computed per chunk at `at`
// in register tiles of (k.unroll x k.vec) columns by k.rows rows, the reduction outermost, `col`
// vectorised and stored innermost (cpu_tiled.cpp).
void register_tiled_product(Halide::Func product, Halide::Var col, Halide::Var row, Halide::RVar red,
                            const Halide::LoopLevel& at, const Knobs& k);
// The CPU schedules' tuning axes and the rule they share (cpu_simple.cpp).
const ScheduleInfo::Axes& cpu_axes();
bool cpu_keep(const KnobValues& k, const TuneShape& shape);
bool cpu_chunk_keep(const KnobValues& k, const TuneShape& shape);  // cpu_keep's chunk rule alone
// The GEMM-stage schedules' (vulkan_tiled, vulkan_rows) axes and rule (vulkan_tiled.cpp).
const ScheduleInfo::Axes& vulkan_gemm_axes();
bool vulkan_gemm_keep(const KnobValues& k, const TuneShape& shape);
// GPU schedules need the shapes that size shared memory specialised, and those whose registry
// entry says one_chunk the block processed as one chunk; throws CompileError if not.
void vulkan_require_static(const ForwardFuncs& f, const char* name);
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
// vulkan_slices (vulkan_onepass.cpp): channels per staged slice of K (the knob, or half of
// vulkan_onepass's automatic slice), positions per staged slice of V (no more floats than the K
// slice, a divisor of the block), and the shared memory of one workgroup as Halide 21 allocates it.
int vulkan_slices_key_slice(int D, int block, int slice = 0);
int vulkan_slices_value_slice(int D, int block, int key_slice);
int64_t vulkan_slices_shared_bytes(int rows, int unroll, int D, int block, int slice = 0);

}  // namespace kvouter::pipeline
