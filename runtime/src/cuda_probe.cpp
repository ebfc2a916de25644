#include "kvouter/cuda_probe.h"

#include <dlfcn.h>

#include "kvouter/errors.h"

namespace kvouter {

namespace {

void* driver_library() {
  // The names Halide's CUDA runtime tries (libcuda.so first).
  void* lib = dlopen("libcuda.so", RTLD_NOW | RTLD_LOCAL);
  if (!lib) lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  return lib;
}

}  // namespace

int cuda_device_count(std::string* why) {
  auto fail = [&](const std::string& w) {
    if (why) *why = w;
    return 0;
  };
  void* lib = driver_library();
  if (!lib) return fail("the CUDA driver library libcuda.so cannot be loaded (no NVIDIA driver here)");
  using InitFn = int (*)(unsigned);
  using CountFn = int (*)(int*);
  auto init = reinterpret_cast<InitFn>(dlsym(lib, "cuInit"));
  auto count = reinterpret_cast<CountFn>(dlsym(lib, "cuDeviceGetCount"));
  if (!init || !count) return fail("libcuda.so lacks cuInit or cuDeviceGetCount");
  if (const int rc = init(0); rc != 0) return fail("cuInit failed with CUresult " + std::to_string(rc));
  int n = 0;
  if (const int rc = count(&n); rc != 0) return fail("cuDeviceGetCount failed with CUresult " + std::to_string(rc));
  if (n == 0) return fail("the CUDA driver reports no device");
  return n;
}

void require_cuda_device() {
  std::string why;
  if (cuda_device_count(&why) == 0) throw BackendError("cuda: no usable CUDA device: " + why);
}

std::string cuda_device_name() {
  require_cuda_device();  // the library loads and cuInit has succeeded
  using GetFn = int (*)(int*, int);
  using NameFn = int (*)(char*, int, int);
  void* lib = driver_library();
  auto get = reinterpret_cast<GetFn>(dlsym(lib, "cuDeviceGet"));
  auto name = reinterpret_cast<NameFn>(dlsym(lib, "cuDeviceGetName"));
  if (!get || !name) throw BackendError("cuda: libcuda.so lacks cuDeviceGet or cuDeviceGetName");
  int device = 0;
  if (const int rc = get(&device, 0); rc != 0) throw BackendError("cuda: cuDeviceGet failed with CUresult " + std::to_string(rc));
  char buf[256] = {};
  if (const int rc = name(buf, sizeof(buf) - 1, device); rc != 0) {
    throw BackendError("cuda: cuDeviceGetName failed with CUresult " + std::to_string(rc));
  }
  return buf;
}

}  // namespace kvouter
