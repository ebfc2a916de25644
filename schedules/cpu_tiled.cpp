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

namespace {

// A small matrix product `product(col, row) += ...` over reduction `red`, computed per chunk at
// (at, at_var) in register tiles of (unroll x vec) columns by `rows` rows: a wrapper stores the
// chunk's result, and the product itself is computed per register tile with the reduction loop
// outermost, so its accumulators stay in registers.
void register_tiled_product(Func product, Var col, Var row, RVar red, Func at, RVar at_var, const Knobs& k) {
  Var co("co"), ci("ci"), ro("ro"), ri("ri"), cu("cu"), cv("cv");
  Func wrapper = product.in();
  wrapper.compute_at(at, at_var)
      .tile(col, row, co, ro, ci, ri, k.vec * k.unroll, k.rows, TailStrategy::GuardWithIf)
      .vectorize(ci, k.vec)
      .unroll(ri);
  product.compute_at(wrapper, co).vectorize(col, k.vec).unroll(col).unroll(row);
  product.update().split(col, cu, cv, k.vec).reorder(cv, cu, row, red).vectorize(cv).unroll(cu).unroll(row);
}

}  // namespace

void cpu_tiled_forward(ForwardFuncs& f, const Knobs& k, const Target&) {
  const TailStrategy guard = TailStrategy::GuardWithIf;
  cpu_tile_level(f, k);
  // The online state's chunk loop; every per-chunk stage is computed inside it.
  f.st.update().reorder(f.d, f.row, f.rc.x).vectorize(f.d, k.vec, guard);
  RVar rc = f.rc.x;
  // K chunk transposed: positions innermost.
  f.kf.compute_at(f.st, rc).reorder_storage(f.p, f.d).reorder(f.p, f.d).vectorize(f.p, k.vec, guard);
  f.vf.compute_at(f.st, rc).vectorize(f.d, k.vec, guard);

  // Scores (vectorised over positions) and P.V (over D), each in register tiles.
  register_tiled_product(f.s, f.p, f.row, f.rd.x, f.st, rc, k);
  f.cmax.compute_at(f.st, rc);
  f.pexp.compute_at(f.st, rc).vectorize(f.p, k.vec, guard);
  f.csum.compute_at(f.st, rc);
  register_tiled_product(f.cpv, f.d, f.row, f.rp.x, f.st, rc, k);
}

}  // namespace kvouter::pipeline
