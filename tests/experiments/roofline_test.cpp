// The measured roofline is a bound: no real kernel may run faster than the FMA peak the probe
// reports. A probe that keeps its accumulators in memory reports half the peak on a core with one
// vector store a cycle, and every "% of peak" of the benchmarks then reads twice too high; this
// test times Eigen's float GEMM, which runs near the peak on every x86 core, against the probe.
#include <gtest/gtest.h>

#include <Eigen/Dense>
#include <algorithm>
#include <chrono>
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

}  // namespace
}  // namespace kvouter::experiments
