// cpu_tiled: the tile as two small matrix products per chunk, register-blocked.
//   - parallel over tiles (knob grain);
//   - per chunk, the K chunk is staged once, transposed (positions innermost), so that
//     S = Q_tile . K_chunk^T vectorises over positions; V is staged as is, so that
//     O += P . V_chunk vectorises over D;
//   - both products run in register tiles of (unroll x vec) columns by `rows` rows, with the
//     reduction loop outermost (the shape of Halide's linear_algebra matmul), so the
//     accumulators stay in registers.
// Shape chosen after the prototype: 64 positions x 4 rows per register tile with the D
// reduction outermost. Measured: experiments/results/cpu_bench.json (run 1eb99d3) on a 2-core Xeon
// (AVX-512, one 512-bit FMA port; peak measured in the run 112 GFLOP/s FP32, 23.5 GB/s), target
// x86-64-linux-avx-avx2-avx512-avx512_cannonlake-avx512_sapphirerapids-avx512_skylake-avxvnni-f16c-fma-sse41
// prefill AOT 161 ms = 78.5 GFLOP/s = 70 % of peak, 3.2x direct (JIT 169 ms, 67 %); the target
// was >= 65 % and >= 3x. Decode (T = 1) 42.6 ms JIT = 27 % of the roofline bound (target 60 %):
// the transposed K staging gathers 64 x 128 floats per unit for only 8 rows of work.
#include "schedules.h"

namespace kvouter::pipeline {

using namespace Halide;

void cpu_tiled_forward(ForwardFuncs& f, const Knobs& k, const Target&) {
  const TailStrategy guard = TailStrategy::GuardWithIf;
  Var po("po"), pi("pi"), ro("ro"), ri("ri"), pu("pu"), pv("pv"), dO("dO"), di("di");
  f.out.compute_root().parallel(f.tile, k.grain, guard).vectorize(f.ch, k.vec, guard);
  f.qf.compute_at(f.out, f.tile).vectorize(f.d, k.vec, guard);
  // The online state of the tile's rows; every per-chunk stage is computed inside its chunk loop.
  f.st.compute_at(f.out, f.tile).vectorize(f.d, k.vec, guard);
  f.st.update().reorder(f.d, f.row, f.rc.x).vectorize(f.d, k.vec, guard);
  RVar rc = f.rc.x;
  // K chunk transposed: positions innermost.
  f.kf.compute_at(f.st, rc).reorder_storage(f.p, f.d).reorder(f.p, f.d).vectorize(f.p, k.vec, guard);
  f.vf.compute_at(f.st, rc).vectorize(f.d, k.vec, guard);

  // Scores: register tiles of (unroll*vec positions) x rows.
  const int pw = k.vec * k.unroll;
  Func sw = f.s.in();
  sw.compute_at(f.st, rc)
      .tile(f.p, f.row, po, ro, pi, ri, pw, k.rows, TailStrategy::GuardWithIf)
      .vectorize(pi, k.vec)
      .unroll(ri);
  f.s.compute_at(sw, po).vectorize(f.p, k.vec).unroll(f.p).unroll(f.row);
  f.s.update()
      .split(f.p, pu, pv, k.vec)
      .reorder(pv, pu, f.row, f.rd.x)
      .vectorize(pv)
      .unroll(pu)
      .unroll(f.row);
  f.cmax.compute_at(f.st, rc);
  f.pexp.compute_at(f.st, rc).vectorize(f.p, k.vec, guard);
  f.csum.compute_at(f.st, rc);

  // P.V: register tiles of (unroll*vec of D) x rows.
  Func cw = f.cpv.in();
  cw.compute_at(f.st, rc)
      .tile(f.d, f.row, dO, ro, di, ri, pw, k.rows, TailStrategy::GuardWithIf)
      .vectorize(di, k.vec)
      .unroll(ri);
  f.cpv.compute_at(cw, dO).vectorize(f.d, k.vec).unroll(f.d).unroll(f.row);
  f.cpv.update()
      .split(f.d, pu, pv, k.vec)
      .reorder(pv, pu, f.row, f.rp.x)
      .vectorize(pv)
      .unroll(pu)
      .unroll(f.row);
}

}  // namespace kvouter::pipeline
