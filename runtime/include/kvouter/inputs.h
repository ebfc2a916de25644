// The inputs of SPEC §1 and the sizes derived from them once validated.
#pragma once

#include <optional>

#include "kvouter/tensor.h"

namespace kvouter {

struct Inputs {
  // The values of q, K and V, as float32: the stored values when dtype is float32, else the 16-bit
  // values widened exactly (what a reference computes from).
  Tensor<float> q;                         // [Tq, Hq, D]
  Tensor<float> k_pages;                   // [num_pages, Hkv, page_size, D]
  Tensor<float> v_pages;                   // [num_pages, Hkv, page_size, D]
  // The storage dtype (SPEC section 1). For float16 and bfloat16 the stored bits, of the shapes
  // above, are what the backends read.
  Dtype dtype = Dtype::kFloat32;
  Tensor<uint16_t> q_bits, k_bits, v_bits;
  Tensor<int32_t> selected;                // [Tq, Hkv, topk], negative = padding
  Tensor<int32_t> block_tables;            // [B, max_pages], negative = unallocated
  Tensor<int64_t> cu_seqlens_q;            // [B + 1]
  std::optional<Tensor<int32_t>> used_kv_lens;  // [B]
  int64_t block_size = 0;
  int64_t page_size = 0;
  bool causal = false;
  std::optional<float> softmax_scale;

  // Stores q, K and V in `dtype`: each value rounded to it (nearest, ties to even), the bits kept
  // in the *_bits tensors and the float values replaced by the rounded ones. float32 keeps the
  // values and drops any bits.
  void store_as(Dtype dtype);
};

// The same inputs as views of caller memory: what validate(), the planner and every backend read.
// An Inputs converts to it (each tensor's element count checked against its shape, InputError
// naming the field); an engine builds one over its own arrays, and nothing is copied.
struct InputsView {
  StorageView q, k_pages, v_pages;  // one storage dtype for the three (validate checks)
  TensorView<const int32_t> selected, block_tables;
  TensorView<const int64_t> cu_seqlens_q;
  std::optional<TensorView<const int32_t>> used_kv_lens;
  int64_t block_size = 0;
  int64_t page_size = 0;
  bool causal = false;
  std::optional<float> softmax_scale;

  InputsView() = default;
  InputsView(const Inputs& in);  // NOLINT: implicit on purpose, every entry point takes views
};

// Sizes of a validated problem (SPEC §1 "Derived").
struct Problem {
  int64_t Tq = 0, Hq = 0, Hkv = 0, D = 0, qhead = 0;
  int64_t num_pages = 0, page_size = 0, block_size = 0, ppb = 0;
  int64_t topk = 0, B = 0, max_pages = 0, msb = 0;
  bool causal = false;
  float scale = 1.f;
  Dtype dtype = Dtype::kFloat32;  // storage dtype of q, K and V
  std::vector<int64_t> kv_len;  // L_b per sequence

  // Inclusive upper bound of the attended KV positions of local query i of sequence b, before
  // block selection and page masking; -1 when nothing can be attended.
  int64_t last_position(int64_t b, int64_t i) const {
    const int64_t L = kv_len[static_cast<size_t>(b)];
    if (!causal) return L - 1;
    const int64_t qo = qo_len(b);
    const int64_t bound = (L >= qo) ? L - qo + i : i;
    return bound < L - 1 ? bound : L - 1;
  }
  int64_t qo_len(int64_t b) const { return cu[static_cast<size_t>(b) + 1] - cu[static_cast<size_t>(b)]; }
  std::vector<int64_t> cu;  // copy of cu_seqlens_q
};

// Checks every SPEC §3 rule; throws InputError naming the field on the first violation.
Problem validate(const InputsView& in);
// The same into an existing Problem (its vectors reused). With check_block_tables false, the
// page ids of block_tables are not scanned (the caller checked them where it wrote them); every
// other rule is checked.
void validate(const InputsView& in, Problem* p, bool check_block_tables);

}  // namespace kvouter
