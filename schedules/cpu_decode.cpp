// cpu_decode: a tile's rows (its queries' heads of one KV head) as the vector. Decode tiles are
// short and wide: one query (T = 1) and the 8 query heads of a KV head against a block of 64
// positions of 128 channels, so cpu_tiled's transposed K chunk is paid for by 8 rows of work. Here:
//   - the query rows are stored transposed once per tile (channels outer, rows inner), so that
//     S = Q . K^T vectorises over rows, each K value broadcast;
//   - the K and V chunks are copied as they lie (rows of D, streaming vector loads; read in place
//     from their pages, K's strided streams were slower from DRAM);
//   - S, the chunk's max, weights and sums run over rows as vectors; P . V vectorises over D;
//   - both products in register tiles (positions x a row vector; rows x D vectors), the
//     reduction outermost.
// The row vector is the target's width, halved down to 4 lanes while it exceeds the tile's rows
// where they are known (8 lanes for decode on AVX-512). Knobs: chunk, grain, vec (the P . V
// vector), rows x unroll (the positions of an S register tile, and the P . V tile as in cpu_tiled).
// Measured 2026-12-04 (experiments/results/cpu_bench.json, the build of 029c53a; experiments/
// results/README.md), 2-core AMD EPYC Zen 3, AVX2, 28.9 GB/s: SPEC decode JIT and AOT 22.2 ms =
// 2.5x direct, 42 % of its roofline bound (its K/V reads); the K and V chunk copies take about
// 58 % of the forward, the products 31 % (experiments/results/cpu/2026-12-04/forward_overheads.md
// method). bfloat16 1.2x and float16 1.2-1.4x faster (cpu/2026-12-04/dtype_bench.json). The
// tuner's decode winner here.
#include "schedules.h"

namespace kvouter::pipeline {

using namespace Halide;

void cpu_decode_forward(ForwardFuncs& f, const Knobs& k, const Target&) {
  const TailStrategy guard = TailStrategy::GuardWithIf;
  // Lanes over rows: the vector width, at most the tile's rows where they are known.
  int lanes = k.vec;
  while (f.static_rows > 0 && lanes > 4 && lanes > f.static_rows) lanes /= 2;
  cpu_tile_level(f, k, lanes);
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
  f.att.compute_at(f.st, rc).vectorize(f.p, k.vec, guard);
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
     "per tile: rows as the vector, K and V chunks copied as they lie (no transposed staging)", false, {}, cpu_axes(),
     nullptr, cpu_keep});

}  // namespace

}  // namespace kvouter::pipeline
