#include "kvouter/pool_memory.h"

#include <sys/mman.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <new>
#include <string>
#include <utility>

namespace kvouter {

namespace {
constexpr size_t kHuge = size_t{2} << 20;
}

PoolMemory::PoolMemory(size_t bytes) : bytes_(bytes) {
  if (bytes == 0) return;
  // Over-map by one huge page and trim, so that the array starts on a 2 MiB boundary.
  const size_t rounded = (bytes + kHuge - 1) / kHuge * kHuge;
  const size_t span = rounded + kHuge;
  void* p = ::mmap(nullptr, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) throw std::bad_alloc();
  const auto base = reinterpret_cast<uintptr_t>(p);
  const uintptr_t aligned = (base + kHuge - 1) / kHuge * kHuge;
  if (aligned > base) ::munmap(p, aligned - base);
  const uintptr_t end = base + span, keep_end = aligned + rounded;
  if (end > keep_end) ::munmap(reinterpret_cast<void*>(keep_end), end - keep_end);
  data_ = reinterpret_cast<void*>(aligned);
  mapped_ = rounded;
#ifdef MADV_HUGEPAGE
  ::madvise(data_, mapped_, MADV_HUGEPAGE);  // advice only: without THP the pages are 4 KiB
#endif
}

PoolMemory::PoolMemory(PoolMemory&& o) noexcept
    : data_(std::exchange(o.data_, nullptr)), bytes_(std::exchange(o.bytes_, 0)), mapped_(std::exchange(o.mapped_, 0)) {}

PoolMemory& PoolMemory::operator=(PoolMemory&& o) noexcept {
  if (this != &o) {
    if (data_) ::munmap(data_, mapped_);
    data_ = std::exchange(o.data_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
    mapped_ = std::exchange(o.mapped_, 0);
  }
  return *this;
}

PoolMemory::~PoolMemory() {
  if (data_) ::munmap(data_, mapped_);
}

size_t PoolMemory::huge_bytes() const {
  if (!data_) return 0;
  std::ifstream smaps("/proc/self/smaps");
  std::string line;
  const auto start = reinterpret_cast<uintptr_t>(data_), stop = start + mapped_;
  size_t kb = 0;
  bool inside = false;
  while (std::getline(smaps, line)) {
    unsigned long lo = 0, hi = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx ", &lo, &hi) == 2) {  // a mapping's header line
      inside = lo < stop && hi > start;
      continue;
    }
    size_t v = 0;
    if (inside && std::sscanf(line.c_str(), "AnonHugePages: %zu kB", &v) == 1) kb += v;
  }
  return kb * 1024;
}

}  // namespace kvouter
