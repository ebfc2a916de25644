#include "kvouter/host_copy.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>

#include "thread_pool.h"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace kvouter::halide {

namespace {

struct CopyTask {
  char* dst;
  const char* src;
  int64_t bytes;
  int64_t chunk;
};

int copy_chunk(void*, int i, uint8_t* closure) {
  const CopyTask& c = *reinterpret_cast<const CopyTask*>(closure);
  const int64_t begin = i * c.chunk, n = std::min(c.chunk, c.bytes - begin);
  if (c.src) {
    std::memcpy(c.dst + begin, c.src + begin, static_cast<size_t>(n));
  } else {
    std::memset(c.dst + begin, 0, static_cast<size_t>(n));
  }
  return 0;
}

}  // namespace

bool thread_pool_linked() { return halide_do_par_for != nullptr; }

void host_copy(void* dst, const void* src, int64_t bytes) {
  if (bytes <= 0) return;
  if (bytes < kParallelCopyBytes) {
    if (src) {
      std::memcpy(dst, src, static_cast<size_t>(bytes));
    } else {
      std::memset(dst, 0, static_cast<size_t>(bytes));
    }
    return;
  }
  // Chunks of at least 256 KB, cache-line aligned.
  CopyTask c{static_cast<char*>(dst), static_cast<const char*>(src), bytes, 0};
  const int64_t chunks = std::min<int64_t>(bytes / (int64_t{256} << 10), 64);
  c.chunk = ((bytes + chunks - 1) / chunks + 63) / 64 * 64;
  const int n = static_cast<int>((bytes + c.chunk - 1) / c.chunk);
  const int err = detail::par_for(copy_chunk, n, &c);
  if (err != 0) throw std::runtime_error("host_copy: Halide's thread pool failed with " + std::to_string(err));
}

void host_copy_streaming(void* dst, const void* src, int64_t bytes) {
  if (bytes <= 0) return;
#if defined(__SSE2__)
  auto* d = static_cast<char*>(dst);
  const auto* s = static_cast<const char*>(src);
  // Up to dst's first 16-byte boundary, then 64 bytes (a cache line) per step, then the rest.
  const int64_t head = std::min<int64_t>(bytes, (16 - reinterpret_cast<uintptr_t>(d) % 16) % 16);
  std::memcpy(d, s, static_cast<size_t>(head));
  int64_t i = head;
  for (; i + 64 <= bytes; i += 64) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 16));
    const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 32));
    const __m128i e = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 48));
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i), a);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 16), b);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 32), c);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 48), e);
  }
  std::memcpy(d + i, s + i, static_cast<size_t>(bytes - i));
  _mm_sfence();  // the streaming stores ordered before whatever the caller does next (a DMA)
#else
  std::memcpy(dst, src, static_cast<size_t>(bytes));
#endif
}

}  // namespace kvouter::halide
