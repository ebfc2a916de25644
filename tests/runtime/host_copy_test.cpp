// Staging copies spread over Halide's thread pool (kvouter/host_copy.h): every byte copied or
// zeroed exactly, below and above the parallel threshold, at sizes that split unevenly; and the
// streaming copy at every alignment.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
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

// The streaming copy: every destination offset against the 16-byte boundary, sizes below a
// line, between lines, and of many lines with a tail.
TEST(HostCopy, StreamingCopiesEveryByteAndNothingPast) {
  for (int64_t offset = 0; offset < 16; ++offset) {
    for (int64_t bytes : {int64_t{0}, int64_t{1}, int64_t{15}, int64_t{63}, int64_t{64}, int64_t{65}, int64_t{1000},
                          int64_t{(1 << 20) + 37}}) {
      SCOPED_TRACE(std::to_string(offset) + " " + std::to_string(bytes));
      std::vector<uint8_t> src(static_cast<size_t>(bytes) + 64), dst(static_cast<size_t>(bytes) + 64, 0xAB);
      for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i * 131 + 7);
      host_copy_streaming(dst.data() + offset, src.data() + 1, bytes);
      for (int64_t i = 0; i < offset; ++i) ASSERT_EQ(dst[static_cast<size_t>(i)], 0xAB) << i;
      for (int64_t i = 0; i < bytes; ++i) ASSERT_EQ(dst[static_cast<size_t>(offset + i)], src[static_cast<size_t>(i + 1)]) << i;
      for (size_t i = static_cast<size_t>(offset + bytes); i < dst.size(); ++i) ASSERT_EQ(dst[i], 0xAB) << i;
    }
  }
}

}  // namespace
}  // namespace kvouter::halide
