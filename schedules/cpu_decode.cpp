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
//   - S, the chunk's max, weights and sums run over rows as vectors (S over rows and channel
//     pairs where the rows fill half a vector); P . V vectorises over D;
//   - both products in register tiles (positions x a row vector; rows x D vectors), the
//     reduction outermost; with V in place, the P . V positions split by page, so that a page's
//     address is computed once per page (6-10 % off the kernel in cache on a Zen 3 host,
//     2026-12-06, experiments/results/cpu/2026-12-06/decode_page_split_zen3.md).
// The row vector is the target's width, halved down to 4 lanes while it exceeds the tile's rows
// where they are known (8 lanes for decode on AVX-512). Where that fills at most half the target's
// vector, the scores sum the even and odd channels in the vector's two halves (paired_scores):
// half the FMAs; with the pages in cache 10-20 % off the kernel on the Xeon host below, from DRAM
// within its noise. Knobs: chunk, grain, vec (the P . V vector), rows x unroll (the positions of
// an S register tile, and the P . V tile as in cpu_tiled), ahead. The defaults (ahead 1, rows 4 x
// unroll 2; the AOT lines' too) are the tuning database's decode winner on the Zen 4 host; on the
// Xeon host the database's entry (experiments/results/cpu/2026-12-07/tune_decode_xeon.jsonl,
// 22.1 ms there) is T 1 and rows 4 x unroll 4, 1-4 % faster than these defaults in alternating runs
// (experiments/results/cpu/2026-12-06/cli_huge_pages_xeon.md).
// Measured, SPEC decode, forward + combine (where the time goes:
// experiments/results/cpu/2026-12-06/where_the_time_goes_xeon.md):
//   - 2-core Sapphire Rapids-class Xeon (AVX-512), 2026-12-07, kvouter_bench, the partials stored
//     straight from the chunk, per tile (experiments/results/cpu/2026-12-07/
//     cpu_bench_decode_per_tile.json): AOT 25.3 ms, JIT 26.0 ms, 43-45 % of the roofline bound at
//     that run's 24.0 GB/s, 2.0-2.1x direct; earlier that day (experiments/results/cpu_bench.json,
//     run 6f563d5) JIT 22.4 ms, 46-47 % of the bound at 25.5 GB/s; 16 bits
//     (experiments/results/cpu/2026-12-07/dtype_bench_xeon_chunk_partials.json): float16
//     1.28-1.30x and bfloat16 1.17-1.20x faster than float32;
//   - the same host kind, 2026-12-06, kvouter_bench
//     (experiments/results/cpu/2026-12-06/dtype_bench_xeon_paired.json): JIT rows 8 x unroll 2
//     20.8 ms, AOT 20.5 ms, 45 % of the roofline bound at 29.2 GB/s, 2.0x
//     direct; float16 1.39-1.41x and bfloat16 1.37x faster than float32;
//   - 2-core Zen 3 (AVX2: no channel pairs), 2026-12-06 (dtype_bench_zen3.json there): AOT
//     28.7 ms, 31 % of the roofline bound at 30.6 GB/s, 1.8x direct; float16 1.47x, bfloat16 1.29x;
//   - 2-core Zen 4 (AVX-512), 2026-12-05, before the page split and the channel pairs
//     (experiments/results/cpu/2026-12-05/decode_query_rows_zen4.md): JIT 17.3-19.5 ms, AOT
//     17.5-17.8 ms, 2.6-2.8x direct, 1.5-1.6x the chunks copied (ahead 0).
#include <algorithm>

#include "schedules.h"

namespace kvouter::pipeline {

using namespace Halide;

namespace {

// The scores where the rows fill at most half a vector (8 rows on AVX-512): the channels' sum
// split into its even and odd channels (rfactor), whose two partial sums are the vector's two
// halves, lane = channel parity + 2 x row. A register tile's FMA then takes a channel pair of a
// position's K row as one 64-bit broadcast and the query rows' pair of channels as one vector:
// half the FMAs of 8-lane vectors over the rows alone. The halves are added once per tile.
void paired_scores(ForwardFuncs& f, int lanes, int positions, const LoopLevel& at) {
  Var v("v"), vr("vr");
  RVar rdo("rdo"), rdi("rdi");
  Func wrapper = register_tile(f.s, f.row, f.p, at, lanes, lanes, positions);
  Func pairs = f.s.update().split(f.rd.x, rdo, rdi, 2).rfactor(rdi, v);
  f.s.update().reorder(f.row, rdi, f.p).vectorize(f.row, lanes).unroll(rdi).unroll(f.p);
  pairs.compute_at(wrapper, Var("co")).reorder_storage(v, f.row, f.p);
  pairs.reorder(v, f.row, f.p).fuse(v, f.row, vr).vectorize(vr, 2 * lanes).unroll(f.p);
  pairs.update().reorder(v, f.row, f.p, rdo).fuse(v, f.row, vr).vectorize(vr, 2 * lanes).unroll(f.p);
}

}  // namespace

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
  if (!f.chunk_partials) f.st.update().reorder(f.d, f.row, f.rc.x).vectorize(f.d, k.vec, guard);
  const LoopLevel at = chunk_level(f);
  // K and V chunks copied as they are (rows of D, in order), with vector loads that stream; or,
  // with ahead, read in place from their pages, which the tile `ahead` before requested into the
  // L2. V in place only where the P . V register tile divides D: its tiles past D would read past
  // the page row (a copy computes only the channels there are).
  // K in place only as float32: a 16-bit K value would be widened at each of its broadcasts (once
  // per tile in the copy).
  const bool k_in_place = k.ahead > 0 && f.storage == Float(32);
  const bool v_in_place = k.ahead > 0 && f.static_D > 0 && f.static_D % (k.vec * k.unroll) == 0;
  if (!k_in_place) f.kf.compute_at(at).vectorize(f.d, k.vec, guard);
  if (!v_in_place) f.vf.compute_at(at).vectorize(f.d, k.vec, guard);
  const int positions = k.rows * k.unroll;  // per score register tile
  if (2 * lanes <= k.vec && f.static_D > 0 && f.static_D % 2 == 0) {
    paired_scores(f, lanes, positions, at);
  } else {
    Knobs scores = k;
    scores.vec = lanes;
    scores.unroll = 1;
    scores.rows = positions;
    register_tiled_product(f.s, f.row, f.p, f.rd.x, at, scores);
  }
  // The requests for a later tile's rows: those of the score tile's positions, once per score
  // tile (not per row), spread through the products.
  if (k.ahead > 0) f.pf.compute_at(f.s.in(), Var("co"));
  f.att.compute_at(at).vectorize(f.p, k.vec, guard);
  f.cmax.compute_at(at).vectorize(f.row, lanes, guard);
  f.cmax.update().reorder(f.row, f.rp.x).vectorize(f.row, lanes, guard);
  f.pexp.compute_at(at).reorder_storage(f.row, f.p).reorder(f.row, f.p).vectorize(f.row, lanes, guard);
  f.csum.compute_at(at).vectorize(f.row, lanes, guard);
  f.csum.update().reorder(f.row, f.rp.x).vectorize(f.row, lanes, guard);
  register_tiled_product(f.cpv, f.d, f.row, f.rp.x, at, k);
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
     {{"ahead", "1"}, {"rows", "4"}, {"unroll", "2"}}, cpu_axes(), nullptr, cpu_keep, {"0", "1", "2"}, true});

}  // namespace

}  // namespace kvouter::pipeline
