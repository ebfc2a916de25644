// vulkan_tiled: one workgroup per tile. Each thread owns a register tile of the online state
// (CH channels x gpu_rows rows of the tile). Per chunk, the workgroup cooperatively stages the K
// and V chunk in shared memory, computes the chunk's scores, maxima and softmax weights for every
// row into shared memory, and each thread then folds P.V for its own tile into its registers
// (the shape of Halide's apps/cuda_mat_mul: the chunk loop is lifted out of the thread loops).
// Shared memory: 4 * chunk * (2 D + 2 rows) + 8 rows bytes: chunk 8 fits lavapipe's 32 KiB at
// D 128 and 128 rows; chunk 16 fits the H200's 48 KiB. Needs D, block, qhead and T specialised.
// Measured figure: README.md's GPU table (H200, host-vulkan).
#include <algorithm>

#include "kvouter/tile_layout.h"
#include "schedules.h"

namespace kvouter::pipeline {

using namespace Halide;

namespace {
constexpr int kChannelsPerThread = 4;
}

void vulkan_require_static(const ForwardFuncs& f, const char* name) {
  if (!f.static_D || !f.static_rows) {
    throw CompileError(std::string(name) + ": GPU schedules need D, block_size, page_size, qhead and T "
                       "specialised (shared-memory sizes must be static)");
  }
}

void vulkan_tiled_forward(ForwardFuncs& f, const Knobs& k, const Target&) {
  vulkan_require_static(f, "vulkan_tiled");
  const TailStrategy guard = TailStrategy::GuardWithIf;
  const int CH = kChannelsPerThread;
  // Rows per thread: the knob, raised (in powers of two) until the workgroup fits the 1024
  // invocations Vulkan guarantees (lavapipe and the H200 both allow exactly 1024).
  int R = std::max(1, k.rows);
  const int groups = (f.static_D + layout::kPartialExtra + CH - 1) / CH;
  while (R < f.static_rows && groups * ((f.static_rows + R - 1) / R) > 1024) R *= 2;
  Var cho("cho"), chi("chi"), ro("ro"), ri("ri"), dO("dO"), di("di"), so("so"), si("si"), t1("t1");
  // One workgroup per tile; thread (cho, ro) owns CH channels x R rows of the output...
  f.out.compute_root()
      .split(f.ch, cho, chi, CH, guard)
      .split(f.row, ro, ri, R, guard)
      .reorder(chi, ri, cho, ro, f.tile)
      .gpu_blocks(f.tile)
      .gpu_threads(cho, ro)
      .unroll(chi)
      .unroll(ri);
  // ... and the same slice of the online state, in its registers. The chunk loop rc runs at the
  // workgroup level, outside the thread loops, so each chunk's stages can be staged cooperatively.
  f.st.compute_at(f.out, f.tile)
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
    kv->compute_at(f.st, rc).store_in(MemoryType::GPUShared).split(f.d, dO, di, CH, guard)
        .reorder(di, dO, f.p).gpu_threads(dO, f.p).unroll(di);
  }
  // Scores, maxima, weights and sums of every row of the tile for this chunk, in shared memory.
  f.s.compute_at(f.st, rc).store_in(MemoryType::GPUShared)
      .split(f.row, so, si, R, guard).reorder(si, f.p, so).gpu_threads(f.p, so).unroll(si);
  f.s.update().split(f.row, so, si, R, guard).reorder(si, f.rd.x, f.p, so).gpu_threads(f.p, so).unroll(si);
  for (Func* row_stat : {&f.cmax, &f.csum}) {
    row_stat->compute_at(f.st, rc).store_in(MemoryType::GPUShared).split(f.row, so, si, 32, guard).gpu_threads(si, so);
    row_stat->update().split(f.row, so, si, 32, guard).gpu_threads(si, so);
  }
  f.pexp.compute_at(f.st, rc).store_in(MemoryType::GPUShared)
      .split(f.row, so, si, R, guard).reorder(si, f.p, so).gpu_threads(f.p, so).unroll(si);
  // P.V for the thread's own slice: inlined into the state update as a register reduction over
  // the chunk's positions, reading pexp and V from shared memory.
  f.cpv.compute_at(f.st, chi);
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
