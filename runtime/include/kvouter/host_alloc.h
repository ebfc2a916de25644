// The host allocator that every Halide kernel of this project allocates its scratch with, AOT
// and JIT alike (installed by the AOT registry and by the JIT's default handlers).
//
// A CPU schedule allocates the same few buffers (64-450 KB) in every tile and frees them at its
// end. Through malloc, glibc trims a worker thread's arena whenever its free top passes 128 KB, so
// every tile faulted its scratch in again: SPEC prefill through the AOT cpu_tiled kernel took
// 347 ms in `kvouter run` against 158 ms with glibc's trimming turned off, and the JIT was fast
// only because LLVM's own frees had raised glibc's thresholds
// (experiments/results/cpu/2026-12-01/aot_vs_jit.md). This allocator keeps each thread's freed
// blocks for reuse, so the kernels' speed no longer depends on the process's malloc history.
//
// A program that links one exported kernel (`kvouter export`) without this library gets Halide's
// default allocator; it can install this one with halide_set_custom_malloc/free.
#pragma once

#include <cstddef>
#include <cstdint>

namespace kvouter::halide {

// Halide's halide_malloc_t / halide_free_t signatures. Blocks are 128-byte aligned (Halide asks
// for at least halide_malloc_alignment()).
void* host_malloc(void* user_context, size_t bytes);
void host_free(void* user_context, void* ptr);

// Per thread, at most this many bytes (and kMaxCachedBlocks blocks) stay cached; the rest goes
// back to malloc.
inline constexpr size_t kMaxCachedBytesPerThread = size_t{32} << 20;
inline constexpr int kMaxCachedBlocks = 64;

// Process-wide counters, for tests: allocations served from a thread's cache, and from malloc.
struct HostAllocCounts {
  int64_t reused = 0;
  int64_t fresh = 0;
};
HostAllocCounts host_alloc_counts();

}  // namespace kvouter::halide
