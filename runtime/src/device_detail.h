// The device cache's shared helpers (device_array.cpp, device_cache.cpp, step_runner.cpp): device
// calls through an interface's own entry points, 64-byte-line views, and the limits of Halide 21.
// Private to the runtime.
#pragma once

#include <HalideRuntime.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "kvouter/dtype.h"
#include "kvouter/errors.h"
#include "kvouter/vulkan_probe.h"

namespace kvouter::halide::device_detail {

// Halide 21's Vulkan allocator corrupts or fails allocations whose byte size is not a multiple of
// 64 (shared/notes/halide21-vulkan.md): every allocation and every copy here is whole 64-byte lines.
inline int64_t round64(int64_t bytes) { return (std::max<int64_t>(bytes, 1) + 63) / 64 * 64; }

// The least a device array allocates. Halide 21's Vulkan allocator can hand a new allocation the
// region of a freed one together with that one's buffer object, sized as it was requested: a
// kernel's scalar-argument buffer (tens to hundreds of bytes, not whole 64-byte lines) then
// became a 192-byte array's, and copies into it overran it (the validation layer's
// VUID-vkCmdCopyBuffer-size-00116; the JIT's kernels then read zeros; docs/vulkan.md limit 15).
// No array is that small.
inline constexpr int64_t kMinArrayBytes = 4096;

// Rows per call of the scatter kernel: its grid's x extent, below the 65535 workgroups that some
// devices allow (lavapipe, in every dimension).
inline constexpr int64_t kMaxRowsPerCall = 32768;

// Halide 21 indexes a buffer's elements with int32 (without large_buffers).
inline constexpr int64_t kMaxElements = (int64_t{1} << 31) - 64;

inline void check(int rc, const std::string& what) {
  if (rc != 0) throw BackendError("device cache: " + what + " failed with code " + std::to_string(rc));
}

// Device calls through the interface's own entry points (those of the runtime that made it: the
// generated kernels' runtime, or libHalide's for the JIT), never this program's global
// halide_device_* symbols: a program that only JITs links no Halide runtime of its own (the
// fuzzers), and a JIT buffer belongs to libHalide's runtime.
inline int dev_malloc(halide_buffer_t* b, const halide_device_interface_t* d) { return d->device_malloc(nullptr, b, d); }
inline int dev_free(halide_buffer_t* b) { return b->device_interface->device_free(nullptr, b); }
inline int dev_sync(halide_buffer_t* b) { return b->device_interface->device_sync(nullptr, b); }
inline int to_device(halide_buffer_t* b, const halide_device_interface_t* d) { return d->copy_to_device(nullptr, b, d); }
inline int to_host(halide_buffer_t* b) { return b->device_interface->copy_to_host(nullptr, b); }

inline halide_type_t bits_type(Dtype t) { return halide_type_t(halide_type_uint, static_cast<uint8_t>(8 * dtype_bytes(t))); }

// `bytes` bytes at offset 0 of a device allocation, with `host` as their host memory: the view
// every copy here goes through (whole 64-byte lines, never a crop).
inline halide_buffer_t byte_view(uint8_t* host, const halide_buffer_t& alloc, halide_dimension_t* d, int64_t bytes) {
  *d = halide_dimension_t(0, static_cast<int32_t>(round64(bytes)), 1);
  halide_buffer_t raw{};
  raw.type = halide_type_t(halide_type_uint, 8);
  raw.host = host;
  raw.device = alloc.device;
  raw.device_interface = alloc.device_interface;
  raw.dimensions = 1;
  raw.dim = d;
  return raw;
}

// C order [n0, ..., nk] as Halide dimensions (nk innermost).
inline int set_dims(halide_dimension_t* dims, const std::vector<int64_t>& shape) {
  const int rank = static_cast<int>(shape.size());
  int64_t stride = 1;
  for (int i = 0; i < rank; ++i) {
    const int64_t e = shape[static_cast<size_t>(rank - 1 - i)];
    if (e > std::numeric_limits<int32_t>::max() || stride > std::numeric_limits<int32_t>::max()) {
      throw BackendError("device cache: an extent of " + std::to_string(e) + " exceeds Halide's int32 indexing");
    }
    dims[i] = halide_dimension_t(0, static_cast<int32_t>(e), static_cast<int32_t>(stride));
    stride *= e;
  }
  return rank;
}

// The first row i (in row order) whose key an earlier row has: keys[i] = (key, i), sorted here.
inline int64_t first_repeated_key(std::vector<std::pair<int64_t, int64_t>>& keys) {
  std::sort(keys.begin(), keys.end());
  int64_t first = -1;
  for (size_t j = 1; j < keys.size(); ++j) {
    if (keys[j].first == keys[j - 1].first && (first < 0 || keys[j].second < first)) first = keys[j].second;
  }
  return first;
}

// The most one Vulkan descriptor may bind on every device present.
inline int64_t vulkan_range_bytes() { return (vulkan_max_buffer_floats() + 16) * 4 - 64; }

}  // namespace kvouter::halide::device_detail
