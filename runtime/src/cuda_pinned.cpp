#include "kvouter/cuda_pinned.h"

#include <dlfcn.h>

#include <mutex>

namespace kvouter {

namespace {

using CUcontext = void*;
struct Cuda {
  int (*init)(unsigned) = nullptr;
  int (*device_get)(int*, int) = nullptr;
  int (*primary_retain)(CUcontext*, int) = nullptr;
  int (*push)(CUcontext) = nullptr;
  int (*pop)(CUcontext*) = nullptr;
  int (*host_register)(void*, size_t, unsigned) = nullptr;
  int (*host_unregister)(void*) = nullptr;
  CUcontext ctx = nullptr;
  bool ok = false;
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
    int dev = 0;
    c.ok = c.init(0) == 0 && c.device_get(&dev, 0) == 0 && c.primary_retain(&c.ctx, dev) == 0;
  });
  return c;
}

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

}  // namespace kvouter
