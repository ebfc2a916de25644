// cpu_tiled: the tile as two small matrix products per chunk, register-blocked.
//   - parallel over tiles (knob grain);
//   - per chunk, the K chunk is staged once, transposed (positions innermost), so that
//     S = Q_tile . K_chunk^T vectorises over positions; V is staged as is, so that
//     O += P . V_chunk vectorises over D;
//   - both products run in register tiles of (unroll x vec) columns by `rows` rows, with the
//     reduction loop outermost (the shape of Halide's linear_algebra matmul), so the
//     accumulators stay in registers.
//   - cmax and csum reduce in vector lanes; the mask is computed once per chunk and edge;
//   - where the block is one chunk, the partials are stored straight from the chunk's cpv, cmax
//     and csum, with no online state (chunk_partials): 12-14 % off SPEC prefill on the Xeon host
//     below (experiments/results/cpu/2026-12-07/chunk_partials_xeon.md).
// Measured 2026-12-07 (experiments/results/cpu_bench.json, run 4fccfa5; experiments/results/
// README.md), 2-core Sapphire Rapids-class Xeon, AVX-512, 394 GFLOP/s: SPEC prefill AOT 92.1 ms
// (the 6 x 4 register tile) = 3.8x direct, 35 % of the FP32 peak; JIT with the schedule's own
// defaults (4 x 4) 100.6 ms; with the tuning database's knobs (T 32, rows 6 x unroll 4; experiments/
// results/cpu/2026-12-07/tune_prefill_xeon_chunk_partials.jsonl) 94.5 ms in the tuner; decode
// (T = 1) JIT 31.6 ms = 1.5x direct. On a 2-core AMD EPYC Zen 3 (AVX2, 201 GFLOP/s; 2026-12-04, experiments/results/
// cpu/2026-12-04/cpu_bench_zen3.json): prefill 122.6-125.7 ms, 50-51 % of its peak
// (experiments/results/cpu/2026-12-04/forward_overheads.md says where the forward's time goes).
#include "schedules.h"

namespace kvouter::pipeline {

using namespace Halide;

Func register_tile(Func product, Var col, Var row, const LoopLevel& at, int cols, int vec, int rows) {
  Var co("co"), ci("ci"), ro("ro"), ri("ri");
  Func wrapper = product.in();
  wrapper.compute_at(at)
      .reorder_storage(col, row)
      .tile(col, row, co, ro, ci, ri, cols, rows, TailStrategy::GuardWithIf)
      .vectorize(ci, vec)
      .unroll(ri);
  product.compute_at(wrapper, co).reorder_storage(col, row).vectorize(col, vec).unroll(col).unroll(row);
  return wrapper;
}

// A small matrix product `product(col, row) += ...` over reduction `red`, computed per chunk at
// `at` in register tiles of (unroll x vec) columns by `rows` rows (register_tile), with
// the reduction loop outermost, so its accumulators stay in registers.
void register_tiled_product(Func product, Var col, Var row, RVar red, const LoopLevel& at, const Knobs& k) {
  Var cu("cu"), cv("cv");
  register_tile(product, col, row, at, k.vec * k.unroll, k.vec, k.rows);
  product.update().split(col, cu, cv, k.vec).reorder(cv, cu, row, red).vectorize(cv).unroll(cu).unroll(row);
}

// A chunk's per-row reduction over its positions (cmax, csum), whose input is stored with the
// positions innermost: each of `lanes` vector lanes reduces its own positions (rfactor), then the
// lanes are reduced per row. Where the chunk is not a multiple of the lanes, the reduction stays
// scalar.
void lane_reduction(Func r, RVar rp, Var row, const LoopLevel& at, int lanes) {
  const std::optional<int64_t> extent = as_const_int(rp.extent());
  r.compute_at(at);
  if (!extent || *extent % lanes != 0) return;
  RVar rpo("rpo"), rpi("rpi");
  Var v("v");
  Func part = r.update().split(rp, rpo, rpi, lanes).rfactor(rpi, v);
  part.compute_at(at).reorder_storage(v, row).vectorize(v);
  part.update().reorder(v, rpo, row).vectorize(v);
}

void cpu_tiled_forward(ForwardFuncs& f, const Knobs& k, const Target&) {
  const TailStrategy guard = TailStrategy::GuardWithIf;
  cpu_tile_level(f, k);
  // The online state's chunk loop (or the tile, where the partials are the one chunk's); every
  // per-chunk stage is computed inside it.
  if (!f.chunk_partials) f.st.update().reorder(f.d, f.row, f.rc.x).vectorize(f.d, k.vec, guard);
  const LoopLevel at = chunk_level(f);
  // K chunk transposed: positions innermost.
  f.kf.compute_at(at).reorder_storage(f.p, f.d).reorder(f.p, f.d).vectorize(f.p, k.vec, guard);
  f.vf.compute_at(at).vectorize(f.d, k.vec, guard);

  // Scores (vectorised over positions) and P.V (over D), each in register tiles.
  register_tiled_product(f.s, f.p, f.row, f.rd.x, at, k);
  // The chunk's mask once per edge, read as vectors by cmax and pexp.
  f.att.compute_at(at).vectorize(f.p, k.vec, guard);
  lane_reduction(f.cmax, f.rp.x, f.row, at, k.vec);
  f.pexp.compute_at(at).vectorize(f.p, k.vec, guard);
  lane_reduction(f.csum, f.rp.x, f.row, at, k.vec);
  register_tiled_product(f.cpv, f.d, f.row, f.rp.x, at, k);
}

namespace {

[[maybe_unused]] const bool registered = register_schedule(
    {"cpu_tiled", "cpu", cpu_tiled_forward, cpu_simple_combine, "",
     "per tile: K chunk staged transposed once, register-blocked Q.K^T and P.V", false, {}, cpu_axes(), nullptr,
     cpu_keep, {}, true});

}  // namespace

}  // namespace kvouter::pipeline
