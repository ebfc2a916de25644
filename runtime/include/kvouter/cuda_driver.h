// The CUDA driver calls the runtime makes beside Halide's CUDA runtime (libcuda loaded with
// dlopen, as Halide's runtime loads it; nothing links against CUDA):
// - page-locked host memory: Halide's CUDA runtime copies between the device and a buffer's host
//   memory with cuMemcpy, which for pageable memory runs at a fraction of the bus's rate
//   (gpu-prefill's 1 GB read-back: 302 ms on the H200). Registered memory is copied by DMA.
// - streams of our own beside Halide's, for the step runner's overlapped step
//   (DeviceStepRunner::step_and_read): Halide 21's CUDA runtime launches its kernels (and makes
//   its copies and syncs) on the stream its get-stream handler names (cuda_stream_of_thread,
//   installed by the AOT registry: CUDA kernels are generated ahead of time, the JIT schedules
//   Vulkan only), the context's legacy default stream outside a CudaStreamScope. The step's
//   overlapped copies are ours (cuMemcpy*Async on these streams), and it waits for its streams
//   itself: a Halide sync outside a scope does not wait for them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace kvouter {

// Registers [p, p + bytes) as page-locked for every CUDA context (CU_MEMHOSTREGISTER_PORTABLE,
// through the device's primary context). False when it cannot (no CUDA driver, or refused): the
// memory then stays pageable, which is slower, not wrong.
bool cuda_pin(void* p, size_t bytes);
// Undoes cuda_pin (before the memory is freed).
void cuda_unpin(void* p);

// Non-blocking streams (CU_STREAM_NON_BLOCKING: not ordered with the legacy default stream) in
// the CUDA context that owns a device allocation (Halide's CUDA runtime creates a context of its
// own). Every call throws BackendError naming the driver call that failed.
class CudaStreams {
 public:
  // n streams in the context of the allocation at device address `device_ptr`.
  CudaStreams(uint64_t device_ptr, int n);
  ~CudaStreams();
  CudaStreams(const CudaStreams&) = delete;
  CudaStreams& operator=(const CudaStreams&) = delete;

  int size() const { return static_cast<int>(streams_.size()); }
  void* context() const { return ctx_; }
  void* stream(int i) const { return streams_[static_cast<size_t>(i)]; }
  // Whether `device_ptr` belongs to this context.
  bool owns(uint64_t device_ptr) const;
  // Stream i waits for everything issued so far on the context's legacy default stream (where
  // Halide's copies and kernels go outside a CudaStreamScope).
  void after_default(int i);
  // Stream i waits for everything issued so far on stream `first`.
  void after(int first, int i);
  // Asynchronous copies on stream i (a DMA where the host memory is page-locked).
  void to_device(int i, uint64_t dst, const void* src, size_t bytes);
  void to_host(int i, void* dst, uint64_t src, size_t bytes);
  // Waits for stream i.
  void sync(int i);

 private:
  void* ctx_ = nullptr;
  std::vector<void*> streams_;
  void* default_done_ = nullptr;  // an event recorded on the legacy default stream
  std::vector<void*> done_;       // an event per stream
};

// While one lives, the Halide CUDA kernels that this thread launches in `context` run on `stream`
// (nullptr: the legacy default stream, as without one). Scopes nest.
class CudaStreamScope {
 public:
  CudaStreamScope(void* context, void* stream);
  ~CudaStreamScope();
  CudaStreamScope(const CudaStreamScope&) = delete;
  CudaStreamScope& operator=(const CudaStreamScope&) = delete;

 private:
  void* prev_ctx_;
  void* prev_stream_;
};

// Halide's get-stream handler (halide_cuda_get_stream_t): the innermost CudaStreamScope's stream
// of this thread where its context is `context`, else the legacy default stream.
int cuda_stream_of_thread(void* user_context, void* context, void** stream);

}  // namespace kvouter
