// The tile arrays that the Halide forward and combine pipelines read, defined once for both the
// runtime (which fills them) and the generators (which declare them as inputs).
//
// All arrays are dense, row-major (C order). Halide lists dimensions innermost first, so a C-order
// array [num_tiles, T] is a Halide buffer (edge, tile).
//
//   tile_head   int32 [num_tiles]            KV head of the tile's work unit
//   tile_pages  int32 [num_tiles, ppb]       physical page of each page of the block, or kNoPage
//                                            (unallocated, or wholly at/after L_b)
//   tile_query  int32 [num_tiles, T]         query token of each edge, kNoQuery for padding
//   tile_limit  int32 [num_tiles, T]         the edge attends block positions [0, limit): the
//                                            tighter of L_b and its causal bound; 0 for padding
//   partial_index int32 [Tq, Hkv, topk]      (query, KV head, rank) -> partial row tile*T + edge,
//                                            or kNoPartial (padding, duplicate, dropped, pruned)
//
// Partials (forward output, combine input), packed so that one pipeline stage writes them all:
//   partials f32 [num_tiles * T, qhead, D + 2]   per (tile edge, head lane):
//     [0, D)  o: unnormalised sum_p exp(s_p - m) v_p
//     D       m: max of the scaled scores (kMaskedScore if the partial attends nothing)
//     D + 1   l: sum_p exp(s_p - m)
//   Halide sees it as (c, row, tile) with row = edge * qhead + lane, or as (c, lane, partial).
#pragma once

#include <cstdint>

namespace kvouter::layout {

constexpr int32_t kNoPage = -1;
constexpr int32_t kNoQuery = -1;
constexpr int32_t kNoPartial = -1;
// Masked scores use a large finite negative value instead of -inf: GPU backends do not promise
// IEEE infinities inside kernels. A partial whose m stays at or below kEmptyThreshold is empty.
constexpr float kMaskedScore = -1.0e30f;
constexpr float kEmptyThreshold = -1.0e29f;
// Extra channels after D in a packed partial row.
constexpr int kPartialExtra = 2;

}  // namespace kvouter::layout
