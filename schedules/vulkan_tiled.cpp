// The Vulkan forward as register-tiled GEMM stages per tile (the shape of Halide's
// apps/cuda_mat_mul: each thread accumulates a small output tile in registers, its inputs read
// through the caches), with the block processed as one chunk; seven kernels:
//   K copy  the block's K, transposed                                     (kernel 1)
//   scores  s(p, row)   = scale q[row] . k[p]        rows x C over D    (kernel 2)
//   stats   cmax, csum  per row over the block's C positions              (kernels 3, 6)
//   weights pexp = exp(s - cmax) where attended                           (kernel 4)
//   P.V     cpv(d, row) = sum_p pexp v[p][d]          D x rows over C  (kernel 5)
//   output  [o | m | l] per (channel, row)                                (kernel 7)
// Scores and P.V pass through device memory (sized like the partials; the runtime's query
// batches keep each within one storage buffer). Why not one fused kernel with the K/V chunk in
// shared memory: Halide 21 sizes a per-thread register state that lives across a chunk loop
// lifted out of the thread loops to the whole tile (50 KB per thread at D 128), which the NVIDIA
// driver rejects ("failed to validate local memory"; H200, docs/vulkan.md limit 4).
// Knobs: rows (register rows per thread), unroll (register columns per thread); chunk must
// cover the block (the registry's default chunk=0 is the whole block; a smaller chunk is rejected).
// Two work splits: vulkan_tiled puts a whole tile in one workgroup; vulkan_rows
// (vulkan_rows.cpp) spreads each tile over workgroups of one edge's rows.
// Measured 2026-12-01 (H200, AOT, warm clocks, kernel medians of 5, SPIR-V stage on,
// experiments/results/gpu/2026-12-01/gpu_bench_stage_on.json): host-vulkan gpu-decode 2.99 ms
// = 7.5 % of HBM bandwidth (target 60 %: not met), gpu-prefill 311 ms = 9.9 % of FP32 peak, the
// fastest Vulkan kernel there (vulkan_onepass 322 ms; the H200's tuning-database entry for
// gpu-prefill); host-cuda gpu-decode 1.41 ms. On lavapipe (CI), the default Vulkan schedule.
#include <algorithm>

#include "kvouter/tile_layout.h"
#include "schedules.h"

namespace kvouter::pipeline {

using namespace Halide;

void vulkan_require_static(const ForwardFuncs& f, const char* name) {
  const ScheduleInfo* info = find_schedule(name);
  const bool one_chunk = info && info->one_chunk;
  if (!f.static_D || !f.static_rows || !f.static_C) {
    throw CompileError(std::string(name) + ": GPU schedules need D, block_size, page_size, qhead and T "
                       "specialised (register tiles and workgroup sizes must be static), or none of them "
                       "(the generic variant)");
  }
  if (one_chunk && f.static_NC != 1) {
    throw CompileError(std::string(name) + ": the block must be one chunk (--param chunk >= block_size)");
  }
}

bool vulkan_generic_forward(ForwardFuncs& f, const Knobs& k) {
  if (f.static_D || f.static_rows || f.static_T || f.static_C) return false;
  const auto* chunk = f.rp.x.extent().as<Halide::Internal::IntImm>();
  const int C = chunk ? static_cast<int>(chunk->value) : 0;
  if (C < 1 || C > 32) {
    throw CompileError("generic Vulkan variant: chunk must be 1 to 32 positions (register arrays), got " +
                       std::to_string(C));
  }
  // No shared memory and no size that depends on the shape: one thread per (channel, row) of a
  // group of `rows` rows and 32 channels, channels past 32 looped in the thread. Each thread
  // keeps its channel's online state (o, m, l) in registers over the chunk loop and recomputes
  // the chunk's C scores, their max and sum itself from global memory (q and K read through the
  // caches): about D-fold redundant score work, the price of running any shape. Measured on
  // lavapipe only (CI); the specialised variants are the fast path.
  const TailStrategy guard = TailStrategy::GuardWithIf;
  const int R = std::max(1, std::min(k.rows, 32));
  Var rg("rg"), ri("ri"), cho("cho"), chi("chi");
  f.out.compute_root()
      .split(f.row, rg, ri, R, guard)
      .split(f.ch, cho, chi, 32, guard)
      .reorder(cho, chi, ri, rg, f.tile)
      .gpu_blocks(rg, f.tile)
      .gpu_threads(chi, ri);
  f.st.compute_at(f.out, cho).store_in(MemoryType::Register);
  const LoopLevel chunk_loop(f.st, f.rc.x);
  for (Func stage : {f.s, f.pexp}) stage.compute_at(chunk_loop).store_in(MemoryType::Register).unroll(f.p);
  // The chunk's C scores accumulate together, in one pass over D: loop iterations per thread
  // about (D + 2) / 32 x chunks x D (lavapipe ends a shader's loops after 65535 iterations in
  // all; the aot backend refuses a shape past that there, see aot.cpp). D is not split: the
  // guards of a split by a factor that may not divide it become bool kernel arguments, which
  // Halide 21 puts in the uniform block (invalid SPIR-V, rejected by the validation layer).
  f.s.update().reorder(f.p, f.rd.x).unroll(f.p);
  for (Func stat : {f.cmax, f.csum, f.cpv}) {
    stat.compute_at(chunk_loop).store_in(MemoryType::Register);
    stat.update().unroll(f.rp.x);
  }
  return true;
}

void register_accumulator(Func acc, const LoopLevel& at, Var x, Var row, RVar r, int r_extent, int step) {
  acc.compute_at(at).store_in(MemoryType::Register).unroll(x).unroll(row);
  Stage u = acc.update();
  u.reorder(x, row, r).unroll(x).unroll(row);
  if (step > 1 && r_extent % step == 0) {
    RVar ro("r_o"), ri("r_i");
    u.split(r, ro, ri, step).reorder(x, row, ri, ro).unroll(ri);
  }
}

namespace {

// A register-tiled GEMM stage: `stage` (a wrapper, computed at root) over (x, row, tile) with
// `acc` (the reduction) accumulated in registers per thread, RX x RY outputs each. Rows per
// workgroup: group_rows (rows beyond it go to more workgroups); threads within 1024.
void gemm_stage(Func stage, Func acc, Var x, Var row, Var c, Var tile, int extent_x, int group_rows, int RX, int RY,
                RVar r) {
  const TailStrategy guard = TailStrategy::GuardWithIf;
  const int tx = std::max(1, (extent_x + RX - 1) / RX);
  int ty = std::max(1, (group_rows + RY - 1) / RY);
  while (tx * ty > 1024) ty = (ty + 1) / 2;
  Var xo("xo"), xi("xi"), ro("ro"), ri("ri"), rb("rb"), rt("rt");
  stage.compute_root()
      .split(x, xo, xi, RX, guard)
      .split(row, rb, rt, ty * RY, guard)
      .split(rt, ro, ri, RY, guard)
      .reorder(xi, ri, xo, ro, rb, c, tile)
      .gpu_blocks(rb, c, tile)
      .gpu_threads(xo, ro)
      .unroll(xi)
      .unroll(ri);
  register_accumulator(acc, LoopLevel(stage, xo), x, row, r, 0, 1);
}

// An element-wise stage over (a, b, c, tile) at root: fa x fb threads per workgroup.
void elementwise_stage(Func stage, Var a, Var b, Var c, Var tile, int fa, int fb) {
  const TailStrategy guard = TailStrategy::GuardWithIf;
  Var ao("ao"), ai("ai"), bo("bo"), bi("bi"), ct("ct");
  stage.compute_root()
      .split(a, ao, ai, fa, guard)
      .split(b, bo, bi, fb, guard)
      .reorder(ai, bi, ao, bo, c, tile)
      .fuse(c, tile, ct)
      .gpu_blocks(ao, bo, ct)
      .gpu_threads(ai, bi);
}

}  // namespace

void vulkan_gemm_forward(ForwardFuncs& f, const Knobs& k, int group_rows) {
  const TailStrategy guard = TailStrategy::GuardWithIf;
  const int RY = std::max(1, std::min(k.rows, 8)), RX = std::max(1, std::min(k.unroll, 8));
  // The block's K, gathered from its pages once per tile and stored transposed (positions
  // innermost): the score GEMM's threads, which run along positions, then read it coalesced and
  // with no page-table lookups in their inner loop. The transposition goes through shared
  // memory in 32 x 32 squares (read along d, written along positions, both coalesced; the
  // square's rows padded to 33 words so that the column reads hit 32 banks). Written directly
  // from threads along d, this copy was 60 % of gpu-decode on the H200 (ncu, CUDA target:
  // 1.95 of 3.3 ms, 11 % of DRAM bandwidth; experiments/results/gpu/ncu_decode_cuda.csv).
  {
    Func kw = f.kf.in();
    Var dO("dO"), di("di"), po("po"), pi("pi"), dz("dz"), dy("dy"), pz("pz"), py("py"), ct("ct");
    kw.compute_root()
        .reorder_storage(f.p, f.d, f.c, f.tile)
        .split(f.d, dO, di, 32, guard)
        .split(f.p, po, pi, 32, guard)
        .split(di, dz, dy, 8, guard)
        .reorder(dz, pi, dy, po, dO, f.c, f.tile)
        .fuse(f.c, f.tile, ct)
        .gpu_blocks(po, dO, ct)
        .gpu_threads(pi, dy)
        .unroll(dz);
    f.kf.compute_at(kw, po).store_in(MemoryType::GPUShared).bound_storage(f.d, 33)
        .split(f.p, pz, py, 8, guard)
        .reorder(pz, f.d, py, f.c, f.tile)
        .gpu_threads(f.d, py)
        .unroll(pz);
  }
  // Scores: wrapper sw over (p, row, c, tile) at root; the reduction over D in registers.
  Func sw = f.s.in();
  gemm_stage(sw, f.s, f.p, f.row, f.c, f.tile, f.static_C, group_rows, RX, RY, f.rd.x);
  // Device-resident intermediates (K, scores, weights, statistics, P.V) are stored densely with
  // the tile outermost: the runtime pads the tile count to a multiple of 16, so every buffer's
  // byte size is a multiple of 64 (Halide 21's Vulkan allocator, docs/vulkan.md limits 1 and 2). align_storage would
  // break that: Halide sizes a buffer to its last element, so a padded stride leaves an
  // odd-sized tail (measured: 8160-byte buffers).
  //
  // Row statistics over the block's positions (one thread per row) and the softmax weights
  // exp(s - cmax), stored once rather than recomputed by every thread of the P.V stage.
  Var ro("ro"), ri("ri");
  // Each statistic is a wrapper at root (one thread per row) with the reduction in that thread's
  // registers: its initial value and its update then run in one kernel. As two kernels (a
  // compute_root Func with an update) the update sometimes ran on uninitialised values on
  // lavapipe (measured: every LSE +inf on a large-logit case, varying between runs).
  for (Func* stat : {&f.cmax, &f.csum}) {
    Func w = stat->in();
    w.compute_root().split(f.row, ro, ri, 64, guard).gpu_blocks(ro, f.c, f.tile).gpu_threads(ri);
    stat->compute_at(w, ri).store_in(MemoryType::Register);
  }
  elementwise_stage(f.pexp, f.p, f.row, f.c, f.tile, 32, 8);
  // P.V: wrapper over (d, row, c, tile); the reduction over positions in registers.
  Func cw = f.cpv.in();
  gemm_stage(cw, f.cpv, f.d, f.row, f.c, f.tile, f.static_D, group_rows, RX, RY, f.rp.x);
  // Output: the (single-chunk) online state per (channel, row), packed [o | m | l].
  Var cho("cho"), chi("chi");
  f.out.compute_root()
      .split(f.ch, cho, chi, 32, guard)
      .split(f.row, ro, ri, 8, guard)
      .reorder(chi, ri, cho, ro, f.tile)
      .gpu_blocks(cho, ro, f.tile)
      .gpu_threads(chi, ri);
  f.st.compute_at(f.out, chi).store_in(MemoryType::Register);
}

void vulkan_tiled_forward(ForwardFuncs& f, const Knobs& k, const Target&) {
  if (vulkan_generic_forward(f, k)) return;
  vulkan_require_static(f, "vulkan_tiled");
  vulkan_gemm_forward(f, k, f.static_rows);
}

void vulkan_combine(CombineFuncs& f, const Knobs& k, const Target&) {
  const TailStrategy guard = TailStrategy::GuardWithIf;
  // Two kernels and no intermediate in device memory. `out`: one thread per (32nd of D, query
  // head), a workgroup per (4 query heads, query); each thread takes its row's max and sum over
  // the query's partials itself (two loads per partial, shared by the workgroup's threads through
  // the cache), then reduces its D / 32 channels in registers. `lse`: one thread per (query head,
  // query), with its own copy of the max and sum. Halide 21's Vulkan runtime allocates and clears
  // every root intermediate per call and drains the queue after each dispatch, so each kernel
  // and buffer saved is a fixed cost saved (the statistics at root made four kernels).
  Var dO("dO"), di("di"), jo("jo"), ji("ji"), to("to"), ti("ti");
  const Halide::Internal::IntImm* static_D = f.D.as<Halide::Internal::IntImm>();
  f.out.compute_root()
      .split(f.d, dO, di, 32, guard)
      .split(f.j, jo, ji, 4, guard)
      .reorder(dO, di, ji, jo, f.t)
      .gpu_blocks(jo, f.t)
      .gpu_threads(di, ji);
  if (static_D) {
    // The thread's D / 32 channels unrolled, their sums in registers.
    f.osum.compute_at(f.out, di).store_in(MemoryType::Register);
    f.osum.update().reorder(f.d, f.rk.x);
    f.out.unroll(dO);
    f.osum.unroll(f.d);
    f.osum.update().unroll(f.d);
  } else {
    // The generic variant: one channel at a time (register arrays must have a static size).
    f.osum.compute_at(f.out, dO).store_in(MemoryType::Register);
  }
  // lse's own copies of the statistics (lsum's reads mmax: its copy reads mmax's copy).
  Func lsum_lse = f.lsum.clone_in(f.lse);
  Func mmax_lse = f.mmax.clone_in({f.lse, lsum_lse});
  for (Func stat : {f.mmax, f.lsum}) stat.compute_at(f.out, di).store_in(MemoryType::Register);
  f.lse.compute_root().gpu_tile(f.j, f.t, jo, to, ji, ti, 8, 32, guard);
  for (Func stat : {mmax_lse, lsum_lse}) stat.compute_at(f.lse, ji).store_in(MemoryType::Register);
}

const ScheduleInfo::Axes& vulkan_gemm_axes() {
  static const ScheduleInfo::Axes axes{{}, {"1", "2", "4", "8"}, {"1", "2", "4", "8"}};  // chunk: one_chunk
  return axes;
}

bool vulkan_gemm_keep(const KnobValues& k, const TuneShape&) {
  return k.at("rows") * k.at("unroll") <= 32;  // a rows x unroll register tile
}

namespace {

[[maybe_unused]] const bool registered = register_schedule(
    {"vulkan_tiled", "vulkan", vulkan_tiled_forward, vulkan_combine, "",
     "GEMM stages per tile (one workgroup per tile each): K staged transposed, register-tiled "
     "scores and P.V through device memory; the block is one chunk",
     true, {}, vulkan_gemm_axes(), nullptr, vulkan_gemm_keep});

}  // namespace

}  // namespace kvouter::pipeline
