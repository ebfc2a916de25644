#include "kvouter/pool_memory.h"

#include "kvouter/tensor.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <new>
#include <string>
#include <utility>

namespace kvouter {

namespace {

size_t huge_rounded(size_t bytes) { return (bytes + kHugeArrayBytes - 1) / kHugeArrayBytes * kHugeArrayBytes; }

}  // namespace

void* alloc_huge_array(size_t bytes) {
  if (bytes == 0) return nullptr;
  if (bytes > SIZE_MAX - 2 * kHugeArrayBytes) throw std::bad_alloc();
  // Over-map by one huge page and trim, so that the array starts on a 2 MiB boundary.
  const size_t rounded = huge_rounded(bytes);
  const size_t span = rounded + kHugeArrayBytes;
  void* p = ::mmap(nullptr, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) throw std::bad_alloc();
  const auto base = reinterpret_cast<uintptr_t>(p);
  const uintptr_t aligned = (base + kHugeArrayBytes - 1) / kHugeArrayBytes * kHugeArrayBytes;
  if (aligned > base) ::munmap(p, aligned - base);
  const uintptr_t end = base + span, keep_end = aligned + rounded;
  if (end > keep_end) ::munmap(reinterpret_cast<void*>(keep_end), end - keep_end);
  void* data = reinterpret_cast<void*>(aligned);
#ifdef MADV_HUGEPAGE
  ::madvise(data, rounded, MADV_HUGEPAGE);  // advice only: without THP the pages are 4 KiB
#endif
  return data;
}

void free_huge_array(void* p, size_t bytes) noexcept {
  if (p) ::munmap(p, huge_rounded(bytes));
}

PoolMemory::PoolMemory(size_t bytes) : data_(alloc_huge_array(bytes)), bytes_(bytes) {}

PoolMemory::PoolMemory(PoolMemory&& o) noexcept
    : data_(std::exchange(o.data_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}

PoolMemory& PoolMemory::operator=(PoolMemory&& o) noexcept {
  if (this != &o) {
    free_huge_array(data_, bytes_);
    data_ = std::exchange(o.data_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
  }
  return *this;
}

PoolMemory::~PoolMemory() { free_huge_array(data_, bytes_); }

size_t PoolMemory::huge_bytes() const { return data_ ? huge_bytes_of(data_, huge_rounded(bytes_)) : 0; }

size_t huge_bytes_of(const void* data, size_t bytes) {
  if (!data || bytes == 0) return 0;
  std::ifstream smaps("/proc/self/smaps");
  const auto start = reinterpret_cast<uintptr_t>(data);
  return huge_bytes_in(smaps, start, start + bytes);
}

size_t huge_bytes_in(std::istream& smaps, uintptr_t start, uintptr_t stop) {
  // The kernel may merge the pool's mapping with its anonymous neighbours into one area: an
  // area's huge pages count in the share of it the range covers.
  std::string line;
  double bytes = 0, share = 0;
  while (std::getline(smaps, line)) {
    unsigned long lo = 0, hi = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx ", &lo, &hi) == 2) {  // a mapping's header line
      const uintptr_t a = std::max<uintptr_t>(lo, start), b = std::min<uintptr_t>(hi, stop);
      share = b > a && hi > lo ? static_cast<double>(b - a) / static_cast<double>(hi - lo) : 0.0;
      continue;
    }
    size_t v = 0;
    if (share > 0 && std::sscanf(line.c_str(), "AnonHugePages: %zu kB", &v) == 1) bytes += static_cast<double>(v) * 1024 * share;
  }
  return std::min(static_cast<size_t>(bytes), static_cast<size_t>(stop - start));
}

}  // namespace kvouter
