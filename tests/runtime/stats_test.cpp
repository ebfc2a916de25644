// The one median and quantile every timing reports.
#include <gtest/gtest.h>

#include "kvouter/stats.h"

namespace kvouter {
namespace {

TEST(Stats, MedianOfOddAndEvenCounts) {
  EXPECT_EQ(median({}), 0.0);
  EXPECT_EQ(median({7}), 7.0);
  EXPECT_EQ(median({3, 1, 2}), 2.0);
  EXPECT_EQ(median({4, 1, 3, 2}), 2.5);  // the mean of the two middle values
  EXPECT_EQ(median({5, 5, 1, 9}), 5.0);
}

TEST(Stats, QuantileInterpolatesBetweenOrderStatistics) {
  const std::vector<double> v = {10, 0, 30, 20};  // sorted 0 10 20 30
  EXPECT_EQ(quantile(v, 0.0), 0.0);
  EXPECT_EQ(quantile(v, 1.0), 30.0);
  EXPECT_EQ(quantile(v, 0.5), median(v));
  EXPECT_DOUBLE_EQ(quantile(v, 0.1), 3.0);  // 0.3 of the way from 0 to 10
  EXPECT_DOUBLE_EQ(quantile(v, 0.9), 27.0);
  EXPECT_EQ(quantile(v, -1.0), 0.0);  // clamped to [0, 1]
  EXPECT_EQ(quantile(v, 2.0), 30.0);
}

}  // namespace
}  // namespace kvouter
