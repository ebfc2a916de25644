// Finding a CUDA device for the AOT `host-cuda` kernels (the same Halide schedules on the CUDA
// target): the driver library is dlopen'ed here, as Halide's CUDA runtime does, so that a machine
// without one gets a clear error instead of a failed kernel call.
#pragma once

#include <string>

namespace kvouter {

// Number of CUDA devices the driver reports; 0 with the reason in `why` when there is no driver
// library, cuInit fails or there is no device.
int cuda_device_count(std::string* why = nullptr);

// Throws BackendError with the reason when no CUDA device can be used.
void require_cuda_device();

// The driver's name of CUDA device 0 ("NVIDIA H200", ...); throws BackendError when there is none.
std::string cuda_device_name();

}  // namespace kvouter
