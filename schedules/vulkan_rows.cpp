// vulkan_rows: the stages of vulkan_tiled.cpp with a different work split. Each tile spreads over
// workgroups of one edge's rows (its qhead query heads, which share one KV head), where
// vulkan_tiled gives each GEMM stage one workgroup per tile: T-fold more, smaller workgroups,
// each reading the tile's K/V itself (through the caches). On decode plans (T = 1) the two
// coincide. Same knobs as vulkan_tiled.
// Measured 2026-12-02 (H200, AOT host-vulkan, SPIR-V stage on, kernel medians of 3 after 0.5 s of
// warm-up; experiments/results/gpu/2026-12-02/gpu_bench_fused_rows.json): gpu-decode 2.61 ms =
// 8.6 % of HBM bandwidth (at T = 1 it is vulkan_tiled's program), gpu-prefill 310 ms = 9.9 % of
// FP32 peak, as vulkan_tiled (311 ms, the H200's tuning-database default). No CUDA variant.
#include <algorithm>

#include "schedules.h"

namespace kvouter::pipeline {

void vulkan_rows_forward(ForwardFuncs& f, const Knobs& k, const Halide::Target&) {
  if (vulkan_generic_forward(f, k)) return;
  vulkan_require_static(f, "vulkan_rows");
  vulkan_gemm_forward(f, k, std::max(1, f.static_rows / std::max(1, f.static_T)));
}

namespace {

[[maybe_unused]] const bool registered = register_schedule(
    {"vulkan_rows", "vulkan", vulkan_rows_forward, vulkan_combine, "",
     "vulkan_tiled's stages with workgroups of one edge's rows (qhead) each", true, {}, vulkan_gemm_axes(),
     nullptr, vulkan_gemm_keep});

}  // namespace

}  // namespace kvouter::pipeline
