// cpu_decode: a tile's rows (its queries' heads of one KV head) as the vector. Decode tiles are
// short and wide: one query (T = 1) and the 8 query heads of a KV head against a block of 64
// positions of 128 channels, so cpu_tiled's transposed K chunk is paid for by 8 rows of work. Here:
//   - the query rows are stored transposed (channels outer, rows inner) once per query and KV head,
//     before the tiles (qt), so that S = Q . K^T vectorises over rows, each K value broadcast,
//     and a tile's rows are dense loads of them;
//   - with ahead > 0 (the default, 1) K and V are read in place from their pages (K in float32
//     only: a 16-bit K is widened once per tile in a copy, not at each broadcast; V where the
//     P . V register tile divides D), and each score register tile requests the same positions'
//     K and V rows of the tile `ahead` on into the L2 (kvouter_prefetch_l2, an extern: Halide's
//     own prefetch is prefetchnta, which did not help); a task then runs at least 16 consecutive tiles, so that the requested tile is
//     mostly the same worker's. With ahead = 0 the K and V chunks are copied as they lie per tile
//     (rows of D, streaming loads: from DRAM, in place was slower without the requests);
//   - S, the chunk's max, weights and sums run over rows as vectors; P . V vectorises over D;
//   - both products in register tiles (positions x a row vector; rows x D vectors), the
//     reduction outermost; with V in place, the P . V positions split by page, so that a page's
//     address is computed once per page (6-10 % off the kernel in cache on a Zen 3 host,
//     2026-12-06, experiments/results/cpu/2026-12-06/decode_page_split_zen3.md).
// The row vector is the target's width, halved down to 4 lanes while it exceeds the tile's rows
// where they are known (8 lanes for decode on AVX-512). Knobs: chunk, grain, vec (the P . V
// vector), rows x unroll (the positions of an S register tile, and the P . V tile as in cpu_tiled),
// ahead.
// Measured 2026-12-05 on a 2-core AMD EPYC Zen 4 (AVX-512), SPEC decode, forward + combine,
// medians of three sweep runs (experiments/results/cpu/2026-12-05/decode_query_rows_zen4.md and
// .jsonl): the default (ahead 1, rows 4 x unroll 2) JIT 17.3-19.5 ms, AOT 17.5-17.8 ms, 47-48 % of
// the paged-read bound with requests (33-36 % of the sweep's sequential-read bound); 1.5-1.6x the
// chunks copied (ahead 0), 2.6-2.8x direct. float16 and bfloat16 1.0-1.1x faster than float32.
// The tuning database's decode default on that host, and this schedule's default knobs (its
// AOT lines' too): with the register tile sized to the target instead (rows 4 x unroll 4 on
// AVX-512) the JIT took 20.3 ms where AOT took 15.8 in one kvouter_bench run
// (experiments/results/cpu/2026-12-05/cpu_bench_tile_sized.json). On a 2-core Sapphire
// Rapids-class Xeon (2026-12-05, experiments/results/cpu_bench.json, the build of 73fef40): JIT
// 21.9 ms, AOT 22.4 ms, 41-42 % of the roofline bound at 29.6 GB/s, 61-62 % of the paged-read
// bound, 1.9x direct. Those figures are from before the page split. With it, on the same Xeon
// kind (2026-12-06, experiments/results/cpu/2026-12-06/dtype_bench_xeon.json; where the time
// goes: where_the_time_goes_xeon.md there): JIT 23.4 ms, AOT 22.8 ms, 45-47 % of the roofline
// bound at 25.5 GB/s, 2.0x direct; float16 1.37-1.39x and bfloat16 1.27-1.33x faster than
// float32. On a 2-core Zen 3 (AVX2; 2026-12-06, dtype_bench_zen3.json there): the default
// variant AOT 28.7 ms, 31 % of the roofline bound at 30.6 GB/s, 1.8x direct; float16 1.47x and
// bfloat16 1.29x faster than float32.
#include <algorithm>

#include "schedules.h"

namespace kvouter::pipeline {

using namespace Halide;

void cpu_decode_forward(ForwardFuncs& f, const Knobs& k, const Target&) {
  const TailStrategy guard = TailStrategy::GuardWithIf;
  // Lanes over rows: the vector width, at most the tile's rows where they are known.
  int lanes = k.vec;
  while (f.static_rows > 0 && lanes > 4 && lanes > f.static_rows) lanes /= 2;
  // Rows requested `ahead` tiles on help only the worker that computes that tile: with ahead, a
  // task runs at least 16 consecutive tiles.
  Knobs tk = k;
  if (k.ahead > 0) tk.grain = std::max(k.grain, 16);
  cpu_tile_level(f, tk, lanes);
  // The query rows transposed once per query and KV head, before the tiles: a tile's rows (one
  // query's heads of a KV head, where the rows are known) are then dense vector loads, not the
  // gather of every tile of the query.
  f.qt.compute_root().parallel(f.t).vectorize(f.lane, lanes, guard);
  f.st.update().reorder(f.d, f.row, f.rc.x).vectorize(f.d, k.vec, guard);
  RVar rc = f.rc.x;
  // K and V chunks copied as they are (rows of D, in order), with vector loads that stream; or,
  // with ahead, read in place from their pages, which the tile `ahead` before requested into the
  // L2. V in place only where the P . V register tile divides D: its tiles past D would read past
  // the page row (a copy computes only the channels there are).
  // K in place only as float32: a 16-bit K value would be widened at each of its broadcasts (once
  // per tile in the copy).
  const bool k_in_place = k.ahead > 0 && f.storage == Float(32);
  const bool v_in_place = k.ahead > 0 && f.static_D > 0 && f.static_D % (k.vec * k.unroll) == 0;
  if (!k_in_place) f.kf.compute_at(f.st, rc).vectorize(f.d, k.vec, guard);
  if (!v_in_place) f.vf.compute_at(f.st, rc).vectorize(f.d, k.vec, guard);
  Knobs scores = k;
  scores.vec = lanes;
  scores.unroll = 1;
  scores.rows = k.rows * k.unroll;  // positions per register tile
  register_tiled_product(f.s, f.row, f.p, f.rd.x, f.st, rc, scores);
  // The requests for a later tile's rows: those of the score tile's positions, once per score
  // tile (not per row), spread through the products.
  if (k.ahead > 0) f.pf.compute_at(f.s.in(), Var("co"));
  f.att.compute_at(f.st, rc).vectorize(f.p, k.vec, guard);
  f.cmax.compute_at(f.st, rc).vectorize(f.row, lanes, guard);
  f.cmax.update().reorder(f.row, f.rp.x).vectorize(f.row, lanes, guard);
  f.pexp.compute_at(f.st, rc).reorder_storage(f.row, f.p).reorder(f.row, f.p).vectorize(f.row, lanes, guard);
  f.csum.compute_at(f.st, rc).vectorize(f.row, lanes, guard);
  f.csum.update().reorder(f.row, f.rp.x).vectorize(f.row, lanes, guard);
  register_tiled_product(f.cpv, f.d, f.row, f.rp.x, f.st, rc, k);
  // V in place: the positions of a P . V register tile's reduction split by page, so that a
  // page's address is looked up once per page, not once per position.
  if (v_in_place && f.static_page > 0 && f.static_C % f.static_page == 0) {
    RVar rpo("rpo"), rpi("rpi");
    f.cpv.update().split(f.rp.x, rpo, rpi, f.static_page);
  }
}

namespace {

[[maybe_unused]] const bool registered = register_schedule(
    {"cpu_decode", "cpu", cpu_decode_forward, cpu_simple_combine, "",
     "per tile: rows as the vector, K and V read in place, requested into the L2 a tile ahead", false,
     {{"ahead", "1"}, {"rows", "4"}, {"unroll", "2"}}, cpu_axes(), nullptr, cpu_keep, {"0", "1", "2"}});

}  // namespace

}  // namespace kvouter::pipeline
