#include "kvouter/host_alloc.h"

#include <atomic>
#include <cstdlib>
#include <new>

namespace kvouter::halide {
namespace {

constexpr size_t kAlign = 128;  // also the header's size, which keeps the block aligned

struct Header {
  size_t bytes;  // the usable size asked for, rounded up to kAlign
};
static_assert(sizeof(Header) <= kAlign);

// Freed blocks of this thread, most recent last. A tile's allocations come and go in the same
// order every tile, so a short list searched from its end finds them at once.
struct Cache {
  void* blocks[kMaxCachedBlocks];
  int count = 0;
  size_t bytes = 0;

  ~Cache();
};

std::atomic<int64_t> reused{0}, fresh{0};

thread_local Cache cache;
// Set once this thread's cache is destroyed (at thread or process exit): later calls, from other
// thread_local or static destructors, go straight to malloc. Trivially destructible on purpose.
thread_local bool cache_gone = false;

Cache::~Cache() {
  for (int i = 0; i < count; ++i) std::free(blocks[i]);
  count = 0;
  cache_gone = true;
}

size_t& size_of(void* block) { return static_cast<Header*>(block)->bytes; }

void* fresh_block(size_t want) {
  void* block = std::aligned_alloc(kAlign, want + kAlign);
  if (!block) return nullptr;  // Halide reports the failed allocation
  size_of(block) = want;
  return static_cast<char*>(block) + kAlign;
}

}  // namespace

void* host_malloc(void*, size_t bytes) {
  const size_t want = (bytes + kAlign - 1) / kAlign * kAlign;
  if (cache_gone) return fresh_block(want);
  Cache& c = cache;
  for (int i = c.count - 1; i >= 0; --i) {
    void* block = c.blocks[i];
    if (size_of(block) != want) continue;
    c.blocks[i] = c.blocks[--c.count];
    c.bytes -= want;
    reused.fetch_add(1, std::memory_order_relaxed);
    return static_cast<char*>(block) + kAlign;
  }
  fresh.fetch_add(1, std::memory_order_relaxed);
  return fresh_block(want);
}

void host_free(void*, void* ptr) {
  if (!ptr) return;
  void* block = static_cast<char*>(ptr) - kAlign;
  const size_t bytes = size_of(block);
  if (cache_gone || bytes > kMaxCachedBytesPerThread) {
    std::free(block);
    return;
  }
  Cache& c = cache;
  // Full: the oldest blocks make room (sizes a pipeline stopped asking for age out).
  int drop = 0;
  size_t dropped = 0;
  while (c.count - drop == kMaxCachedBlocks || c.bytes - dropped + bytes > kMaxCachedBytesPerThread) {
    dropped += size_of(c.blocks[drop]);
    std::free(c.blocks[drop++]);
  }
  if (drop > 0) {
    for (int i = drop; i < c.count; ++i) c.blocks[i - drop] = c.blocks[i];
    c.count -= drop;
    c.bytes -= dropped;
  }
  c.blocks[c.count++] = block;
  c.bytes += bytes;
}

HostAllocCounts host_alloc_counts() { return {reused.load(), fresh.load()}; }

}  // namespace kvouter::halide
