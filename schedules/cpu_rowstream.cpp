// cpu_rowstream: a different loop order and reuse pattern. The K/V chunk is staged once per tile
// and chunk, then the tile's rows stream through it in blocks of `rows`: each row block computes
// its scores, softmax weights and P.V back to back, so the score matrix of the whole tile is
// never materialised (flash-attention's row streaming, inside a KV-outer tile).
// Measured figure: see the schedule table in README.md (this machine, target host).
#include "schedules.h"

namespace kvouter::pipeline {

using namespace Halide;

void cpu_rowstream_forward(ForwardFuncs& f, const Knobs& k, const Target&) {
  const TailStrategy guard = TailStrategy::GuardWithIf;
  Var ro("ro"), ri("ri"), pu("pu"), pv("pv");
  f.out.compute_root().parallel(f.tile, k.grain, guard).vectorize(f.ch, k.vec, guard);
  f.qf.compute_at(f.out, f.tile).vectorize(f.d, k.vec, guard);
  // Chunk loop outermost, then row blocks: each row block runs scores, weights and P.V back to back.
  f.st.compute_at(f.out, f.tile).vectorize(f.d, k.vec, guard);
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

}  // namespace kvouter::pipeline
