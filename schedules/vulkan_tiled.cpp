// vulkan_tiled: one workgroup per tile. Each thread owns a register tile of the online state
// (CH channels x R rows of the tile). Per chunk, the workgroup cooperatively stages the K
// and V chunk in shared memory, computes the chunk's scores, maxima and softmax weights for every
// row into shared memory, and each thread then folds P.V for its own tile into its registers
// (the shape of Halide's apps/cuda_mat_mul: the chunk loop is lifted out of the thread loops).
// Shared memory: 4 * chunk * (2 D + 2 rows) + 8 rows bytes: chunk 8 fits lavapipe's 32 KiB at
// D 128 and 128 rows; chunk 16 fits the H200's 48 KiB. Needs D, block, qhead and T specialised.
// Measured figure: README.md's GPU table (H200, host-vulkan).
#include <algorithm>
#include <initializer_list>

#include "kvouter/tile_layout.h"
#include "schedules.h"

namespace kvouter::pipeline {

using namespace Halide;

void vulkan_require_static(const ForwardFuncs& f, const char* name) {
  if (!f.static_D || !f.static_rows) {
    throw CompileError(std::string(name) + ": GPU schedules need D, block_size, page_size, qhead and T "
                       "specialised (shared-memory sizes must be static)");
  }
}

// One workgroup per `group_rows` rows of one tile (all of them: vulkan_tiled; one edge's query
// heads: vulkan_rows). Knobs: chunk (positions staged per step), rows (rows per thread, raised as
// needed to fit 1024 invocations), unroll (channels per thread).
void vulkan_workgroup_forward(ForwardFuncs& f, const Knobs& k, int group_rows) {
  const TailStrategy guard = TailStrategy::GuardWithIf;
  const int CH = std::max(1, std::min(k.unroll, 8));
  const int G = group_rows;
  // A workgroup's size is, per dimension, the largest thread extent of any of its stages:
  // x carries channel groups, chunk positions and the 32-wide row-statistics and K/V-staging
  // loops; y carries row groups. Keep x * y within the 1024 invocations Vulkan guarantees
  // (lavapipe and the H200 allow exactly 1024; the validation layer rejects more).
  const int groups = (f.static_D + layout::kPartialExtra + CH - 1) / CH;
  const int X = std::max({groups, k.chunk, 32, (f.static_D + 3) / 4});
  const int Ymax = std::max(1, 1024 / X);
  auto ceil_div = [](int a, int b) { return (a + b - 1) / b; };
  if (k.chunk > Ymax) {  // the K/V staging puts the chunk's positions on y
    throw CompileError("vulkan: chunk " + std::to_string(k.chunk) + " does not fit one workgroup with " +
                       std::to_string(X) + " threads across; use chunk <= " + std::to_string(Ymax));
  }
  // Rows per thread of the state (R): the knob, raised in powers of two until the row groups fit.
  int R = std::max(1, k.rows);
  while (R < G && ceil_div(G, R) > Ymax) R *= 2;
  // Rows per thread of the per-chunk score stages (Rs): as few as keep chunk x G / Rs threads
  // within the workgroup.
  const int threads = X * ceil_div(G, R);
  int Rs = 1;
  while (Rs < G && (ceil_div(G, Rs) > Ymax || k.chunk * ceil_div(G, Rs) > threads)) Rs *= 2;
  Var cho("cho"), chi("chi"), ro("ro"), ri("ri"), dO("dO"), di("di"), so("so"), si("si"), rb("rb"), rr("rr");
  // Workgroup (rb, tile) covers rows [rb * G, rb * G + G); thread (cho, ro) owns CH channels x R
  // rows of the output...
  f.out.compute_root()
      .split(f.row, rb, rr, G, guard)
      .split(f.ch, cho, chi, CH, guard)
      .split(rr, ro, ri, R, guard)
      .reorder(chi, ri, cho, ro, rb, f.tile)
      .gpu_blocks(rb, f.tile)
      .gpu_threads(cho, ro)
      .unroll(chi)
      .unroll(ri);
  // ... and the same slice of the online state, in its registers. The chunk loop rc runs at the
  // workgroup level, outside the thread loops, so each chunk's stages are staged cooperatively.
  f.st.compute_at(f.out, rb)
      .store_in(MemoryType::Register)
      .split(f.ch, cho, chi, CH, guard)
      .split(f.row, ro, ri, R, guard)
      .reorder(chi, ri, cho, ro)
      .gpu_threads(cho, ro)
      .unroll(chi)
      .unroll(ri);
  f.st.update()
      .split(f.ch, cho, chi, CH, guard)
      .split(f.row, ro, ri, R, guard)
      .reorder(chi, ri, cho, ro, f.rc.x)
      .gpu_threads(cho, ro)
      .unroll(chi)
      .unroll(ri);
  RVar rc = f.rc.x;
  // The K and V chunk, staged once per workgroup in shared memory.
  for (Func* kv : {&f.kf, &f.vf}) {
    kv->compute_at(f.st, rc).store_in(MemoryType::GPUShared).split(f.d, dO, di, 4, guard)
        .reorder(di, dO, f.p).gpu_threads(dO, f.p).unroll(di);
  }
  // Scores, maxima, weights and sums of the workgroup's rows for this chunk, in shared memory.
  f.s.compute_at(f.st, rc).store_in(MemoryType::GPUShared)
      .split(f.row, so, si, Rs, guard).reorder(si, f.p, so).gpu_threads(f.p, so).unroll(si);
  f.s.update().split(f.row, so, si, Rs, guard).reorder(si, f.rd.x, f.p, so).gpu_threads(f.p, so).unroll(si);
  for (Func* row_stat : {&f.cmax, &f.csum}) {
    row_stat->compute_at(f.st, rc).store_in(MemoryType::GPUShared).split(f.row, so, si, 32, guard).gpu_threads(si, so);
    row_stat->update().split(f.row, so, si, 32, guard).gpu_threads(si, so);
  }
  f.pexp.compute_at(f.st, rc).store_in(MemoryType::GPUShared)
      .split(f.row, so, si, Rs, guard).reorder(si, f.p, so).gpu_threads(f.p, so).unroll(si);
  // P.V for the thread's own slice: inlined into the state update as a register reduction over
  // the chunk's positions, reading pexp and V from shared memory.
  f.cpv.compute_at(f.st, chi);
}

void vulkan_tiled_forward(ForwardFuncs& f, const Knobs& k, const Target&) {
  vulkan_require_static(f, "vulkan_tiled");
  vulkan_workgroup_forward(f, k, f.static_rows);
}

void vulkan_combine(CombineFuncs& f, const Knobs& k, const Target&) {
  const TailStrategy guard = TailStrategy::GuardWithIf;
  Var dO("dO"), di("di"), to("to"), ti("ti"), jo("jo"), ji("ji");
  f.out.compute_root()
      .split(f.d, dO, di, 32, guard)
      .split(f.t, to, ti, 4, guard)
      .reorder(f.j, di, ti, dO, to)
      .gpu_blocks(dO, to)
      .gpu_threads(di, ti);
  f.osum.compute_at(f.out, di);
  for (Func* stat : {&f.mmax, &f.lsum}) {
    // Device-resident intermediates: storage padded to 16 floats in j, so the buffer's byte size
    // is a multiple of 64 (Halide 21's Vulkan allocator bug).
    stat->compute_root().align_storage(f.j, 16).gpu_tile(f.j, f.t, jo, to, ji, ti, 8, 32, guard);
    stat->update().gpu_tile(f.j, f.t, jo, to, ji, ti, 8, 32, guard);
  }
  f.lse.compute_root().gpu_tile(f.j, f.t, jo, to, ji, ti, 8, 32, guard);
}

}  // namespace kvouter::pipeline
