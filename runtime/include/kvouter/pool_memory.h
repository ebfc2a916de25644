// Host memory for a KV pool: what an engine allocates its paged K and V in, and what the CLI and
// the benchmarks read cases into.
//
// A decode step reads each selected block from a few pages scattered over a pool of gigabytes.
// On 4 KiB pages nearly every such page is a TLB miss whose page walk itself misses the caches,
// and the hardware prefetchers stop at each 4 KiB boundary; on 2 MiB pages neither happens
// (SPEC decode on the Sapphire Rapids-class host: 9 % slower on 4 KiB pages,
// experiments/results/cpu/2026-12-06/cli_huge_pages_xeon.md). Tensor (kvouter/tensor.h) holds its
// large arrays in the same memory.
#pragma once

#include <cstddef>
#include <cstdint>
#include <istream>

namespace kvouter {

// 2 MiB-aligned anonymous memory, zero-filled, advised for transparent huge pages
// (MADV_HUGEPAGE) before it is first touched. The kernel gives huge pages where it can (THP
// "always" or "madvise"), and 4 KiB pages otherwise: the memory is valid either way.
class PoolMemory {
 public:
  PoolMemory() = default;
  explicit PoolMemory(size_t bytes);  // throws std::bad_alloc when the mapping fails
  PoolMemory(PoolMemory&& o) noexcept;
  PoolMemory& operator=(PoolMemory&& o) noexcept;
  PoolMemory(const PoolMemory&) = delete;
  PoolMemory& operator=(const PoolMemory&) = delete;
  ~PoolMemory();

  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  // Bytes of this mapping backed by huge pages now (from /proc/self/smaps; 0 where unknown).
  size_t huge_bytes() const;

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;  // the mapping is bytes_ rounded up to whole huge pages
};

// The bytes of [start, stop) backed by huge pages, from /proc/self/smaps text: an area that the
// kernel merged beyond the range counts in proportion to the share the range covers.
size_t huge_bytes_in(std::istream& smaps, uintptr_t start, uintptr_t stop);

// The bytes of [data, data + bytes) backed by huge pages now, from this process's
// /proc/self/smaps (0 where unknown): a pool's, or a Tensor's array (alloc_huge_array).
size_t huge_bytes_of(const void* data, size_t bytes);

}  // namespace kvouter
