// Synthetic cases: SPEC §5's named benchmark shapes and randomized cases for the tests.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kvouter/inputs.h"

namespace kvouter::experiments {

struct CaseSpec {
  std::vector<int64_t> qo;      // queries per sequence
  std::vector<int64_t> kv;      // L_b per sequence
  int64_t Hq = 4, Hkv = 2, D = 16, block_size = 8, page_size = 4, topk = 4;
  bool causal = true;
  bool with_used_kv_lens = true;
  bool benchmark_selection = false;  // SPEC §5: own block + block 0 + distinct random earlier ones
  double pad_prob = 0.0;             // chance a selected slot is -1
  double dup_prob = 0.0;             // chance a slot repeats an earlier id of its row
  double neg_page_prob = 0.0;        // chance a logical page is unallocated (-1)
  bool shared_pages = false;         // sequences share physical pages
  int64_t extra_pages = 0;           // extra max_pages columns (need not be a multiple of ppb)
  int64_t extra_blocks = 0;          // table addresses blocks beyond the longest L_b
  std::optional<float> scale;
  float q_scale = 1.f;               // multiplies q (large logits)
  uint64_t seed = 1;
  // The storage dtype (SPEC section 1, section 5): q, K and V drawn as float32 and rounded to it.
  Dtype dtype = Dtype::kFloat32;
  // Only the pages some selection reaches are kept (renumbered densely in pool order, the others
  // -1 in block_tables), each with the values the full pool gives it: the same problem by SPEC §2
  // (an unselected block is never read), without allocating the whole pool (gpu-decode's is
  // 2 x 17 GB, of which the selections reach 2 x 1.9 GB).
  bool reachable_pages_only = false;
};

Inputs make_case(const CaseSpec& spec);

// SPEC §5 shapes: tiny, prefill, decode, gpu-prefill, gpu-decode.
CaseSpec named_shape(const std::string& name);
std::vector<std::string> named_shapes();

}  // namespace kvouter::experiments
