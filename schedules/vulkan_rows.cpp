// vulkan_rows: a different work split from vulkan_tiled. One workgroup per (edge, tile): the qhead
// rows of one query edge (its query heads sharing one KV head), so a tile spreads over T
// workgroups. Each stages the K/V chunk in shared memory for its own rows: K/V reuse drops from
// T x qhead rows to qhead (the GQA group; T-fold more K/V reads, mostly from L2), in exchange for
// T-fold more, smaller workgroups and fewer registers per thread. On decode plans (T = 1) the two
// schedules coincide. Same knobs as vulkan_tiled.
// Measured figure: README.md's GPU table (H200, host-vulkan).
#include "schedules.h"

namespace kvouter::pipeline {

void vulkan_rows_forward(ForwardFuncs& f, const Knobs& k, const Halide::Target&) {
  vulkan_require_static(f, "vulkan_rows");
  vulkan_workgroup_forward(f, k, std::max(1, f.static_rows / std::max(1, f.static_T)));
}

}  // namespace kvouter::pipeline
