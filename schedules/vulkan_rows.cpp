// vulkan_rows: a different work split. A workgroup serves gpu_rows rows of one tile (so a tile
// spreads over several workgroups), one thread per (row, channel group); every thread computes
// its rows' scores for the chunk itself (no shared staging: K and V come through the cache),
// trading the tile-wide reuse of vulkan_tiled for more, smaller workgroups and no barriers.
// Measured figure: README.md's GPU table (H200, host-vulkan).
#include "schedules.h"

namespace kvouter::pipeline {

using namespace Halide;


void vulkan_rows_forward(ForwardFuncs& f, const Knobs& k, const Target&) {
  vulkan_require_static(f, "vulkan_rows");
  const TailStrategy guard = TailStrategy::GuardWithIf;
  Var cho("cho"), chi("chi"), ro("ro"), ri("ri");
  const int CH = 8;
  // Workgroups over (row group, tile); thread (cho, ri) owns CH channels of one row and does all
  // of that row's work itself (its scores are recomputed by each of the row's channel groups).
  f.out.compute_root()
      .split(f.ch, cho, chi, CH, guard)
      .split(f.row, ro, ri, k.rows, guard)
      .reorder(chi, cho, ri, ro, f.tile)
      .gpu_blocks(ro, f.tile)
      .gpu_threads(cho, ri)
      .unroll(chi);
  f.st.compute_at(f.out, cho).store_in(MemoryType::Register).unroll(f.ch);
  f.st.update().reorder(f.ch, f.row, f.rc.x).unroll(f.ch);
  RVar rc = f.rc.x;
  f.s.compute_at(f.st, rc);
  f.cmax.compute_at(f.st, rc);
  f.pexp.compute_at(f.st, rc);
  f.csum.compute_at(f.st, rc);
  f.cpv.compute_at(f.st, f.ch);
}

}  // namespace kvouter::pipeline
