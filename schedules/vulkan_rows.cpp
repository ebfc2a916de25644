// vulkan_rows: the stages of vulkan_tiled.cpp with a different work split. Each tile spreads over
// workgroups of one edge's rows (its qhead query heads, which share one KV head), where
// vulkan_tiled gives each GEMM stage one workgroup per tile: T-fold more, smaller workgroups,
// each reading the tile's K/V itself (through the caches). On decode plans (T = 1) the two
// coincide. Same knobs as vulkan_tiled.
// Measured (H200, AOT host-vulkan, docs/vulkan.md): gpu-decode 34.0 ms = 0.7 % of HBM bandwidth
// (target 60 %: not met; same as vulkan_tiled, T = 1); gpu-prefill not measured (it did not
// finish inside the run's time limit).
#include <algorithm>

#include "schedules.h"

namespace kvouter::pipeline {

void vulkan_rows_forward(ForwardFuncs& f, const Knobs& k, const Halide::Target&) {
  if (vulkan_generic_forward(f, k)) return;
  vulkan_require_static(f, "vulkan_rows", true);
  vulkan_gemm_forward(f, k, std::max(1, f.static_rows / std::max(1, f.static_T)));
}

namespace {

[[maybe_unused]] const bool registered = register_schedule(
    {"vulkan_rows", "vulkan", vulkan_rows_forward, vulkan_combine, "",
     "vulkan_tiled's stages with workgroups of one edge's rows (qhead) each", true, {}, vulkan_gemm_axes(),
     nullptr, vulkan_gemm_keep});

}  // namespace

}  // namespace kvouter::pipeline
