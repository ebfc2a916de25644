// Page-locked host memory for CUDA copies: Halide's CUDA runtime copies between the device and a
// buffer's host memory with cuMemcpy, which for pageable memory runs at a fraction of the bus's
// rate (gpu-prefill's 1 GB read-back: 302 ms on the H200). Registered memory is copied by DMA.
#pragma once

#include <cstddef>

namespace kvouter {

// Registers [p, p + bytes) as page-locked for every CUDA context (CU_MEMHOSTREGISTER_PORTABLE,
// through the device's primary context). False when it cannot (no CUDA driver, or refused): the
// memory then stays pageable, which is slower, not wrong.
bool cuda_pin(void* p, size_t bytes);
// Undoes cuda_pin (before the memory is freed).
void cuda_unpin(void* p);

}  // namespace kvouter
