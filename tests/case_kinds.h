// The case kinds every backend is checked on (the foundation issue's list), shared by the suites.
#pragma once

#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "case_gen.h"

namespace kvouter::testing {

// The name of a (schedule, (case kind, spec)) test parameter: "<schedule>_<kind>".
struct ScheduleKindName {
  template <class Info>
  std::string operator()(const Info& info) const {
    return std::get<0>(info.param) + "_" + std::get<1>(info.param).first;
  }
};

// The 16-bit storage dtypes (SPEC section 1), each case kind is also checked in.
inline std::vector<Dtype> dtypes16() { return {Dtype::kFloat16, Dtype::kBFloat16}; }

// The name of a (schedule, (case kind, spec), dtype) test parameter: "<schedule>_<kind>_<dtype>".
struct ScheduleKindDtypeName {
  template <class Info>
  std::string operator()(const Info& info) const {
    return std::get<0>(info.param) + "_" + std::get<1>(info.param).first + "_" + dtype_name(std::get<2>(info.param));
  }
};

// float32 inputs holding exactly the values of `in` (for 16-bit inputs, the widened values that
// store_as and load_case keep beside the bits): the oracle's input, which never reads the bits.
inline Inputs values_only(Inputs in) {
  in.store_as(Dtype::kFloat32);
  return in;
}

// `in` with every K value made subnormal (scaled by 1e-38: below float32's smallest normal,
// 2^-126 or about 1.2e-38; bfloat16 has float32's exponent range) and q scaled by 1e37, so that
// the logits keep their order of 1 and come from the subnormals alone. A backend that flushes
// subnormal inputs to zero (DAZ, `vdpbf16ps`, a GPU's FTZ mode) gets uniform weights here and is
// off the oracle. Stored back in `dtype` (float32 or bfloat16).
inline Inputs with_subnormal_keys(Inputs in, Dtype dtype) {
  in.store_as(Dtype::kFloat32);
  for (float& x : in.q.data) x *= 1e37f;
  for (float& x : in.k_pages.data) x *= 1e-38f;
  in.store_as(dtype);
  return in;
}

inline std::vector<std::pair<std::string, experiments::CaseSpec>> case_kinds() {
  using experiments::CaseSpec;
  std::vector<std::pair<std::string, CaseSpec>> k;
  auto base = [](uint64_t seed) {
    CaseSpec s;
    s.seed = seed;
    return s;
  };
  {  // GQA, causal with L_b > qo_b
    CaseSpec s = base(1);
    s.qo = {5, 9}; s.kv = {37, 64}; s.Hq = 6; s.Hkv = 2; s.D = 16; s.block_size = 8; s.page_size = 4; s.topk = 3;
    k.emplace_back("gqa_causal_long_kv", s);
  }
  {  // varlen with an empty sequence, causal L_b < qo_b
    CaseSpec s = base(2);
    s.qo = {7, 0, 12}; s.kv = {20, 9, 5}; s.Hq = 4; s.Hkv = 1; s.D = 8; s.block_size = 4; s.page_size = 2; s.topk = 4;
    k.emplace_back("varlen_empty_seq_short_kv", s);
  }
  {  // padding and duplicate ids, non-causal
    CaseSpec s = base(3);
    s.qo = {6, 3}; s.kv = {40, 24}; s.Hq = 4; s.Hkv = 2; s.D = 12; s.block_size = 8; s.page_size = 4; s.topk = 6;
    s.causal = false; s.pad_prob = 0.3; s.dup_prob = 0.4;
    k.emplace_back("padding_duplicates", s);
  }
  {  // negative pages, shared pages between sequences
    CaseSpec s = base(4);
    s.qo = {4, 4, 4}; s.kv = {32, 30, 17}; s.Hq = 2; s.Hkv = 2; s.D = 16; s.block_size = 8; s.page_size = 2; s.topk = 3;
    s.neg_page_prob = 0.3; s.shared_pages = true;
    k.emplace_back("negative_shared_pages", s);
  }
  {  // partial last page and block, topk larger than the blocks available
    CaseSpec s = base(5);
    s.qo = {3, 5}; s.kv = {13, 27}; s.Hq = 4; s.Hkv = 2; s.D = 16; s.block_size = 8; s.page_size = 4; s.topk = 9;
    k.emplace_back("partial_block_topk_gt_blocks", s);
  }
  {  // D = 72, block 256, ragged length 232 (attention-gym's)
    CaseSpec s = base(6);
    s.qo = {9}; s.kv = {232}; s.Hq = 2; s.Hkv = 1; s.D = 72; s.block_size = 256; s.page_size = 64; s.topk = 2;
    k.emplace_back("d72_block256_len232", s);
  }
  {  // custom scale with large logits
    CaseSpec s = base(7);
    s.qo = {8}; s.kv = {48}; s.Hq = 4; s.Hkv = 2; s.D = 16; s.block_size = 16; s.page_size = 8; s.topk = 3;
    s.scale = 3.5f; s.q_scale = 20.f;
    k.emplace_back("custom_scale_large_logits", s);
  }
  {  // no used_kv_lens, max_pages not a multiple of ppb
    CaseSpec s = base(8);
    s.qo = {6, 2}; s.kv = {32, 32}; s.Hq = 4; s.Hkv = 1; s.D = 8; s.block_size = 8; s.page_size = 2; s.topk = 2;
    s.with_used_kv_lens = false; s.extra_pages = 3;
    k.emplace_back("no_used_kv_lens_ragged_table", s);
  }
  {  // rows that end up empty: every page unallocated for one sequence, padding everywhere
    CaseSpec s = base(9);
    s.qo = {4, 3}; s.kv = {16, 16}; s.Hq = 2; s.Hkv = 1; s.D = 8; s.block_size = 8; s.page_size = 4; s.topk = 2;
    s.neg_page_prob = 0.6; s.pad_prob = 0.5;
    k.emplace_back("empty_rows", s);
  }
  {  // blocks beyond L_b dropped (table addresses more blocks than are used)
    CaseSpec s = base(10);
    s.qo = {5}; s.kv = {20}; s.Hq = 2; s.Hkv = 1; s.D = 16; s.block_size = 8; s.page_size = 4; s.topk = 4;
    s.extra_blocks = 3; s.causal = false;
    k.emplace_back("blocks_beyond_len", s);
  }
  {  // SPEC §5's tiny benchmark shape (D = 128)
    CaseSpec s = experiments::named_shape("tiny");
    k.emplace_back("tiny", s);
  }
  return k;
}

}  // namespace kvouter::testing
