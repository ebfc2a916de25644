// Staging copies spread over Halide's thread pool (kvouter/host_copy.h): every byte copied or
// zeroed exactly, below and above the parallel threshold, at sizes that split unevenly.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "kvouter/host_copy.h"

namespace kvouter::halide {
namespace {

TEST(HostCopy, RunsOnHalidesThreadPoolHere) { EXPECT_TRUE(thread_pool_linked()); }

TEST(HostCopy, CopiesEveryByteAndNothingPast) {
  for (int64_t bytes : {int64_t{0}, int64_t{1}, int64_t{4097}, kParallelCopyBytes - 1, kParallelCopyBytes,
                        int64_t{3} * kParallelCopyBytes + 13, int64_t{(4 << 20) + 7}}) {
    SCOPED_TRACE(bytes);
    std::vector<uint8_t> src(static_cast<size_t>(bytes) + 64), dst(static_cast<size_t>(bytes) + 64, 0xAB);
    for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i * 131 + 7);
    host_copy(dst.data(), src.data(), bytes);
    for (int64_t i = 0; i < bytes; ++i) ASSERT_EQ(dst[static_cast<size_t>(i)], src[static_cast<size_t>(i)]) << i;
    for (size_t i = static_cast<size_t>(bytes); i < dst.size(); ++i) ASSERT_EQ(dst[i], 0xAB) << i;
  }
}

TEST(HostCopy, NullSourceZeroesTheRange) {
  for (int64_t bytes : {int64_t{5}, int64_t{3} * kParallelCopyBytes + 5}) {
    SCOPED_TRACE(bytes);
    std::vector<uint8_t> dst(static_cast<size_t>(bytes) + 8, 0xCD);
    host_copy(dst.data() + 3, nullptr, bytes);
    EXPECT_EQ(dst[2], 0xCD);
    for (int64_t i = 0; i < bytes; ++i) ASSERT_EQ(dst[static_cast<size_t>(i) + 3], 0) << i;
    EXPECT_EQ(dst[static_cast<size_t>(bytes) + 3], 0xCD);
  }
}

}  // namespace
}  // namespace kvouter::halide
