#include "kvouter/cuda_driver.h"

#include <dlfcn.h>

#include <mutex>
#include <string>

#include "kvouter/errors.h"

namespace kvouter {

namespace {

using CUcontext = void*;
using CUstream = void*;
using CUevent = void*;
using CUdeviceptr = uint64_t;
struct Cuda {
  int (*init)(unsigned) = nullptr;
  int (*device_get)(int*, int) = nullptr;
  int (*primary_retain)(CUcontext*, int) = nullptr;
  int (*push)(CUcontext) = nullptr;
  int (*pop)(CUcontext*) = nullptr;
  int (*host_register)(void*, size_t, unsigned) = nullptr;
  int (*host_unregister)(void*) = nullptr;
  int (*pointer_attribute)(void*, int, CUdeviceptr) = nullptr;
  int (*stream_create)(CUstream*, unsigned) = nullptr;
  int (*stream_destroy)(CUstream) = nullptr;
  int (*stream_sync)(CUstream) = nullptr;
  int (*stream_wait_event)(CUstream, CUevent, unsigned) = nullptr;
  int (*event_create)(CUevent*, unsigned) = nullptr;
  int (*event_destroy)(CUevent) = nullptr;
  int (*event_record)(CUevent, CUstream) = nullptr;
  int (*htod_async)(CUdeviceptr, const void*, size_t, CUstream) = nullptr;
  int (*dtoh_async)(void*, CUdeviceptr, size_t, CUstream) = nullptr;
  CUcontext ctx = nullptr;
  bool ok = false;       // pinning: the primary context retained
  bool streams = false;  // the stream calls resolved
};

Cuda& cuda() {
  static Cuda c;
  static std::once_flag once;
  std::call_once(once, [] {
    void* lib = dlopen("libcuda.so", RTLD_NOW | RTLD_LOCAL);
    if (!lib) lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) return;
    auto sym = [&](const char* name, auto* out) {
      *out = reinterpret_cast<std::remove_pointer_t<decltype(out)>>(dlsym(lib, name));
      return *out != nullptr;
    };
    if (!sym("cuInit", &c.init) || !sym("cuDeviceGet", &c.device_get) ||
        !sym("cuDevicePrimaryCtxRetain", &c.primary_retain) || !sym("cuCtxPushCurrent_v2", &c.push) ||
        !sym("cuCtxPopCurrent_v2", &c.pop) || !sym("cuMemHostRegister_v2", &c.host_register) ||
        !sym("cuMemHostUnregister", &c.host_unregister)) {
      return;
    }
    c.streams = sym("cuPointerGetAttribute", &c.pointer_attribute) && sym("cuStreamCreate", &c.stream_create) &&
                sym("cuStreamDestroy_v2", &c.stream_destroy) && sym("cuStreamSynchronize", &c.stream_sync) &&
                sym("cuStreamWaitEvent", &c.stream_wait_event) && sym("cuEventCreate", &c.event_create) &&
                sym("cuEventDestroy_v2", &c.event_destroy) && sym("cuEventRecord", &c.event_record) &&
                sym("cuMemcpyHtoDAsync_v2", &c.htod_async) && sym("cuMemcpyDtoHAsync_v2", &c.dtoh_async);
    int dev = 0;
    c.ok = c.init(0) == 0 && c.device_get(&dev, 0) == 0 && c.primary_retain(&c.ctx, dev) == 0;
  });
  return c;
}

// The driver's calls made with a context current (pushed for the call, popped after).
class Current {
 public:
  explicit Current(CUcontext ctx) : c_(cuda()) {
    if (c_.push(ctx) != 0) throw BackendError("cuda: cuCtxPushCurrent failed");
  }
  ~Current() {
    CUcontext popped = nullptr;
    c_.pop(&popped);
  }
  Current(const Current&) = delete;
  Current& operator=(const Current&) = delete;

 private:
  Cuda& c_;
};

void check(int rc, const char* call) {
  if (rc != 0) throw BackendError(std::string("cuda: ") + call + " failed with CUresult " + std::to_string(rc));
}

constexpr int kPointerAttributeContext = 1;  // CU_POINTER_ATTRIBUTE_CONTEXT
constexpr unsigned kStreamNonBlocking = 0x1;  // CU_STREAM_NON_BLOCKING
constexpr unsigned kEventDisableTiming = 0x2;  // CU_EVENT_DISABLE_TIMING

thread_local CUcontext scope_ctx = nullptr;
thread_local CUstream scope_stream = nullptr;

}  // namespace

bool cuda_pin(void* p, size_t bytes) {
  Cuda& c = cuda();
  if (!c.ok || !p || bytes == 0) return false;
  if (c.push(c.ctx) != 0) return false;
  constexpr unsigned kPortable = 0x01;  // CU_MEMHOSTREGISTER_PORTABLE: pinned for every context
  const bool ok = c.host_register(p, bytes, kPortable) == 0;
  CUcontext popped = nullptr;
  c.pop(&popped);
  return ok;
}

void cuda_unpin(void* p) {
  Cuda& c = cuda();
  if (!c.ok || !p || c.push(c.ctx) != 0) return;
  c.host_unregister(p);
  CUcontext popped = nullptr;
  c.pop(&popped);
}

CudaStreams::CudaStreams(uint64_t device_ptr, int n) {
  Cuda& c = cuda();
  if (!c.streams) throw BackendError("cuda: the driver library lacks the stream and event calls (or cannot be loaded)");
  check(c.pointer_attribute(&ctx_, kPointerAttributeContext, device_ptr), "cuPointerGetAttribute(CONTEXT)");
  Current cur(ctx_);
  try {
    check(c.event_create(&default_done_, kEventDisableTiming), "cuEventCreate");
    for (int i = 0; i < n; ++i) {
      CUstream s = nullptr;
      check(c.stream_create(&s, kStreamNonBlocking), "cuStreamCreate");
      streams_.push_back(s);
      CUevent e = nullptr;
      check(c.event_create(&e, kEventDisableTiming), "cuEventCreate");
      done_.push_back(e);
    }
  } catch (...) {
    for (CUstream s : streams_) c.stream_destroy(s);
    for (CUevent e : done_) c.event_destroy(e);
    if (default_done_) c.event_destroy(default_done_);
    throw;
  }
}

CudaStreams::~CudaStreams() {
  Cuda& c = cuda();
  if (c.push(ctx_) != 0) return;
  for (CUstream s : streams_) {
    c.stream_sync(s);
    c.stream_destroy(s);
  }
  for (CUevent e : done_) c.event_destroy(e);
  c.event_destroy(default_done_);
  CUcontext popped = nullptr;
  c.pop(&popped);
}

bool CudaStreams::owns(uint64_t device_ptr) const {
  CUcontext ctx = nullptr;
  return cuda().pointer_attribute(&ctx, kPointerAttributeContext, device_ptr) == 0 && ctx == ctx_;
}

void CudaStreams::after_default(int i) {
  Cuda& c = cuda();
  Current cur(ctx_);
  check(c.event_record(default_done_, nullptr), "cuEventRecord");
  check(c.stream_wait_event(stream(i), default_done_, 0), "cuStreamWaitEvent");
}

void CudaStreams::after(int first, int i) {
  Cuda& c = cuda();
  Current cur(ctx_);
  CUevent e = done_[static_cast<size_t>(first)];
  check(c.event_record(e, stream(first)), "cuEventRecord");
  check(c.stream_wait_event(stream(i), e, 0), "cuStreamWaitEvent");
}

void CudaStreams::to_device(int i, uint64_t dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  Current cur(ctx_);
  check(cuda().htod_async(dst, src, bytes, stream(i)), "cuMemcpyHtoDAsync");
}

void CudaStreams::to_host(int i, void* dst, uint64_t src, size_t bytes) {
  if (bytes == 0) return;
  Current cur(ctx_);
  check(cuda().dtoh_async(dst, src, bytes, stream(i)), "cuMemcpyDtoHAsync");
}

void CudaStreams::sync(int i) {
  Current cur(ctx_);
  check(cuda().stream_sync(stream(i)), "cuStreamSynchronize");
}

CudaStreamScope::CudaStreamScope(void* context, void* stream) : prev_ctx_(scope_ctx), prev_stream_(scope_stream) {
  scope_ctx = context;
  scope_stream = stream;
}

CudaStreamScope::~CudaStreamScope() {
  scope_ctx = prev_ctx_;
  scope_stream = prev_stream_;
}

int cuda_stream_of_thread(void*, void* context, void** stream) {
  *stream = scope_ctx != nullptr && context == scope_ctx ? scope_stream : nullptr;
  return 0;
}

}  // namespace kvouter
