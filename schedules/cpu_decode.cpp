// cpu_decode: a tile's rows (its queries' heads of one KV head) as the vector, K and V read in
// place. Decode tiles are short and wide: one query (T = 1) and the 8 query heads of a KV head
// against a block of 64 positions of 128 channels, so cpu_tiled's staged, transposed K chunk is
// paid for by 8 rows of work. Here nothing is staged:
//   - the query rows are stored transposed once per tile (channels outer, rows inner), so that
//     S = Q . K^T vectorises over rows, each K value read once from its page and broadcast;
//   - S, the chunk's max, weights and sums run over rows as vectors; P . V vectorises over D with
//     V rows read from their pages;
//   - both products in register tiles (positions x row vectors; rows x D vectors), the reduction
//     outermost.
// The rows vector is the target's width, or the tile's rows where fewer (8 lanes for decode on
// AVX-512). Measured 2026-12-02 (experiments/results/cpu/2026-12-02/bench_cpu_decode.json, 2-core
// AMD EPYC Zen 3, AVX2): SPEC decode JIT 24.7 ms = 2.26x direct, 50 % of its roofline bound
// (cpu_tiled 29.8 ms, 41 %); bfloat16 20.7 ms; the tuner's winner for decode there. Knobs: chunk, grain, vec (the P . V vector), rows x unroll (the positions of an S
// register tile, and the P . V tile as in cpu_tiled).
#include "schedules.h"

namespace kvouter::pipeline {

using namespace Halide;

void cpu_decode_forward(ForwardFuncs& f, const Knobs& k, const Target&) {
  const TailStrategy guard = TailStrategy::GuardWithIf;
  // Lanes over rows: the vector width, at most the tile's rows where they are known.
  int lanes = k.vec;
  while (f.static_rows > 0 && lanes > 4 && lanes > f.static_rows) lanes /= 2;
  f.out.compute_root().parallel(f.tile, k.grain, guard).vectorize(f.ch, k.vec, guard);
  f.qf.compute_at(f.out, f.tile).reorder_storage(f.row, f.d).reorder(f.row, f.d).vectorize(f.row, lanes, guard);
  f.st.compute_at(f.out, f.tile).vectorize(f.d, k.vec, guard);
  f.st.update().reorder(f.d, f.row, f.rc.x).vectorize(f.d, k.vec, guard);
  RVar rc = f.rc.x;
  // K and V chunks copied as they are (rows of D, in order), with vector loads that stream.
  f.kf.compute_at(f.st, rc).vectorize(f.d, k.vec, guard);
  f.vf.compute_at(f.st, rc).vectorize(f.d, k.vec, guard);
  Knobs scores = k;
  scores.vec = lanes;
  scores.unroll = 1;
  scores.rows = k.rows * k.unroll;  // positions per register tile
  register_tiled_product(f.s, f.row, f.p, f.rd.x, f.st, rc, scores);
  f.cmax.compute_at(f.st, rc).vectorize(f.row, lanes, guard);
  f.cmax.update().reorder(f.row, f.rp.x).vectorize(f.row, lanes, guard);
  f.pexp.compute_at(f.st, rc).reorder_storage(f.row, f.p).reorder(f.row, f.p).vectorize(f.row, lanes, guard);
  f.csum.compute_at(f.st, rc).vectorize(f.row, lanes, guard);
  f.csum.update().reorder(f.row, f.rp.x).vectorize(f.row, lanes, guard);
  register_tiled_product(f.cpv, f.d, f.row, f.rp.x, f.st, rc, k);
}

namespace {

[[maybe_unused]] const bool registered = register_schedule(
    {"cpu_decode", "cpu", cpu_decode_forward, cpu_simple_combine, "",
     "per tile: rows as the vector, K and V read from their pages (nothing staged)", false, {}, cpu_axes(),
     nullptr, cpu_keep});

}  // namespace

}  // namespace kvouter::pipeline
