// The kernels' host allocator (kvouter/host_alloc.h): aligned blocks, reuse per thread, bounded
// caches, frees on another thread and after a thread's exit (LeakSanitizer checks the rest); and
// the pool memory an engine keeps K/V in.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "kvouter/host_alloc.h"
#include "kvouter/pool_memory.h"
#include "kvouter/tensor.h"

namespace kvouter::halide {
namespace {

TEST(HostAlloc, BlocksAreAlignedAndWritable) {
  for (size_t bytes : {size_t{1}, size_t{100}, size_t{4096}, size_t{65536 + 3}, size_t{3} << 20}) {
    auto* p = static_cast<unsigned char*>(host_malloc(nullptr, bytes));
    ASSERT_NE(p, nullptr);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 128, 0u) << bytes;
    p[0] = 1;
    p[bytes - 1] = 2;
    host_free(nullptr, p);
  }
  host_free(nullptr, nullptr);  // as free(NULL)
}

TEST(HostAlloc, ATilesAllocationsAreReusedByTheNextTile) {
  // The pattern of a CPU schedule's tile: the same sizes allocated, then freed, tile after tile.
  const std::vector<size_t> sizes = {65536, 65536, 32768, 131072, 512};
  auto tile = [&] {
    std::vector<void*> blocks;
    for (size_t s : sizes) blocks.push_back(host_malloc(nullptr, s));
    for (auto it = blocks.rbegin(); it != blocks.rend(); ++it) host_free(nullptr, *it);
    return blocks;
  };
  const auto first = tile();
  const HostAllocCounts before = host_alloc_counts();
  const auto second = tile();
  const HostAllocCounts after = host_alloc_counts();
  EXPECT_EQ(after.fresh, before.fresh);
  EXPECT_EQ(after.reused - before.reused, static_cast<int64_t>(sizes.size()));
  EXPECT_EQ(std::vector<void*>(first.begin(), first.end()), second);  // the very same blocks
}

TEST(HostAlloc, TheCacheIsBounded) {
  // More than the block cap of one size, then one block past the byte cap: each free keeps the
  // cache within its limits (the oldest blocks go back to malloc), and a later burst of the same
  // size is served from what is kept.
  std::vector<void*> blocks;
  for (int i = 0; i < 2 * kMaxCachedBlocks; ++i) blocks.push_back(host_malloc(nullptr, 4096));
  for (void* b : blocks) host_free(nullptr, b);
  const HostAllocCounts before = host_alloc_counts();
  blocks.clear();
  for (int i = 0; i < 2 * kMaxCachedBlocks; ++i) blocks.push_back(host_malloc(nullptr, 4096));
  const HostAllocCounts after = host_alloc_counts();
  EXPECT_EQ(after.reused - before.reused, kMaxCachedBlocks);
  EXPECT_EQ(after.fresh - before.fresh, kMaxCachedBlocks);
  for (void* b : blocks) host_free(nullptr, b);

  void* huge = host_malloc(nullptr, kMaxCachedBytesPerThread + 1);
  host_free(nullptr, huge);  // past the byte cap: straight back to malloc
  const HostAllocCounts h0 = host_alloc_counts();
  host_free(nullptr, host_malloc(nullptr, kMaxCachedBytesPerThread + 1));
  EXPECT_EQ(host_alloc_counts().fresh - h0.fresh, 1);
}

TEST(HostAlloc, FreedOnAnotherThreadAndAfterAThreadEnds) {
  void* from_worker = nullptr;
  std::thread([&] {
    from_worker = host_malloc(nullptr, 70000);
    host_free(nullptr, host_malloc(nullptr, 90000));  // cached, then released at the thread's end
  }).join();
  host_free(nullptr, from_worker);  // joins this thread's cache
  const HostAllocCounts before = host_alloc_counts();
  host_free(nullptr, host_malloc(nullptr, 70000));
  EXPECT_EQ(host_alloc_counts().reused - before.reused, 1);
}

}  // namespace
}  // namespace kvouter::halide

// Pool memory (as an engine holds K/V): aligned to 2 MiB, and its huge pages counted within its own
// range, even where the kernel merged its mapping with its neighbours into one area.
TEST(PoolMemory, IsAlignedAndItsHugeBytesAtMostThePool) {
  kvouter::PoolMemory pool(size_t{3} << 20);
  std::memset(pool.data(), 1, pool.bytes());
  EXPECT_EQ(reinterpret_cast<uintptr_t>(pool.data()) % (size_t{2} << 20), 0u);
  EXPECT_LE(pool.huge_bytes(), size_t{4} << 20);  // 3 MiB rounded up to whole huge pages
}

// A Tensor's large arrays (a case's K/V pages) in the same memory as an engine's pool: 2 MiB-aligned
// and value-initialised; its small ones from operator new. Under AddressSanitizer every array is
// from operator new, so that its bounds stay checked.
TEST(PoolMemory, LargeTensorsLieOnHugePageBoundaries) {
  const int64_t big = static_cast<int64_t>(kvouter::kHugeArrayBytes / sizeof(float)) + 5;
  kvouter::Tensor<float> t({big}, 2.5f);
  ASSERT_EQ(t.numel(), big);
  EXPECT_EQ(t.data.front(), 2.5f);
  EXPECT_EQ(t.data.back(), 2.5f);
#if defined(KVOUTER_ASAN)
  GTEST_SKIP() << "AddressSanitizer build: every array comes from operator new";
#else
  EXPECT_EQ(reinterpret_cast<uintptr_t>(t.ptr()) % kvouter::kHugeArrayBytes, 0u);
  // Its huge pages, as kvouter_bench counts them: within the array, none where THP is off.
  const size_t bytes = static_cast<size_t>(big) * sizeof(float);
  const size_t huge = kvouter::huge_bytes_of(t.ptr(), bytes);
  EXPECT_LE(huge, bytes);
  std::ifstream thp("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string modes;
  if (std::getline(thp, modes) && modes.find("[never]") != std::string::npos) {
    EXPECT_EQ(huge, 0u);
  }
  EXPECT_EQ(kvouter::huge_bytes_of(nullptr, bytes), 0u);
  kvouter::Tensor<uint16_t> copy;
  copy.shape = {2 * big};
  copy.data.assign(static_cast<size_t>(2 * big), 7);  // a second large array, then both freed
  EXPECT_EQ(reinterpret_cast<uintptr_t>(copy.ptr()) % kvouter::kHugeArrayBytes, 0u);
  t.data.resize(3);  // shrinking keeps the mapping; shrink_to_fit moves to operator new's memory
  t.data.shrink_to_fit();
  EXPECT_EQ(t.data.back(), 2.5f);
#endif
}

TEST(PoolMemory, HugePagesOfAMergedAreaCountInTheRangesShare) {
  // One 12 MiB area, all of it huge pages; the pool is 4 MiB of it. Then an area it does not touch.
  std::istringstream smaps(
      "7f0000000000-7f0000c00000 rw-p 00000000 00:00 0\n"
      "Size:              12288 kB\n"
      "AnonHugePages:     12288 kB\n"
      "7f0001000000-7f0001400000 rw-p 00000000 00:00 0\n"
      "AnonHugePages:      4096 kB\n");
  const uintptr_t start = 0x7f0000200000;
  EXPECT_EQ(kvouter::huge_bytes_in(smaps, start, start + (size_t{4} << 20)), size_t{4} << 20);
  std::istringstream none("7f0000000000-7f0000c00000 rw-p 00000000 00:00 0\nAnonHugePages:         0 kB\n");
  EXPECT_EQ(kvouter::huge_bytes_in(none, start, start + (size_t{4} << 20)), 0u);
}
