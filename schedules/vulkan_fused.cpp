// vulkan_fused: the whole forward of a tile in one kernel (the design). One workgroup per
// (group of `rows` rows, tile); inside it a serial loop over the block's chunks of `chunk`
// positions. Per chunk: the query rows, the K chunk and the V chunk are gathered into shared
// memory once and every row of the group reads them from there; the scores, their row max and
// sum and the softmax weights live in shared memory, each reduction accumulated in its thread's
// registers; each thread then folds its (d, row) entries of P.V into the online-softmax state
// (o, m, l), which stays in shared memory across the chunk loop (a register state there is sized
// to the whole tile by Halide 21, docs/vulkan.md limit 4). Masking uses the finite kMaskedScore; the
// combine and the host turn all-masked rows into SPEC's -inf.
// Knobs: chunk (positions per chunk), rows (rows per workgroup, at most 32). Shared memory per
// workgroup is 4 x (4 rows D + 2 chunk D + rows) bytes: 24 KiB at D 128, chunk 8, rows 8 (the JIT
// default; lavapipe allows 32 KiB), 40 KiB at chunk 8, rows 16 (the GPU shapes' AOT default; the
// H200 allows 48 KiB).
// Measured 2026-12-02 (H200, AOT, SPIR-V stage on, kernel medians of 3 after 0.5 s of warm-up;
// experiments/results/gpu/2026-12-02/gpu_bench_fused_rows.json; chunk 8, rows 16): host-vulkan
// gpu-decode 4.02 ms = 5.6 % of HBM bandwidth, gpu-prefill 716 ms = 4.3 % of FP32 peak (targets
// not met); host-cuda 23.8 / 5983 ms. The slowest GPU schedule: every chunk
// is about ten barrier-separated phases, three of them waiting on dependent global gathers. On
// lavapipe (CI) it is for correctness only.
#include <algorithm>

#include "schedules.h"

namespace kvouter::pipeline {

// The workgroup's shared memory as Halide 21 allocates it: 4 x (D (4 rows + 2 chunk) + rows) bytes.
// Exact where measured: 32800 bytes at D 128, chunk 16, rows 8 (lavapipe's error message;
// Vulkan.EveryAotVariantOfTheGpuShapes checks the formula against every generated variant).
int64_t vulkan_fused_shared_bytes(int rows, int D, int chunk) {
  return 4 * (int64_t(D) * (4 * int64_t(rows) + 2 * int64_t(chunk)) + int64_t(rows));
}

using namespace Halide;

void vulkan_fused_forward(ForwardFuncs& f, const Knobs& k, const Target&) {
  if (vulkan_generic_forward(f, k)) return;
  vulkan_require_static(f, "vulkan_fused");
  const TailStrategy guard = TailStrategy::GuardWithIf;
  // Rows per workgroup, at most 32: the stages run 32 x rows threads (a workgroup holds 1024).
  const int R = std::max(1, std::min({k.rows, f.static_rows, 32}));
  const int C = f.static_C;
  const int TX = 32;  // threads along the innermost (D or positions) dimension
  Var rg("rg"), ri("ri"), cho("cho"), chi("chi"), dO("dO"), di("di");

  f.out.compute_root()
      .split(f.row, rg, ri, R, guard)
      .split(f.ch, cho, chi, TX, guard)
      .reorder(cho, chi, ri, rg, f.tile)
      .unroll(cho)
      .gpu_blocks(rg, f.tile)
      .gpu_threads(chi, ri);

  // The online state across the chunk loop, in shared memory.
  f.st.compute_at(f.out, rg).store_in(MemoryType::GPUShared)
      .split(f.d, dO, di, TX, guard).reorder(dO, di, f.row).gpu_threads(di, f.row).unroll(dO);
  Var uo("uo"), ui("ui");
  f.st.update()
      .split(f.d, uo, ui, TX, guard)
      .reorder(uo, ui, f.row, f.rc.x)
      .unroll(uo)
      .gpu_threads(ui, f.row);
  LoopLevel chunk_loop(f.st, f.rc.x);

  // The group's query rows, staged once per chunk. Once per workgroup would be less traffic, but
  // Halide 21 packs the block's shared allocations by their order in the kernel without the chunk
  // loop's back edge: staged before the loop, the rows shared their space with the softmax
  // weights, which overwrote them in the first chunk (measured: wrong results whenever a block
  // had more than one chunk). Stored rows-innermost: the score threads of one warp read up to
  // 32 / chunk different rows at one d, which then sit in different banks.
  f.qf.compute_at(chunk_loop).store_in(MemoryType::GPUShared).reorder_storage(f.row, f.d)
      .split(f.d, dO, di, TX, guard).reorder(dO, di, f.row).gpu_threads(di, f.row).unroll(dO);
  // The chunk's K and V, gathered from the pages once per workgroup (threads along d: coalesced
  // reads of each page's rows). K is stored positions-innermost, so the score threads, which run
  // along positions, read it without bank conflicts; V stays d-innermost for the P.V threads,
  // which run along d.
  const int PY = std::min(C, TX);  // positions per thread row; wider chunks loop in the thread
  for (Func* kv : {&f.kf, &f.vf}) {
    Var po("po"), pi("pi");
    kv->compute_at(chunk_loop).store_in(MemoryType::GPUShared)
        .split(f.d, dO, di, TX, guard).split(f.p, po, pi, PY, guard)
        .reorder(dO, po, di, pi).gpu_threads(di, pi).unroll(dO).unroll(po);
  }
  f.kf.reorder_storage(f.p, f.d);
  // Scores and softmax weights, one per thread, a warp covering 32 / chunk rows of a chunk when
  // the chunk is narrower than a warp (so that no lane idles). Returns the innermost thread var.
  auto pos_row_threads = [&](Func w) {
    Var po("po"), pi("pi"), ry("ry"), rx("rx"), px("px");
    if (C >= TX) {
      w.split(f.p, po, pi, TX, guard).reorder(po, pi, f.row).gpu_threads(pi, f.row).unroll(po);
      return pi;
    }
    w.split(f.row, ry, rx, TX / C, guard).fuse(f.p, rx, px).reorder(px, ry).gpu_threads(px, ry);
    return px;
  };
  // Every reduction runs in its thread's registers (a wrapper stores the result). Accumulated in
  // shared memory, each step would wait on the last one's store.
  Func sw = f.s.in();
  sw.compute_at(chunk_loop).store_in(MemoryType::GPUShared);
  Var st_x = pos_row_threads(sw);
  f.s.compute_at(sw, st_x).store_in(MemoryType::Register);
  if (f.static_D % 4 == 0) {
    RVar rdo("rdo"), rdi("rdi");
    f.s.update().split(f.rd.x, rdo, rdi, 4).unroll(rdi);
  }
  for (Func* stat : {&f.cmax, &f.csum}) {
    Func w = stat->in();
    w.compute_at(chunk_loop).store_in(MemoryType::GPUShared).gpu_threads(f.row);
    stat->compute_at(w, f.row).store_in(MemoryType::Register);
    if (C <= 16) stat->update().unroll(f.rp.x);
  }
  f.pexp.compute_at(chunk_loop).store_in(MemoryType::GPUShared);
  pos_row_threads(f.pexp);
  // Each thread's P.V entries in its registers, folded into the state right away.
  f.cpv.compute_at(f.st, ui).store_in(MemoryType::Register);
  if (C <= 16) f.cpv.update().unroll(f.rp.x);
}

namespace {

int64_t fused_shared(const KnobValues& k, const TuneShape& s) {
  return vulkan_fused_shared_bytes(int(k.at("rows")), int(s.D), int(k.at("chunk")));
}

[[maybe_unused]] const bool registered = register_schedule(
    {"vulkan_fused", "vulkan", vulkan_fused_forward, vulkan_combine, "",
     "one kernel per (row group, tile): K/V chunk staged in shared memory, online softmax over "
     "chunks, state in shared memory",
     false, {{"chunk", "8"}, {"rows", "8"}}, {{"4", "8", "16", "32"}, {"4", "8", "16", "32"}, {"4"}}, fused_shared,
     [](const KnobValues& k, const TuneShape& s) { return k.at("chunk") <= s.block_size && k.at("unroll") == 4; }});

}  // namespace

}  // namespace kvouter::pipeline
