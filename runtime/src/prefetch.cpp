#include "kvouter/prefetch.h"

#include <cstdint>
#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#endif

// The pools are (d, slot, head, page) with d dense: a row is one span. prefetcht1 (into the L2):
// on a Zen 4 host it raised random 8 KiB reads from 19.7 to 27-31 GB/s, where prefetcht0 gave 23
// and prefetchnta 21 (experiments/results/cpu/2026-12-04/decode_ahead_zen4.md).
extern "C" float kvouter_prefetch_l2(halide_buffer_t* k, halide_buffer_t* v, int slot, int head, int page) {
#if defined(__x86_64__) || defined(_M_X64)
  for (const halide_buffer_t* b : {k, v}) {
    const halide_dimension_t* dim = b->dim;
    const int64_t at = int64_t(slot - dim[1].min) * dim[1].stride + int64_t(head - dim[2].min) * dim[2].stride +
                       int64_t(page - dim[3].min) * dim[3].stride;
    const char* row = reinterpret_cast<const char*>(b->host) + at * b->type.bytes();
    const int64_t bytes = int64_t(dim[0].extent) * b->type.bytes();
    for (int64_t i = 0; i < bytes; i += 64) _mm_prefetch(row + i, _MM_HINT_T1);
  }
#else
  (void)k, (void)v, (void)slot, (void)head, (void)page;
#endif
  return 0.f;
}
