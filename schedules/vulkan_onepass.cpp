// vulkan_onepass: the whole forward of a tile in one kernel with the block as one chunk, so that
// nothing but the partials passes through device memory. One workgroup per (group of `rows`
// rows, tile). In it, in order, each stage's result in shared memory:
//   qf      the group's query rows (pre-scaled)
//   scores  s(p, row) = q[row] . k[p]       over D in slices: each slice of the block's K staged
//                                            in shared memory (coalesced), register tiles of
//                                            unroll x unroll per thread
//   stats   cmax, csum per row               one thread per row, reduced in registers
//   pexp    exp(s - cmax) where attended     all threads over (row, position)
//   P.V     cpv(d, row) = sum_p pexp v[p][d] register tiles again, V read from its pages directly
//                                            (threads along d: coalesced)
// and the packed [o | m | l] is written from there. Compared with vulkan_tiled (the same
// stages, each a kernel with its result in device memory, K first transposed into a copy of
// every tile's block) this removes six of the seven kernels, the 537 MB K copy of the GPU shapes
// and every per-call intermediate the Halide 21 Vulkan runtime allocates and clears
// (docs/vulkan.md limit 10). Compared with vulkan_fused there is no chunk loop, so no online state across it
// (docs/vulkan.md limit 4). The cost: scores and weights of the whole block live in shared memory.
// The block must be one chunk (the registry's default chunk=0, the whole block).
// Knobs: rows (rows per workgroup), unroll (register tile edge), vec (the tile's vector width),
// slice (K channels staged per step).
// Measured 2026-12-03 (H200, AOT, warm clocks, kernel medians of 5,
// experiments/results/gpu/2026-12-03/gpu_bench_slices.json): on host-cuda (rows 16, unroll 4,
// 4-wide) gpu-decode 0.83 ms = 26.8 % of HBM bandwidth, gpu-prefill 173 ms = 17.8 % of FP32 peak;
// on host-vulkan with the SPIR-V stage (docs/spirv_stage.md; rows 16, unroll 2, 2-wide; unroll 4
// for prefill) 2.18 ms = 10.2 % of HBM and 336 ms. vulkan_slices below is faster on both.
// The NVIDIA Vulkan driver gives it 64-84 registers per thread (ptxas: 56 for the CUDA twin;
// experiments/results/gpu/vk_pipeline_stats.txt).
// With its K slices loaded in vectors on CUDA (below), measured 2026-12-08 (H100, AOT, kernel
// medians of 9, experiments/results/gpu/2026-12-08/gpu_bench_vector_staging_kv_h100_1.json):
// gpu-decode 0.753 ms (forward 0.694), bfloat16 0.705 ms, float16 0.702 ms.
//
// vulkan_slices: the same kernel, with what held it on the H200 changed (ncu on CUDA: 30 % of
// warps active, the phases of a workgroup one after another):
//   - V staged in shared memory in slices of positions, as K is in slices of channels: every
//     thread issues its share of a slice's loads at once, where vulkan_onepass's P.V waited on
//     four positions' loads at a time;
//   - the row statistics (max and sum over the block) by several threads per row, their partial
//     results then reduced per row, where vulkan_onepass has one thread per row over the block;
//   - K slices of half vulkan_onepass's automatic width, so that both slices fit the 48 KiB of a
//     Vulkan workgroup on the H200 (vulkan_slices_shared_bytes).
// Measured 2026-12-04 (H200, AOT, warm clocks, kernel medians of 5:
// experiments/results/gpu/2026-12-04/gpu_bench_one_chunk.json): CUDA (rows 16, unroll 4)
// gpu-decode 0.67 ms = 33.4 % of HBM (bfloat16 0.63 ms), gpu-prefill 132 ms = 23.4 % of FP32
// peak; Vulkan (rows 16, unroll 2 for decode, 4 for prefill) 1.81 ms = 12.4 % of HBM and 271 ms.
// Against vulkan_onepass and vulkan_tiled: experiments/results/gpu/2026-12-03/gpu_bench_slices.json.
// ncu there (ncu_decode_slices_float32.txt, before the one-chunk forward): issue slots 66 % busy,
// the integer pipe the busiest; 418 M instructions for 134 M FMAs. The default GPU schedule
// (experiments/registry.cpp).
#include <algorithm>

#include "schedules.h"

namespace kvouter::pipeline {

using namespace Halide;

namespace {

// The RX outputs of a register tile along x: V-wide vectors (V divides RX; 1 = unrolled scalars).
void unroll_or_vectorize(Stage st, VarOrRVar x, int RX, int V) {
  if (V <= 1) {
    st.unroll(x);
  } else if (V == RX) {
    st.vectorize(x);
  } else {
    Var xv("xv"), xu("xu");
    st.split(x, xu, xv, V).reorder(xv, xu).vectorize(xv).unroll(xu);
  }
}

// A register accumulator (register_accumulator's) with its tile's x as V-wide vectors, in its
// initial value and its update; V 1 leaves it unrolled.
void vectorize_accumulator(Func acc, Var x, int RX, int V) {
  if (V <= 1) return;
  unroll_or_vectorize(acc, x, RX, V);
  unroll_or_vectorize(acc.update(), x, RX, V);
}

// A register-tiled GEMM stage at the workgroup level: `stage` (a wrapper, in shared memory) over
// (x, row), RX x RY outputs per thread, `acc` (its reduction over r) in registers.
void block_gemm(Func stage, Func acc, Var x, Var row, Var c, Var tile, LoopLevel at, int RX, int RY, RVar r,
                int r_extent, int V) {
  const TailStrategy guard = TailStrategy::GuardWithIf;
  Var xo("xo"), xi("xi"), ro("ro"), ri("ri");
  stage.compute_at(at).store_in(MemoryType::GPUShared)
      .split(x, xo, xi, RX, guard)
      .split(row, ro, ri, RY, guard)
      .reorder(xi, ri, xo, ro, c, tile)
      .gpu_threads(xo, ro)
      .unroll(ri);
  unroll_or_vectorize(stage, xi, RX, V);
  // Four steps of the reduction per iteration: more loads in flight per thread.
  register_accumulator(acc, LoopLevel(stage, xo), x, row, r, r_extent, 4);
  vectorize_accumulator(acc, x, RX, V);
}

// A register-tiled GEMM stage `stage(x, row, c, tile) += ...` over `r` at the workgroup level,
// stored in shared memory (x padded to x_storage where > 0), its reduction in slices of `slice`
// steps: per slice, each thread sums its RX x RY tile over the slice in registers (rfactor: the
// slice's sum is a register intermediate), then adds it to the stage, one read-modify-write per
// slice. Returns the loop over the slices, at which the slice's operand is staged.
RVar sliced_gemm(Func stage, Var x, Var row, Var c, Var tile, RVar r, int slice, int x_storage, LoopLevel group,
                 int RX, int RY, int V, const std::string& tag) {
  const TailStrategy guard = TailStrategy::GuardWithIf;
  RVar ro_(tag + "r_slice"), ri_(tag + "r_in");
  Var u(tag + "u");
  stage.update().split(r, ro_, ri_, slice);
  Func part = stage.update().rfactor(ro_, u);
  Var xo(tag + "xo"), xi(tag + "xi"), ro(tag + "ro"), ri(tag + "ri");
  Var uxo(tag + "uxo"), uxi(tag + "uxi"), uro(tag + "uro"), uri(tag + "uri");
  stage.compute_at(group).store_in(MemoryType::GPUShared);
  if (x_storage > 0) stage.bound_storage(x, x_storage);
  stage.split(x, xo, xi, RX, guard).split(row, ro, ri, RY, guard)
      .reorder(xi, ri, xo, ro, c, tile).gpu_threads(xo, ro).unroll(xi).unroll(ri);
  stage.update()
      .split(x, uxo, uxi, RX, guard).split(row, uro, uri, RY, guard)
      .reorder(uxi, uri, uxo, uro, c, tile, ro_).gpu_threads(uxo, uro).unroll(uri);
  unroll_or_vectorize(stage.update(), uxi, RX, V);
  // Four steps per iteration (docs/vulkan.md limit 9: without it the Vulkan kernel waits on each
  // step's loads).
  register_accumulator(part, LoopLevel(stage, uxo), x, row, ri_, slice, 4);
  vectorize_accumulator(part, x, RX, V);
  return ro_;
}

// A slice of K or V (stage(d, p, c, tile), staged in shared memory) loaded by every thread of the
// NX x NY workgroup: (d, p) fused with d innermost (coalesced), each thread's share an unrolled
// loop inside the thread, so that all its loads are issued before its first store.
// With W > 1 (W channels that start a 16-byte aligned group: ForwardFuncs::kv_group, CUDA), each
// thread loads W channels as a vector (experiments/gpu/ptx_loads.py counts the loads by width:
// one of 16 bytes in float32, two of 8 bytes in 16 bits, as LLVM emits them). Without
// the alignment stated, the NVPTX backend split such a vector into W word loads, each warp load
// touching W times the sectors (vulkan_slices's gpu-decode forward then took 0.74 ms on the H200
// against 0.66, experiments/results/gpu/superseded/2026-12-03/gpu_bench_decode_vecstage.json).
void stage_slice(Func stage, Var d, Var p, Var c, Var tile, int NX, int NY, int W, const std::string& tag) {
  const TailStrategy guard = TailStrategy::GuardWithIf;
  Var dp(tag + "dp"), fo(tag + "fo"), fi(tag + "fi"), foo(tag + "foo"), foi(tag + "foi"), dw(tag + "dw"), dv(tag + "dv");
  // With W > 1, the groups of W channels take the channels' place in the fused index.
  if (W > 1) stage.split(d, dw, dv, W, TailStrategy::RoundUp);
  stage.fuse(W > 1 ? dw : d, p, dp)
      .split(dp, fo, fi, NX, guard)
      .split(fo, foo, foi, NY, guard)
      .reorder(foo, fi, foi, c, tile)
      .gpu_threads(fi, foi)
      .unroll(foo);
  if (W > 1) stage.vectorize(dv);  // (innermost: the fused loops take dw's place)
}

}  // namespace

int vulkan_onepass_slice(int D, int block, int slice) {
  // 0: the automatic choice, up to 32 channels and a 16 KiB slice; otherwise the knob, at most D.
  int DK = slice > 0 ? std::min(slice, D) : std::max(1, std::min({32, D, 4096 / std::max(1, block)}));
  while (D % DK) --DK;
  return DK;
}

// Per workgroup, in floats: scores and weights (rows x (block + 4) each), P.V and the query rows
// (rows x D each), the two row statistics, the K slice ((block + 4) x DK), less what Halide 21
// lets share (one rows x (block + 4) array and one statistic). Checked against the launch sizes
// of the generated kernels: 3496, 4776, 7336 and 10448 floats at D 128 for (block, rows) = (32,
// 8), (64, 8), (128, 8), (128, 16).
// With a slice of fewer channels than the group has rows, Halide 21 packs them differently and
// 4 x rows floats more are allocated (fitted to the generated kernels: rows 4 to 16, slices 2 to
// 32; Tuner.OnepassSharedMemoryIsWhatHalideAllocates checks every generated one).
int64_t vulkan_onepass_shared_bytes(int rows, int D, int block, int slice) {
  const int64_t C4 = block + 4;
  const int DK = vulkan_onepass_slice(D, block, slice);
  return 4 * (int64_t(rows) * (2 * D + C4 + 1) + C4 * DK + (DK < rows ? 4 * int64_t(rows) : 0));
}

namespace {

// A workgroup of either schedule: R rows (at most the tile's), RX x RY register tiles, NX x NY
// threads (as wide as the widest stage: the GEMMs' C / RX or D / RX threads, 32 along channels
// or positions in the element-wise stages, or one thread per row for the statistics), and NS
// threads per row for the statistics (vulkan_slices; 1 for vulkan_onepass).
struct Workgroup {
  int R, RX, RY, NX, NY, NS;
};
Workgroup workgroup(int rows, int unroll, int D, int C, bool slices) {
  Workgroup g;
  g.R = std::max(1, rows);
  g.RX = std::max(1, std::min(unroll, 8));
  g.RY = std::max(1, std::min(g.RX, g.R));
  g.NY = (g.R + g.RY - 1) / g.RY;
  g.NX = std::max({32, (C + g.RX - 1) / g.RX, (D + g.RX - 1) / g.RX, g.R});
  g.NS = slices ? std::max(1, std::min(C, g.NX * g.NY / g.R)) : 1;
  return g;
}

}  // namespace

// Per workgroup, in floats, as Halide 21 packs the stages whose lifetimes do not overlap into
// one array each: {qf, cmax partials, weights}, scores, {K slice, the max}, P.V, {V slice, sum
// partials}, the sum. Checked against every generated kernel at the automatic slice, the only
// one the tuner tries (Tuner.SlicesSharedMemoryIsWhatHalideAllocates); with the slice knob set,
// Halide may pack the small stages differently.
int64_t vulkan_slices_shared_bytes(int rows, int unroll, int D, int block, int slice) {
  const Workgroup g = workgroup(rows, unroll, D, block, true);
  const int64_t R = g.R, C4 = block + 4, NS = g.NS;
  const int DK = vulkan_slices_key_slice(D, block, slice);
  const int64_t PK = vulkan_slices_value_slice(D, block, DK);
  return 4 * (std::max({R * D, NS * R, R * C4}) + R * C4 + std::max(C4 * DK, R) + R * D +
              std::max(PK * D, NS * R) + R);
}

namespace {

// vulkan_onepass's forward, and with `slices` set vulkan_slices's (the same kernel with V staged
// in slices like K, and the row statistics reduced by several threads per row).
void onepass_forward(ForwardFuncs& f, const Knobs& k, const Target& target, bool slices) {
  const char* name = slices ? "vulkan_slices" : "vulkan_onepass";
  if (vulkan_generic_forward(f, k)) return;
  vulkan_require_static(f, name);
  const int D = f.static_D, C = f.static_C;
  // Shared memory: vulkan_onepass_shared_bytes (41 KiB at D 128, block 128, rows 16). A
  // workgroup past the device's limit is the runtime's clear error; the tuner keeps within it.
  const Workgroup g = workgroup(std::min(k.rows, f.static_rows), k.unroll, D, C, slices);
  const int R = g.R, RX = g.RX, RY = g.RY, NX = g.NX, NY = g.NY;
  // vec: the register tile's RX positions (scores) or channels (P.V) as V-wide vectors, so that
  // its K-slice reads from shared memory and its V reads from the pages are V-wide loads, and the
  // K-slice staging loop unrolled by every thread of the workgroup; vec 1 is the scalar kernel.
  // The knob's default (16) means min(4, unroll) on CUDA and min(2, unroll) on Vulkan. Measured on
  // the H200 (AOT, warm clocks, kvouter_gpu_bench; experiments/results/gpu/gpu_bench_*_vec*.json):
  // on CUDA, 4-wide against scalar took gpu-decode's forward from 0.85 to 0.79 ms and
  // gpu-prefill's from 183 to 170 ms; on Vulkan, 2-wide took gpu-decode's (rows 16, unroll 2) from
  // 5.15-5.34 to 4.94-5.08 ms, but 4-wide took gpu-prefill's (unroll 4) from 1134 to 1572 ms.
  // Halide's SPIR-V builds each vector from scalar loads (OpCompositeConstruct) and takes it
  // apart again (OpCompositeExtract).
  // Only where the register tiles cover the block and D exactly: a guarded partial tile's vector
  // would read past the pages (Halide then rejects the input's bounds).
  const int automatic = target.has_feature(Target::Vulkan) ? 2 : 4;
  const int want = k.vec >= 16 ? automatic : std::max(1, k.vec);
  int V = C % RX == 0 && D % RX == 0 ? std::min({want, RX, 4}) : 1;  // <= 4 wide (notes)
  while (RX % V) --V;
  const int TX = 32;  // threads along channels or positions in the element-wise stages
  if (NX * NY > 1024) {
    throw CompileError(std::string(name) + ": " + std::to_string(NX) + " x " + std::to_string(NY) +
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
  // Scores, in shared memory, over D in slices of DK channels. Each slice of the block's K is
  // staged in shared memory (read along d: coalesced) and every thread adds its unroll x unroll
  // register tile's partial sums over the slice (rfactor: the slice's sum is a register
  // intermediate, the scores take one read-modify-write per slice). Read from the pages by the
  // score threads directly, each warp load touched 32 cache lines (threads run along positions,
  // K rows are 512 bytes apart): ncu on the H200 (CUDA target) had the kernel at 3.4 ms on
  // gpu-decode with 7 % of DRAM bandwidth.
  {
    const int DK = slices ? vulkan_slices_key_slice(D, C, k.slice) : vulkan_onepass_slice(D, C, k.slice);
    const RVar rdo = sliced_gemm(f.s, f.p, f.row, f.c, f.tile, f.rd.x, DK, C + 4, group, RX, RY, V, "s");
    // The slice: positions innermost in storage (the score threads then read unroll
    // consecutive words), rows padded by 4 words against bank conflicts (and kept 16-byte
    // aligned for vector reads). Loaded along d (coalesced).
    f.kf.compute_at(f.s, rdo).store_in(MemoryType::GPUShared)
        .reorder_storage(f.p, f.d, f.c, f.tile).bound_storage(f.p, C + 4);
    if (V > 1) {
      // By every thread of the workgroup, (d, p) fused with d innermost, each thread's share of
      // the slice an unrolled loop inside the thread: all of its loads are issued before its
      // first store (the Vulkan kernel otherwise waits on each load: every SPIR-V loop is
      // DontUnroll, docs/vulkan.md limit 9). With that loop outside the threads, Halide put a
      // workgroup barrier between its steps (32 per slice), each step one load deep.
      // On CUDA vulkan_onepass loads its K slices in vectors (16 bytes a load in float32, 8 in
      // 16 bits). gpu-decode's forward, H100, 2026-12-08, means of two medians of 9, the runs
      // alternating with word loads (experiments/results/gpu/2026-12-08/
      // gpu_bench_vector_staging_kv_h100_{1,2}.json against gpu_bench_scalar_staging_h100_{1,2}.json):
      // 0.694 against 0.750 ms in float32, 0.647 against 0.697 in bfloat16, 0.644 against 0.679
      // in float16. vulkan_slices keeps word loads: with both its K and V slices loaded in vectors
      // it took 0.645 against 0.642 ms in float32, 0.588 against 0.570 in bfloat16 and 0.608
      // against 0.573 in float16; with its K slices alone, 0.647 against 0.645 and 0.587 against
      // 0.570 (gpu_bench_slices_vector_k_h100_{1,2}.json, gpu_bench_scalar_staging_h100_{3,4}.json).
      const int WK = !slices && DK % f.kv_group == 0 ? f.kv_group : 1;
      stage_slice(f.kf, f.d, f.p, f.c, f.tile, NX, NY, WK, "k");
    } else {
      // vec 1: threads along d (DK of them) by the other stages' thread rows, a serial loop
      // over the positions.
      Var pz("pz"), py("py");
      f.kf.split(f.p, pz, py, NY, guard).reorder(pz, f.d, py, f.c, f.tile).gpu_threads(f.d, py);
    }
  }
  // The row statistics (max and sum over the block's positions). vulkan_onepass: one thread per
  // row over all positions. vulkan_slices: NS threads per row, each over every NS-th position
  // (consecutive threads, consecutive words: no bank conflicts), their NS partial results then
  // reduced by one thread per row.
  const int NS = g.NS;
  for (Func* stat : {&f.cmax, &f.csum}) {
    Func w = stat->in();
    w.compute_at(group).store_in(MemoryType::GPUShared).gpu_threads(f.row);
    stat->compute_at(w, f.row).store_in(MemoryType::Register);
    if (NS > 1) {
      RVar so("so"), si("si");
      Var us("us");
      stat->update().split(f.rp.x, so, si, NS, guard);
      Func part = stat->update().rfactor(si, us);
      // (us, row) as one index over the workgroup's NX x NY threads.
      Var ur("ur"), ux("ux"), uy("uy");
      part.compute_at(group).store_in(MemoryType::GPUShared).reorder_storage(us, f.row)
          .fuse(us, f.row, ur).split(ur, uy, ux, NX, guard).reorder(ux, uy, f.c, f.tile).gpu_threads(ux, uy);
      part.update().fuse(us, f.row, ur).split(ur, uy, ux, NX, guard).reorder(ux, uy, f.c, f.tile, so)
          .gpu_threads(ux, uy);
    }
  }
  // Softmax weights: all the threads of the other stages (TX x NY), consecutive (position, row)
  // entries per thread index. (As one thread dimension of TX x NY, it made every workgroup 4x
  // wider than the other stages use: measured 512 threads, 3/4 of them idle in the GEMMs.)
  // Scores and weights are stored positions innermost with rows padded by 4 words: the score
  // threads' read-modify-writes (unroll consecutive positions per thread) and the statistics'
  // one-thread-per-row reads then hit different banks. (Rows innermost, each score update was a
  // 32-way bank conflict: ncu, 47 M conflicts in the gpu-decode kernel.)
  {
    Var rp("rp_f"), fo("fo"), fi("fi"), foo("foo"), foi("foi");
    f.pexp.compute_at(group).store_in(MemoryType::GPUShared).bound_storage(f.p, C + 4)
        .fuse(f.p, f.row, rp)
        .split(rp, fo, fi, TX, guard)
        .split(fo, foo, foi, NY, guard)
        .reorder(fi, foi, foo, f.c, f.tile)
        .gpu_threads(fi, foi);
  }
  if (!slices) {
    // P.V, then read by the output threads; V read from its pages by the GEMM's threads.
    Func cw = f.cpv.in();
    block_gemm(cw, f.cpv, f.d, f.row, f.c, f.tile, group, RX, RY, f.rp.x, C, V);
    return;
  }
  // vulkan_slices: P.V over the block's positions in slices of PK, as the scores over D: each
  // slice of V staged in shared memory by every thread at once (its loads all in flight
  // together, rather than four positions' loads per step of the GEMM's loop), each thread's
  // register tile summed over the slice (rfactor), one read-modify-write per slice.
  {
    const int PK = vulkan_slices_value_slice(D, C, vulkan_slices_key_slice(D, C, k.slice));
    const RVar rpo = sliced_gemm(f.cpv, f.d, f.row, f.c, f.tile, f.rp.x, PK, 0, group, RX, RY, V, "v");
    f.vf.compute_at(f.cpv, rpo).store_in(MemoryType::GPUShared);
    stage_slice(f.vf, f.d, f.p, f.c, f.tile, NX, NY, 1, "v");
  }
}

}  // namespace

int vulkan_slices_key_slice(int D, int block, int slice) {
  // Half of vulkan_onepass's automatic slice: Halide 21 gives the K and V slices separate
  // shared memory, and two 16 KiB slices would take a workgroup at D 128, block 128, rows 16 past
  // the 48 KiB that Vulkan on the H200 allows.
  return vulkan_onepass_slice(D, block, slice > 0 ? slice : std::max(1, vulkan_onepass_slice(D, block) / 2));
}

int vulkan_slices_value_slice(int D, int block, int key_slice) {
  // Positions per staged slice of V: no more floats than the K slice, a divisor of the block.
  int PK = std::max<int>(1, std::min<int64_t>(block, int64_t(block + 4) * key_slice / std::max(1, D)));
  while (block % PK) --PK;
  return PK;
}

void vulkan_onepass_forward(ForwardFuncs& f, const Knobs& k, const Target& target) {
  onepass_forward(f, k, target, false);
}

void vulkan_slices_forward(ForwardFuncs& f, const Knobs& k, const Target& target) {
  onepass_forward(f, k, target, true);
}

namespace {

int64_t onepass_shared(const KnobValues& k, const TuneShape& s) {
  const auto slice = k.find("slice");
  return vulkan_onepass_shared_bytes(int(k.at("rows")), int(s.D), int(s.block_size),
                                     slice == k.end() ? 0 : int(slice->second));
}

int64_t slices_shared(const KnobValues& k, const TuneShape& s) {
  const auto slice = k.find("slice");
  return vulkan_slices_shared_bytes(int(k.at("rows")), int(k.at("unroll")), int(s.D), int(s.block_size),
                                    slice == k.end() ? 0 : int(slice->second));
}

// Both schedules' tuning axes and rule. vec: the per-target default against the scalar kernel
// (on the H200 each won somewhere: docs/vulkan.md). Rows past the tile's rows are the same
// program; the scalar kernel is the default one where the tiles do not cover the block and D.
const ScheduleInfo::Axes kOnepassAxes = {{}, {"4", "8", "16", "32"}, {"2", "4", "8"}, {"", "1"}};
bool onepass_keep(const KnobValues& k, const TuneShape& s) {
  if (k.at("T") > 0 && k.at("rows") > k.at("T") * s.qhead) return false;
  return !(k.count("vec") && (s.block_size % k.at("unroll") || s.D % k.at("unroll")));
}

[[maybe_unused]] const bool registered = register_schedule(
    {"vulkan_onepass", "vulkan", vulkan_onepass_forward, vulkan_combine, "",
     "one kernel per (row group, tile), the block as one chunk: K/V read from their pages once "
     "per workgroup, register-tiled scores and P.V, every intermediate in shared memory",
     true, {{"rows", "8"}}, kOnepassAxes, onepass_shared, onepass_keep});

[[maybe_unused]] const bool registered_slices = register_schedule(
    {"vulkan_slices", "vulkan", vulkan_slices_forward, vulkan_combine, "",
     "vulkan_onepass with V staged in shared memory in slices like K (all of a slice's loads in "
     "flight at once) and the row statistics reduced by several threads per row",
     true, {{"rows", "8"}}, kOnepassAxes, slices_shared, onepass_keep});

}  // namespace

}  // namespace kvouter::pipeline
