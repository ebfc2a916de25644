// Replaces the global operator new/delete of the one test binary that includes this header (once,
// from one file), counting every allocation and keeping the largest, so that a test can see
// whether a step allocates, and how much.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <new>

namespace kvouter::testing_alloc {

inline std::atomic<int64_t> count{0};
inline std::atomic<size_t> largest{0};

}  // namespace kvouter::testing_alloc

namespace kvouter::testing_alloc {

inline void note(size_t n) {
  count.fetch_add(1, std::memory_order_relaxed);
  size_t seen = largest.load(std::memory_order_relaxed);
  while (n > seen && !largest.compare_exchange_weak(seen, n)) {
  }
}

}  // namespace kvouter::testing_alloc

#if defined(__SANITIZE_ADDRESS__)
// Under AddressSanitizer, which owns operator new (a replacement here would pair with its
// allocations made inside libHalide), every allocation is seen through its hooks instead.
// (sanitizer/allocator_interface.h ships with clang, not with GCC: the declaration, as there.)
extern "C" int __sanitizer_install_malloc_and_free_hooks(void (*malloc_hook)(const volatile void*, size_t),
                                                         void (*free_hook)(const volatile void*));
namespace {
void kvouter_count_malloc(const volatile void*, size_t n) { kvouter::testing_alloc::note(n); }
void kvouter_count_free(const volatile void*) {}
[[maybe_unused]] const int kvouter_hooks_installed = __sanitizer_install_malloc_and_free_hooks(kvouter_count_malloc, kvouter_count_free);
}  // namespace
#else
// GCC cannot see that these replace the global pair together.
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
void* operator new(size_t n) {
  kvouter::testing_alloc::note(n);
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, size_t) noexcept { std::free(p); }
#endif
