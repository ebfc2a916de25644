// cpu_rowstream: a different loop order and reuse pattern. The K/V chunk is staged once per tile
// and chunk, then the tile's rows stream through it in blocks of `rows`: each row block computes
// its scores, softmax weights and P.V back to back, so the score matrix of the whole tile is
// never materialised (flash-attention's row streaming, inside a KV-outer tile).
// Measured 2026-12-07 (experiments/results/cpu_bench.json, run 4fccfa5; experiments/results/
// README.md), 2-core Sapphire Rapids-class Xeon: SPEC prefill JIT 248 ms = 1.41x direct, decode
// JIT 42.5 ms = 1.10x direct. Slower than cpu_tiled: the P.V register tile is only `rows` rows high, so V is
// reloaded per row block.
#include "schedules.h"

namespace kvouter::pipeline {

using namespace Halide;

void cpu_rowstream_forward(ForwardFuncs& f, const Knobs& k, const Target&) {
  const TailStrategy guard = TailStrategy::GuardWithIf;
  Var ro("ro"), ri("ri"), pu("pu"), pv("pv");
  cpu_tile_level(f, k);
  // Chunk loop outermost, then row blocks: each row block runs scores, weights and P.V back to back.
  f.st.update()
      .split(f.row, ro, ri, k.rows, TailStrategy::GuardWithIf)
      .reorder(f.d, ri, ro, f.rc.x)
      .vectorize(f.d, k.vec, guard);
  RVar rc = f.rc.x;
  f.kf.compute_at(f.st, rc).reorder_storage(f.p, f.d).reorder(f.p, f.d).vectorize(f.p, k.vec, guard);
  f.vf.compute_at(f.st, rc).vectorize(f.d, k.vec, guard);
  f.s.compute_at(f.st, ro).vectorize(f.p, k.vec, guard).unroll(f.row);
  f.s.update().split(f.p, pu, pv, k.vec, guard).reorder(pv, pu, f.row, f.rd.x).vectorize(pv).unroll(f.row);
  f.cmax.compute_at(f.st, ro);
  f.pexp.compute_at(f.st, ro).vectorize(f.p, k.vec, guard);
  f.csum.compute_at(f.st, ro);
  f.cpv.compute_at(f.st, ro).vectorize(f.d, k.vec, guard).unroll(f.row);
  f.cpv.update().split(f.d, pu, pv, k.vec, guard).reorder(pv, pu, f.row, f.rp.x).vectorize(pv).unroll(f.row);
}

namespace {

[[maybe_unused]] const bool registered = register_schedule(
    {"cpu_rowstream", "cpu", cpu_rowstream_forward, cpu_simple_combine, "",
     "per tile: K/V chunk staged once, rows streamed in register blocks (scores never stored)", false, {},
     cpu_axes(), nullptr,
     // unroll is not read: pinned. Its row blocks are unrolled: at most a quarter of the vector
     // registers in rows (4 with AVX2, 8 with AVX-512).
     [](const KnobValues& k, const TuneShape& s) {
       return cpu_chunk_keep(k, s) && k.at("unroll") == 4 && k.at("rows") <= s.vector_registers / 4;
     }});

}  // namespace

}  // namespace kvouter::pipeline
