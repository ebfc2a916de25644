// Copies between caller memory and the page-locked staging of device transfers, spread over
// Halide's thread pool. One thread copies 4 MB (gpu-decode's q, or its out) in about 0.4 ms on
// the H200's host; the transfer itself takes about 0.1 ms.
#pragma once

#include <cstdint>

namespace kvouter::halide {

// dst[0, bytes) = src[0, bytes), or zeros where src is null. Copies below kParallelCopyBytes run
// on the calling thread.
void host_copy(void* dst, const void* src, int64_t bytes);

// dst[0, bytes) = src[0, bytes) on the calling thread, written with streaming (non-temporal)
// stores where the CPU has them (x86-64): the copy does not pull dst's lines into the host's
// caches or evict what is there. For an engine writing q into a device step's staging
// (DeviceStepRunner::q_staging), whose lines the host does not read again.
void host_copy_streaming(void* dst, const void* src, int64_t bytes);

inline constexpr int64_t kParallelCopyBytes = int64_t{512} << 10;

// Whether this program links a Halide runtime, whose thread pool the copies (and the planner's
// heads, PlanOptions::parallel_heads) run on; without one they run on the calling thread.
bool thread_pool_linked();

}  // namespace kvouter::halide
