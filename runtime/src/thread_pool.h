// Halide's thread pool, where a Halide runtime is linked (the generated kernels' one); the calling
// thread alone where none is (a program of the runtime library only, such as the fuzzers). The
// reference is weak, so the runtime library itself never requires one.
#pragma once

#include <HalideRuntime.h>

#include <cstdint>

extern "C" int halide_do_par_for(void* user_context, halide_task_t task, int min, int size, uint8_t* closure)
    __attribute__((weak));

namespace kvouter::detail {

// Runs task(i) for i in [0, n): on the pool when there is one, else in order. Returns the first
// non-zero task result (0 when all succeed).
inline int par_for(halide_task_t task, int n, void* closure) {
  if (halide_do_par_for != nullptr) return halide_do_par_for(nullptr, task, 0, n, static_cast<uint8_t*>(closure));
  for (int i = 0; i < n; ++i) {
    if (const int err = task(nullptr, i, static_cast<uint8_t*>(closure))) return err;
  }
  return 0;
}

}  // namespace kvouter::detail
