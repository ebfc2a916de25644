// A minimal owning, row-major (C order) n-d array (the layout of the .npy files), and the
// non-owning view of memory the caller keeps (an engine's own q, KV pool, tables).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "kvouter/dtype.h"

namespace kvouter {

// AddressSanitizer builds (gcc defines __SANITIZE_ADDRESS__, clang answers __has_feature).
#if defined(__SANITIZE_ADDRESS__)
#define KVOUTER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define KVOUTER_ASAN 1
#endif
#endif

// Arrays of at least this many bytes live in huge-page memory (kvouter/pool_memory.h).
inline constexpr size_t kHugeArrayBytes = size_t{2} << 20;
// 2 MiB-aligned anonymous memory advised for transparent huge pages before its first touch, as
// PoolMemory's; throws std::bad_alloc. Freed with free_huge_array(p, bytes).
void* alloc_huge_array(size_t bytes);
void free_huge_array(void* p, size_t bytes) noexcept;

// Tensor's allocator: an array of kHugeArrayBytes or more (a case's K/V pages, the partials) on
// huge pages, as an engine's KV pool, so that the CLI, the tuner and the sweeps time the kernels
// on the memory the benchmarks and an engine give them (4 KiB pages cost SPEC decode 9 % on the
// Sapphire Rapids-class host, experiments/results/cpu/2026-12-06/cli_huge_pages_xeon.md); smaller
// ones from operator new. Under AddressSanitizer every array comes from operator new, so that
// its bounds stay checked.
template <class T>
struct ArrayAllocator {
  using value_type = T;
  ArrayAllocator() = default;
  template <class U>
  ArrayAllocator(const ArrayAllocator<U>&) noexcept {}  // NOLINT: rebinding, as std::allocator
  T* allocate(size_t n) {
    if (n > SIZE_MAX / sizeof(T)) throw std::bad_array_new_length();
#if !defined(KVOUTER_ASAN)
    if (n * sizeof(T) >= kHugeArrayBytes) return static_cast<T*>(alloc_huge_array(n * sizeof(T)));
#endif
    return std::allocator<T>().allocate(n);
  }
  void deallocate(T* p, size_t n) noexcept {
#if !defined(KVOUTER_ASAN)
    if (n * sizeof(T) >= kHugeArrayBytes) return free_huge_array(p, n * sizeof(T));
#endif
    std::allocator<T>().deallocate(p, n);
  }
  template <class U>
  bool operator==(const ArrayAllocator<U>&) const noexcept { return true; }
  template <class U>
  bool operator!=(const ArrayAllocator<U>&) const noexcept { return false; }
};

// A host array in Tensor's memory.
template <class T>
using HostArray = std::vector<T, ArrayAllocator<T>>;

template <class T>
struct Tensor {
  std::vector<int64_t> shape;
  HostArray<T> data;

  Tensor() = default;
  explicit Tensor(std::vector<int64_t> s, T fill = T{}) : shape(std::move(s)) {
    data.assign(static_cast<size_t>(count(shape)), fill);
  }
  int rank() const { return static_cast<int>(shape.size()); }
  int64_t dim(int i) const { return shape[static_cast<size_t>(i)]; }
  int64_t numel() const { return static_cast<int64_t>(data.size()); }
  T* ptr() { return data.data(); }
  const T* ptr() const { return data.data(); }

  static int64_t count(const std::vector<int64_t>& s) {
    int64_t n = 1;
    for (int64_t e : s) n *= e;
    return n;
  }
};

std::string shape_str(const std::vector<int64_t>& shape);

inline constexpr int kMaxViewRank = 4;

// A view of caller memory: data pointer, shape and strides (in elements). Nothing is copied or
// owned; the memory must outlive every call that reads it. The inputs must be row-major and
// contiguous (validate() names the field otherwise).
template <class T>
struct TensorView {
  T* data = nullptr;
  int rank = 0;
  std::array<int64_t, kMaxViewRank> shape{};
  std::array<int64_t, kMaxViewRank> strides{};

  TensorView() = default;
  // A row-major contiguous view of `shape` (at most kMaxViewRank extents).
  TensorView(T* d, std::initializer_list<int64_t> s) : data(d), rank(static_cast<int>(s.size())) {
    int i = 0;
    for (int64_t e : s) {
      if (i < kMaxViewRank) shape[static_cast<size_t>(i)] = e;
      ++i;
    }
    set_row_major_strides();
  }

  int64_t dim(int i) const { return shape[static_cast<size_t>(i)]; }
  // 0 when any extent is 0 (whatever the others); validate() bounds the product otherwise.
  int64_t numel() const {
    int64_t n = 1;
    for (int i = 0; i < rank; ++i) {
      if (shape[static_cast<size_t>(i)] == 0) return 0;
    }
    for (int i = 0; i < rank; ++i) {
      if (__builtin_mul_overflow(n, shape[static_cast<size_t>(i)], &n)) return -1;
    }
    return n;
  }
  T* ptr() const { return data; }
  std::vector<int64_t> shape_vec() const { return {shape.begin(), shape.begin() + rank}; }
  // Row-major strides: a view with no element is row-major whatever its strides say.
  bool row_major() const {
    if (numel() == 0) return true;
    int64_t expect = 1;
    for (int i = rank - 1; i >= 0; --i) {
      if (shape[static_cast<size_t>(i)] != 1 && strides[static_cast<size_t>(i)] != expect) return false;
      if (__builtin_mul_overflow(expect, shape[static_cast<size_t>(i)], &expect)) return false;
    }
    return true;
  }
  // Strides past 64 bits (possible only beside a zero extent, where nothing is addressed) saturate.
  void set_row_major_strides() {
    int64_t stride = 1;
    for (int i = rank - 1; i >= 0; --i) {
      strides[static_cast<size_t>(i)] = stride;
      if (__builtin_mul_overflow(stride, shape[static_cast<size_t>(i)], &stride)) stride = INT64_MAX;
    }
  }
};

// q, k_pages or v_pages in their storage dtype (SPEC section 1): float32 elements, or the bits of
// float16 / bfloat16 ones (uint16_t).
struct StorageView : TensorView<const void> {
  Dtype dtype = Dtype::kFloat32;

  StorageView() = default;
  StorageView(const float* d, std::initializer_list<int64_t> s) : TensorView<const void>(d, s) {}
  StorageView(const uint16_t* d, std::initializer_list<int64_t> s, Dtype t) : TensorView<const void>(d, s), dtype(t) {}
  StorageView(const TensorView<const float>& v)  // NOLINT: a float32 view is a storage view
      : TensorView<const void>(as_void(v)) {}
  StorageView(const TensorView<const uint16_t>& v, Dtype t) : TensorView<const void>(as_void(v)), dtype(t) {}

  // The elements, as float (float32) or as their bits (the 16-bit dtypes).
  const float* f32() const { return static_cast<const float*>(data); }
  const uint16_t* u16() const { return static_cast<const uint16_t*>(data); }
  int64_t element_bytes() const { return dtype_bytes(dtype); }

 private:
  template <class T>
  static TensorView<const void> as_void(const TensorView<T>& v) {
    TensorView<const void> r;
    r.data = v.data;
    r.rank = v.rank;
    r.shape = v.shape;
    r.strides = v.strides;
    return r;
  }
};

template <class T>
std::string shape_str(const TensorView<T>& v) {
  return shape_str(v.shape_vec());
}

}  // namespace kvouter
