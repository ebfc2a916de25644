// vulkan_onepass: the whole forward of a tile in one kernel with the block as one chunk, so that
// nothing but the partials passes through device memory. One workgroup per (group of `rows`
// rows, tile). In it, in order, each stage's result in shared memory:
//   qf      the group's query rows (pre-scaled)
//   scores  s(p, row) = q[row] . k[p]       register tiles of unroll x unroll per thread, K read
//                                            from its pages directly (through the L1 cache)
//   stats   cmax, csum per row               one thread per row, reduced in registers
//   pexp    exp(s - cmax) where attended     all threads over (row, position)
//   P.V     cpv(d, row) = sum_p pexp v[p][d] register tiles again, V read from its pages directly
// and the packed [o | m | l] is written from there. Compared with vulkan_tiled (the same
// stages, each a kernel with its result in device memory, K first transposed into a copy of
// every tile's block) this removes six of the seven kernels, the 537 MB K copy of the GPU shapes
// and every per-call intermediate the Halide 21 Vulkan runtime allocates and clears (README
// limit 10). Compared with vulkan_fused there is no chunk loop, so no online state across it
// (README limit 4) and no per-chunk barrier phases. The cost: scores and weights of the whole
// block live in shared memory, about 8 x rows x (D + block) bytes (24 KiB at D 128, block 256,
// rows 8); rows is halved until that fits the H200's 48 KiB.
// Knobs: rows (rows per workgroup), unroll (register tile edge: unroll positions or channels by
// unroll rows per thread). The block must be one chunk (the registry passes chunk 4096).
// Measured: see README "Vulkan (GPU)".
#include <algorithm>

#include "schedules.h"

namespace kvouter::pipeline {

using namespace Halide;

namespace {

// Shared memory of one workgroup, bytes: qf and cpv (rows x D), scores and weights (rows x C).
int onepass_shared_bytes(int rows, int D, int C) { return 4 * (2 * rows * D + 2 * rows * C + 2 * rows); }

// A register-tiled GEMM stage at the workgroup level: `stage` (a wrapper, in shared memory) over
// (x, row), RX x RY outputs per thread, `acc` (its reduction over r) in registers.
void block_gemm(Func stage, Func acc, Var x, Var row, Var c, Var tile, LoopLevel at, int RX, int RY, RVar r,
                int r_extent) {
  const TailStrategy guard = TailStrategy::GuardWithIf;
  Var xo("xo"), xi("xi"), ro("ro"), ri("ri");
  stage.compute_at(at).store_in(MemoryType::GPUShared)
      .split(x, xo, xi, RX, guard)
      .split(row, ro, ri, RY, guard)
      .reorder(xi, ri, xo, ro, c, tile)
      .gpu_threads(xo, ro)
      .unroll(xi)
      .unroll(ri);
  acc.compute_at(stage, xo).store_in(MemoryType::Register).unroll(x).unroll(row);
  Stage u = acc.update();
  u.reorder(x, row, r).unroll(x).unroll(row);
  // Four steps of the reduction per iteration: more loads in flight per thread.
  if (r_extent % 4 == 0) {
    RVar ro4("ro4"), ri4("ri4");
    u.split(r, ro4, ri4, 4).reorder(x, row, ri4, ro4).unroll(ri4);
  }
}

}  // namespace

void vulkan_onepass_forward(ForwardFuncs& f, const Knobs& k, const Target&) {
  vulkan_require_static(f, "vulkan_onepass", true);
  const int D = f.static_D, C = f.static_C;
  int R = std::max(1, std::min(k.rows, f.static_rows));
  while (R > 1 && onepass_shared_bytes(R, D, C) > 48 * 1024) R = (R + 1) / 2;
  const int RX = std::max(1, std::min(k.unroll, 8));
  const int RY = std::max(1, std::min(RX, R));
  const int TX = 32;  // threads along channels or positions in the element-wise stages
  const int NY = (R + RY - 1) / RY;  // thread rows of every stage
  // The workgroup is as wide as its widest stage: the GEMMs' C / RX or D / RX threads, TX, or
  // the statistics' one thread per row.
  const int NX = std::max({TX, (C + RX - 1) / RX, (D + RX - 1) / RX, R});
  if (NX * NY > 1024) {
    throw CompileError("vulkan_onepass: " + std::to_string(NX) + " x " + std::to_string(NY) +
                       " threads per workgroup (more than 1024): raise unroll or lower rows");
  }
  const TailStrategy guard = TailStrategy::GuardWithIf;

  // The output: one workgroup per (row group, tile). ShiftInwards keeps every group R rows (the
  // last one overlaps its neighbour, writing the same values), so every stage below has
  // constant extents. Each thread writes unroll rows of one channel per 32.
  Var rg("rg"), rr("rr"), rto("rto"), rti("rti"), cho("cho"), chi("chi");
  f.out.compute_root()
      .split(f.row, rg, rr, R, TailStrategy::ShiftInwards)
      .split(rr, rto, rti, RY, guard)
      .split(f.ch, cho, chi, TX, guard)
      .reorder(rti, chi, rto, cho, rg, f.tile)
      .unroll(rti)
      .gpu_blocks(rg, f.tile)
      .gpu_threads(chi, rto);
  // The (single-chunk) online state of each output point, in its thread's registers.
  f.st.compute_at(f.out, chi).store_in(MemoryType::Register);
  LoopLevel group(f.out, rg);

  // The group's query rows, coalesced along D.
  {
    Var dO("dO"), di("di"), qo("qo"), qi("qi");
    f.qf.compute_at(group).store_in(MemoryType::GPUShared)
        .split(f.d, dO, di, TX, guard)
        .split(f.row, qo, qi, RY, guard)
        .reorder(qi, dO, di, qo, f.tile)
        .unroll(qi)
        .gpu_threads(di, qo);
  }
  // Scores, rows innermost in storage: the statistics threads (one per row) then read
  // consecutive words.
  Func sw = f.s.in();
  block_gemm(sw, f.s, f.p, f.row, f.c, f.tile, group, RX, RY, f.rd.x, D);
  sw.reorder_storage(f.row, f.p, f.c, f.tile);
  for (Func* stat : {&f.cmax, &f.csum}) {
    Func w = stat->in();
    w.compute_at(group).store_in(MemoryType::GPUShared).gpu_threads(f.row);
    stat->compute_at(w, f.row).store_in(MemoryType::Register);
  }
  // Softmax weights: all the threads of the other stages (TX x NY), consecutive (row, position)
  // entries per thread index. (As one thread dimension of TX x NY, it made every workgroup 4x
  // wider than the other stages use: measured 512 threads, 3/4 of them idle in the GEMMs.)
  {
    Var rp("rp_f"), fo("fo"), fi("fi"), foo("foo"), foi("foi");
    f.pexp.compute_at(group).store_in(MemoryType::GPUShared)
        .reorder_storage(f.row, f.p, f.c, f.tile)
        .reorder(f.row, f.p, f.c, f.tile)
        .fuse(f.row, f.p, rp)
        .split(rp, fo, fi, TX, guard)
        .split(fo, foo, foi, NY, guard)
        .reorder(fi, foi, foo, f.c, f.tile)
        .gpu_threads(fi, foi);
  }
  // P.V, then read by the output threads.
  Func cw = f.cpv.in();
  block_gemm(cw, f.cpv, f.d, f.row, f.c, f.tile, group, RX, RY, f.rp.x, C);
}

}  // namespace kvouter::pipeline
