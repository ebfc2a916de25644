// SPEC §3: every violation is an InputError naming the field, the expected and the actual value.
#include <cmath>
#include <limits>
#include <sstream>

#include "kvouter/errors.h"
#include "kvouter/inputs.h"

namespace kvouter {

std::string shape_str(const std::vector<int64_t>& shape) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < shape.size(); ++i) os << (i ? ", " : "") << shape[i];
  os << "]";
  return os.str();
}

namespace {

// The largest of n entries (INT32_MIN for none): one vectorised pass over an index array; the
// entry a check refuses is then looked for only where one exists.
int32_t max_entry(const int32_t* a, int64_t n) {
  int32_t m = std::numeric_limits<int32_t>::min();
  for (int64_t i = 0; i < n; ++i) m = a[i] > m ? a[i] : m;
  return m;
}

std::string str(int64_t v) { return std::to_string(v); }

// Shape product with overflow checking, and agreement with the stored element count.
template <class T>
void check_tensor(const char* field, const Tensor<T>& t, int rank) {
  if (t.rank() != rank) {
    throw InputError(field, std::to_string(rank) + " dimensions",
                     std::to_string(t.rank()) + " (shape " + shape_str(t.shape) + ")");
  }
  int64_t n = 1;
  for (int64_t e : t.shape) {
    if (e < 0) throw InputError(field, "non-negative extents", shape_str(t.shape));
    if (__builtin_mul_overflow(n, e, &n)) {
      throw InputError(field, "a shape whose element count fits in 64 bits", shape_str(t.shape));
    }
  }
  if (__builtin_mul_overflow(n, static_cast<int64_t>(sizeof(T)), &n) ||
      n / static_cast<int64_t>(sizeof(T)) != static_cast<int64_t>(t.data.size())) {
    throw InputError(field, "data of " + str(static_cast<int64_t>(t.data.size())) + " elements",
                     "shape " + shape_str(t.shape));
  }
}

template <class T>
TensorView<const T> view_of(const char* field, const Tensor<T>& t, int rank) {
  check_tensor(field, t, rank);
  TensorView<const T> v;
  v.data = t.data.data();
  v.rank = rank;
  for (int i = 0; i < rank; ++i) v.shape[static_cast<size_t>(i)] = t.shape[static_cast<size_t>(i)];
  v.set_row_major_strides();
  return v;
}

// A view: its rank, extents (count and bytes within 64 bits), row-major contiguous strides, and
// data behind any element.
template <class T>
void check_view(const char* field, const TensorView<T>& v, int rank, int64_t element_bytes = sizeof(T)) {
  if (v.rank != rank) {
    throw InputError(field, std::to_string(rank) + " dimensions", std::to_string(v.rank));
  }
  int64_t n = 1;
  for (int i = 0; i < rank; ++i) {
    const int64_t e = v.shape[static_cast<size_t>(i)];
    if (e < 0) throw InputError(field, "non-negative extents", shape_str(v));
    if (__builtin_mul_overflow(n, e, &n)) {
      throw InputError(field, "a shape whose element count fits in 64 bits", shape_str(v));
    }
  }
  if (__builtin_mul_overflow(n, element_bytes, &n)) {
    throw InputError(field, "a shape whose byte count fits in 64 bits", shape_str(v));
  }
  if (!v.row_major()) {
    std::string strides;
    for (int i = 0; i < rank; ++i) strides += (i ? ", " : "") + str(v.strides[static_cast<size_t>(i)]);
    throw InputError(field, "a row-major contiguous view of shape " + shape_str(v), "strides [" + strides + "]");
  }
  if (n > 0 && v.data == nullptr) throw InputError(field, "data for " + str(n / element_bytes) + " elements", "a null pointer");
}

// q, K or V in storage: the view of the values (float32) or of the bits (16-bit dtypes).
StorageView storage_view_of(const char* field, const Tensor<float>& values, const Tensor<uint16_t>& bits, Dtype dtype, int rank) {
  if (dtype == Dtype::kFloat32) return StorageView(view_of(field, values, rank));
  if (!dtype_known(dtype)) throw InputError("dtype", "float32, float16 or bfloat16", dtype_name(dtype));
  const std::string bits_field = std::string(field) + " (" + dtype_name(dtype) + " bits)";
  return StorageView(view_of(bits_field.c_str(), bits, rank), dtype);
}

void expect_dim(const char* field, const char* what, int64_t expected, int64_t actual) {
  if (expected != actual) throw InputError(std::string(field) + " " + what, str(expected), str(actual));
}

}  // namespace

InputsView::InputsView(const Inputs& in)
    : q(storage_view_of("q", in.q, in.q_bits, in.dtype, 3)),
      k_pages(storage_view_of("k_pages", in.k_pages, in.k_bits, in.dtype, 4)),
      v_pages(storage_view_of("v_pages", in.v_pages, in.v_bits, in.dtype, 4)),
      selected(view_of("selected", in.selected, 3)),
      block_tables(view_of("block_tables", in.block_tables, 2)),
      cu_seqlens_q(view_of("cu_seqlens_q", in.cu_seqlens_q, 1)),
      block_size(in.block_size),
      page_size(in.page_size),
      causal(in.causal),
      softmax_scale(in.softmax_scale) {
  if (in.used_kv_lens) used_kv_lens = view_of("used_kv_lens", *in.used_kv_lens, 1);
}

void Inputs::store_as(Dtype t) {
  if (!dtype_known(t)) throw InputError("dtype", "float32, float16 or bfloat16", dtype_name(t));
  dtype = t;
  for (auto [values, bits] : {std::pair{&q, &q_bits}, {&k_pages, &k_bits}, {&v_pages, &v_bits}}) {
    if (t == Dtype::kFloat32) {
      *bits = Tensor<uint16_t>();
      continue;
    }
    bits->shape = values->shape;
    bits->data.resize(values->data.size());
    for (size_t i = 0; i < values->data.size(); ++i) {
      const uint16_t b = t == Dtype::kFloat16 ? float_to_half(values->data[i]) : float_to_bf16(values->data[i]);
      bits->data[i] = b;
      values->data[i] = t == Dtype::kFloat16 ? half_to_float(b) : bf16_to_float(b);
    }
  }
}

Problem validate(const InputsView& in) {
  Problem p;
  validate(in, &p, true);
  return p;
}

void validate(const InputsView& in, Problem* out, bool check_block_tables) {
  Problem& p = *out;
  // SPEC section 1: one storage dtype, one of the three.
  if (!dtype_known(in.q.dtype)) throw InputError("q dtype", "float32, float16 or bfloat16", dtype_name(in.q.dtype));
  if (in.k_pages.dtype != in.q.dtype) {
    throw InputError("k_pages dtype", "q's dtype " + dtype_name(in.q.dtype), dtype_name(in.k_pages.dtype));
  }
  if (in.v_pages.dtype != in.q.dtype) {
    throw InputError("v_pages dtype", "q's dtype " + dtype_name(in.q.dtype), dtype_name(in.v_pages.dtype));
  }
  check_view("q", in.q, 3, in.q.element_bytes());
  check_view("k_pages", in.k_pages, 4, in.k_pages.element_bytes());
  check_view("v_pages", in.v_pages, 4, in.v_pages.element_bytes());
  p.dtype = in.q.dtype;
  check_view("selected", in.selected, 3);
  check_view("block_tables", in.block_tables, 2);
  check_view("cu_seqlens_q", in.cu_seqlens_q, 1);
  if (in.used_kv_lens) check_view("used_kv_lens", *in.used_kv_lens, 1);

  p.Tq = in.q.dim(0);
  p.Hq = in.q.dim(1);
  p.D = in.q.dim(2);
  p.num_pages = in.k_pages.dim(0);
  p.Hkv = in.k_pages.dim(1);
  p.page_size = in.page_size;
  p.block_size = in.block_size;
  p.topk = in.selected.dim(2);
  p.B = in.block_tables.dim(0);
  p.max_pages = in.block_tables.dim(1);
  p.causal = in.causal;

  if (in.v_pages.shape != in.k_pages.shape) {
    throw InputError("v_pages.shape", "the shape of k_pages " + shape_str(in.k_pages), shape_str(in.v_pages));
  }
  if (p.Hkv == 0) throw InputError("k_pages.shape[1] (Hkv)", "a positive number of KV heads", "0");
  if (p.D == 0) throw InputError("q.shape[2] (D)", "a positive head dimension", "0");
  if (p.topk == 0) throw InputError("selected.shape[2] (topk)", "a positive topk", "0");
  if (p.Hq == 0 || p.Hq % p.Hkv != 0) {
    throw InputError("q.shape[1] (Hq)", "a positive multiple of Hkv = " + str(p.Hkv), str(p.Hq));
  }
  p.qhead = p.Hq / p.Hkv;
  expect_dim("k_pages.shape[3]", "(D, from q)", p.D, in.k_pages.dim(3));
  if (p.page_size <= 0) throw InputError("page_size", "a positive integer", str(p.page_size));
  expect_dim("k_pages.shape[2]", "(page_size)", p.page_size, in.k_pages.dim(2));
  if (p.block_size <= 0 || p.block_size % p.page_size != 0) {
    throw InputError("block_size", "a positive multiple of page_size = " + str(p.page_size),
                     str(p.block_size));
  }
  p.ppb = p.block_size / p.page_size;
  p.msb = p.max_pages / p.ppb;
  expect_dim("selected.shape[0]", "(Tq, from q)", p.Tq, in.selected.dim(0));
  expect_dim("selected.shape[1]", "(Hkv, from k_pages)", p.Hkv, in.selected.dim(1));
  // An empty block_tables ([B, 0]) may claim any B, even one where B + 1 overflows.
  int64_t batch_plus_one = 0;
  if (__builtin_add_overflow(p.B, 1, &batch_plus_one)) {
    throw InputError("block_tables.shape[0] (B)", "a batch size below 2^63 - 1", str(p.B));
  }
  expect_dim("cu_seqlens_q.shape[0]", "(B + 1, from block_tables)", batch_plus_one,
             in.cu_seqlens_q.dim(0));
  if (in.used_kv_lens) {
    expect_dim("used_kv_lens.shape[0]", "(B, from block_tables)", p.B, in.used_kv_lens->dim(0));
  }
  // Index arrays are int32 on the device: keep every count they hold in range.
  const int64_t i32max = std::numeric_limits<int32_t>::max();
  if (p.Tq > i32max) throw InputError("q.shape[0] (Tq)", "at most " + str(i32max), str(p.Tq));
  int64_t positions = 0;
  if (__builtin_mul_overflow(p.msb, p.block_size, &positions) || positions > i32max) {
    throw InputError("block_tables.shape[1] * page_size", "at most " + str(i32max) + " positions",
                     "overflow");
  }

  const auto& cu = in.cu_seqlens_q.data;
  if (cu[0] != 0) throw InputError("cu_seqlens_q[0]", "0", str(cu[0]));
  for (int64_t b = 0; b < p.B; ++b) {
    if (cu[b + 1] < cu[b]) {
      throw InputError("cu_seqlens_q[" + str(b + 1) + "]",
                       "a non-decreasing value >= " + str(cu[b]), str(cu[b + 1]));
    }
  }
  if (cu[p.B] != p.Tq) {
    throw InputError("cu_seqlens_q[" + str(p.B) + "]", "Tq = " + str(p.Tq), str(cu[p.B]));
  }
  p.cu.assign(cu, cu + p.B + 1);

  const int64_t max_len = p.msb * p.block_size;
  p.kv_len.resize(static_cast<size_t>(p.B));
  for (int64_t b = 0; b < p.B; ++b) {
    int64_t L = max_len;
    if (in.used_kv_lens) {
      L = in.used_kv_lens->data[static_cast<size_t>(b)];
      if (L < 0 || L > max_len) {
        throw InputError("used_kv_lens[" + str(b) + "]",
                         "a value in [0, msb * block_size = " + str(max_len) + "]", str(L));
      }
    }
    p.kv_len[static_cast<size_t>(b)] = L;
    // Every page that covers a position p < L must be a valid physical page (or negative).
    if (!check_block_tables) continue;
    const int64_t pages_used = (L + p.page_size - 1) / p.page_size;
    const int32_t* const table = in.block_tables.data + b * p.max_pages;
    if (max_entry(table, pages_used) < p.num_pages) continue;
    for (int64_t lp = 0; lp < pages_used; ++lp) {
      const int32_t page = in.block_tables.data[static_cast<size_t>(b * p.max_pages + lp)];
      if (page >= p.num_pages) {
        throw InputError("block_tables[" + str(b) + ", " + str(lp) + "]",
                         "a page id < num_pages = " + str(p.num_pages) + " (or negative)",
                         str(page));
      }
    }
  }

  if (max_entry(in.selected.data, in.selected.numel()) >= p.msb) {  // find the first
    for (int64_t i = 0; i < in.selected.numel(); ++i) {
      const int32_t id = in.selected.data[static_cast<size_t>(i)];
      if (id >= p.msb) {
        const int64_t t = i / (p.Hkv * p.topk), h = (i / p.topk) % p.Hkv, r = i % p.topk;
        throw InputError("selected[" + str(t) + ", " + str(h) + ", " + str(r) + "]",
                         "a block id < msb = " + str(p.msb) + " (or negative padding)", str(id));
      }
    }
  }

  if (in.softmax_scale) {
    if (!std::isfinite(*in.softmax_scale)) {
      throw InputError("softmax_scale", "a finite value", std::to_string(*in.softmax_scale));
    }
    p.scale = *in.softmax_scale;
  } else {
    p.scale = 1.0f / std::sqrt(static_cast<float>(p.D));
  }
}

}  // namespace kvouter
