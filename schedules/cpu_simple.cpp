// cpu_simple: the plain schedule. Parallel over tiles; inside a tile, the online state runs over
// the chunks and each per-chunk stage is vectorised over its innermost dimension (positions for
// scores, D for P.V). Measured 2026-12-07 (experiments/results/cpu_bench.json, run 4fccfa5;
// experiments/results/README.md), 2-core Sapphire Rapids-class Xeon: SPEC prefill JIT 745 ms =
// 0.47x direct, decode JIT 71 ms = 0.66x direct. The baseline the other schedules improve on: nothing is
// register-blocked and K is read with positions strided.
#include "schedules.h"

namespace kvouter::pipeline {

using namespace Halide;

void cpu_tile_level(ForwardFuncs& f, const Knobs& k, int row_lanes) {
  const TailStrategy guard = TailStrategy::GuardWithIf;
  f.out.compute_root().split(f.tile, f.tile, f.tile_in, k.grain, guard).parallel(f.tile).vectorize(f.ch, k.vec, guard);
  if (row_lanes > 0) {
    f.qf.compute_at(f.out, f.tile).reorder_storage(f.row, f.d).reorder(f.row, f.d).vectorize(f.row, row_lanes, guard);
  } else {
    f.qf.compute_at(f.out, f.tile).vectorize(f.d, k.vec, guard);
  }
  if (!f.chunk_partials) f.st.compute_at(f.out, f.tile).vectorize(f.d, k.vec, guard);
}

LoopLevel chunk_level(const ForwardFuncs& f) {
  // (tile_in: once per tile; `tile` is the loop over tasks of `grain` tiles.)
  return f.chunk_partials ? LoopLevel(f.out, f.tile_in) : LoopLevel(f.st, f.rc.x);
}

void cpu_simple_forward(ForwardFuncs& f, const Knobs& k, const Target&) {
  const TailStrategy guard = TailStrategy::GuardWithIf;
  cpu_tile_level(f, k);
  f.st.update().reorder(f.d, f.row, f.rc.x).vectorize(f.d, k.vec, guard);
  RVar rc = f.rc.x;
  f.kf.compute_at(f.st, rc).vectorize(f.d, k.vec, guard);
  f.vf.compute_at(f.st, rc).vectorize(f.d, k.vec, guard);
  f.s.compute_at(f.st, rc).vectorize(f.p, k.vec, guard);
  f.s.update().reorder(f.p, f.rd.x, f.row).vectorize(f.p, k.vec, guard);
  f.cmax.compute_at(f.st, rc);
  f.pexp.compute_at(f.st, rc).vectorize(f.p, k.vec, guard);
  f.csum.compute_at(f.st, rc);
  f.cpv.compute_at(f.st, rc).vectorize(f.d, k.vec, guard);
  f.cpv.update().reorder(f.d, f.rp.x, f.row).vectorize(f.d, k.vec, guard);
}

void cpu_simple_combine(CombineFuncs& f, const Knobs& k, const Target&) {
  const TailStrategy guard = TailStrategy::GuardWithIf;
  // One pass over a query's partials: per query, its statistics (max m, sum w*l) and then its
  // weighted o rows, while the rows' lines are in cache; lse in the same loop (compute_with).
  // Measured 2026-12-07 (experiments/results/cpu_bench.json, run 4fccfa5), the Xeon host, cpu_tiled
  // AOT: SPEC prefill's combine 17.1 ms, decode's 1.2 ms. (One pass against the three root passes
  // before it, Zen 4, 2026-12-02: 25.8 against 34.9 ms and 1.2 against 4.8 ms,
  // experiments/results/cpu/2026-12-02/combine.md.)
  f.out.compute_root().parallel(f.t).vectorize(f.d, k.vec, guard);
  f.lse.compute_root().parallel(f.t).compute_with(f.out, f.t);
  f.mmax.compute_at(f.out, f.t);
  f.lsum.compute_at(f.out, f.t);
  f.osum.compute_at(f.out, f.t).vectorize(f.d, k.vec, guard);
  f.osum.update().reorder(f.d, f.rk.x, f.j).vectorize(f.d, k.vec, guard);
}

const ScheduleInfo::Axes& cpu_axes() {
  static const ScheduleInfo::Axes axes{{"16", "32", "64", "128", "256"}, {"2", "4", "6", "8"}, {"2", "4"}};
  return axes;
}

bool cpu_chunk_keep(const KnobValues& k, const TuneShape& shape) {
  // A chunk past the block is the block; tiny chunks only add merge steps.
  return k.at("chunk") <= shape.block_size && k.at("chunk") >= 16;
}

bool cpu_keep(const KnobValues& k, const TuneShape& shape) {
  // Register budget of the tiled products: rows x unroll accumulators in three quarters of the
  // target's vector registers, the rest for the loads (24 of 32 with AVX-512: 6 x 4 is the fastest
  // prefill tile there, experiments/results/cpu/2026-12-07/register_tiles_xeon.md; 12 of 16 with
  // AVX2, whose tuning runs found 8 accumulators fastest, experiments/results/cpu/2026-12-06/
  // tune_*_zen3.jsonl).
  return cpu_chunk_keep(k, shape) && k.at("rows") * k.at("unroll") <= shape.vector_registers * 3 / 4;
}

namespace {

[[maybe_unused]] const bool registered = register_schedule(
    {"cpu_simple", "cpu", cpu_simple_forward, cpu_simple_combine, "",
     "plain: vectorised over the innermost dimension, parallel over tiles", false, {}, cpu_axes(), nullptr,
     // rows and unroll are not read: pinned, so that no two candidates are the same program
     [](const KnobValues& k, const TuneShape& s) { return cpu_chunk_keep(k, s) && k.at("rows") == 4 && k.at("unroll") == 4; }});

}  // namespace

}  // namespace kvouter::pipeline
