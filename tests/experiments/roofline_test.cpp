// The measured roofline is a bound: no real kernel may run faster than the FMA peak the probe
// reports. A probe that keeps its accumulators in memory reports half the peak on a core with one
// vector store a cycle, and every "% of peak" of the benchmarks then reads twice too high; this
// test times Eigen's float GEMM, which runs near the peak on every x86 core, against the probe.
#include <gtest/gtest.h>

#include <Eigen/Dense>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>

#include "roofline.h"

namespace kvouter::experiments {
namespace {

double gemm_gflops(int n, int reps) {
  Eigen::MatrixXf a = Eigen::MatrixXf::Random(n, n), b = Eigen::MatrixXf::Random(n, n), c(n, n);
  c.noalias() = a * b;  // warm
  const auto t0 = std::chrono::steady_clock::now();
  for (int r = 0; r < reps; ++r) {
    c.noalias() = a * b;
    a(0, 0) += c(n - 1, n - 1) * 1e-30f;  // each product depends on the last
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return 2.0 * n * n * static_cast<double>(n) * reps / s / 1e9;
}

TEST(Roofline, FmaPeakBoundsAFloatGemm) {
#if !defined(__OPTIMIZE__) || defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "timed against an optimised GEMM: meaningful only in an optimised, uninstrumented build";
#endif
  // Rounds alternate the two, and each side keeps its best round: another process that takes a
  // core during one round cannot make the bound look broken (the test also runs alone).
  double peak = 0, gemm = 0;
  for (int round = 0; round < 4; ++round) {
    peak = std::max(peak, measure_roofline(0.2).fma_gflops);
    gemm = std::max(gemm, gemm_gflops(512, 8));
  }
  std::printf("probe %.1f GFLOP/s, Eigen GEMM 512^3 %.1f GFLOP/s (%.0f %% of the probe)\n", peak, gemm,
              100 * gemm / peak);
  EXPECT_LE(gemm, 1.05 * peak) << "the FMA probe reports less than a real kernel reaches";
}

// The paged-read probe (`kvouter roofline --paged`), with and without the L2 requests of its
// --ahead: every chunk read and timed, a finite rate below what any memory reaches (a probe that
// skipped its reads or mis-counted its bytes would report far more).
TEST(Roofline, PagedReadsMeasureARate) {
  for (const int ahead : {0, 1, 3}) {
    const double gbps = paged_read_gbps(8 << 10, size_t{64} << 20, 3, ahead);
    std::printf("8 KiB chunks of a 64 MiB pool, ahead %d: %.1f GB/s\n", ahead, gbps);
    EXPECT_TRUE(std::isfinite(gbps)) << ahead;
    EXPECT_GT(gbps, 0.0) << ahead;
    EXPECT_LT(gbps, 5000.0) << ahead;
  }
}

}  // namespace
}  // namespace kvouter::experiments
