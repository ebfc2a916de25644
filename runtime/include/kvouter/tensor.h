// A minimal owning, row-major (C order) n-d array: the layout of the .npy files.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kvouter {

template <class T>
struct Tensor {
  std::vector<int64_t> shape;
  std::vector<T> data;

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

}  // namespace kvouter
