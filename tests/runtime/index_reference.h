// The index as first written, block by block over every block of every sequence (its cost grows
// with the table width, not the edges): the oracle that the planner's linear build is checked
// against, edge for edge, in index_test.
#pragma once

#include <algorithm>
#include <limits>
#include <vector>

#include "kvouter/errors.h"
#include "kvouter/plan.h"
#include "kvouter/tile_layout.h"

namespace kvouter::testing_index {

namespace index_reference_detail {

// Physical page of logical page lp of sequence b, or kNoPage when unallocated or wholly at or after
// L_b (entries there are never read, whatever they hold).
inline int32_t page_of(const Inputs& in, const Problem& p, int64_t b, int64_t lp) {
  if (lp * p.page_size >= p.kv_len[static_cast<size_t>(b)]) return layout::kNoPage;
  const int32_t page = in.block_tables.data[static_cast<size_t>(b * p.max_pages + lp)];
  return page < 0 ? layout::kNoPage : page;
}

// Positions in [0, limit) of block blk of sequence b that lie on allocated pages.
inline int64_t attended_in_block(const Inputs& in, const Problem& p, int64_t b, int64_t blk,
                          int64_t limit) {
  int64_t n = 0;
  for (int64_t j = 0; j < p.ppb && j * p.page_size < limit; ++j) {
    if (page_of(in, p, b, blk * p.ppb + j) != layout::kNoPage) {
      n += std::min(p.page_size, limit - j * p.page_size);
    }
  }
  return n;
}

}  // namespace index_reference_detail

using namespace index_reference_detail;

inline KvIndex reference_kvouter_index(const Inputs& in, const Problem& p) {
  KvIndex ix;
  ix.inverse.assign(static_cast<size_t>(p.Tq * p.Hkv * p.topk), -1);
  ix.head_unit_begin.push_back(0);
  ix.unit_edge_begin.push_back(0);
  if (p.Tq == 0) {
    // No query, no edge. The scratch below is sized by msb, which an empty block_tables
    // ([0, max_pages], found by fuzz_validate_plan) can make 2^31 without holding any data.
    ix.head_unit_begin.assign(static_cast<size_t>(p.Hkv + 1), 0);
    return ix;
  }

  struct Edge {
    int32_t t, r, limit;
  };
  std::vector<std::vector<Edge>> by_block(static_cast<size_t>(p.msb));
  std::vector<int64_t> seen(static_cast<size_t>(p.msb), -1);  // last query that took the block
  std::vector<int8_t> block_empty(static_cast<size_t>(p.msb));

  for (int64_t h = 0; h < p.Hkv; ++h) {
    std::fill(seen.begin(), seen.end(), -1);
    for (int64_t b = 0; b < p.B; ++b) {
      const int64_t L = p.kv_len[static_cast<size_t>(b)];
      for (int64_t blk = 0; blk < p.msb; ++blk) {
        block_empty[static_cast<size_t>(blk)] =
            attended_in_block(in, p, b, blk, std::min(p.block_size, L - blk * p.block_size)) == 0;
      }
      for (int64_t t = p.cu[static_cast<size_t>(b)]; t < p.cu[static_cast<size_t>(b) + 1]; ++t) {
        const int64_t last = p.last_position(b, t - p.cu[static_cast<size_t>(b)]);
        for (int64_t r = 0; r < p.topk; ++r) {
          const int32_t id = in.selected.data[static_cast<size_t>((t * p.Hkv + h) * p.topk + r)];
          if (id < 0) continue;                                        // padding
          if (seen[static_cast<size_t>(id)] == t) continue;            // repeated id counts once
          seen[static_cast<size_t>(id)] = t;
          const int64_t start = id * p.block_size;
          if (start >= L || start > last) continue;                    // beyond L_b / causal future
          if (block_empty[static_cast<size_t>(id)]) continue;         // no allocated page
          const int64_t limit = std::min(p.block_size, last + 1 - start);
          by_block[static_cast<size_t>(id)].push_back(
              {static_cast<int32_t>(t), static_cast<int32_t>(r), static_cast<int32_t>(limit)});
        }
      }
      for (int64_t blk = 0; blk < p.msb; ++blk) {
        auto& edges = by_block[static_cast<size_t>(blk)];
        if (edges.empty()) continue;
        for (const Edge& e : edges) {
          const int64_t id = ix.num_edges();
          if (id >= std::numeric_limits<int32_t>::max()) {
            throw InputError("selected", "fewer than 2^31 attended (query, block) edges",
                             "more");
          }
          ix.inverse[static_cast<size_t>((e.t * p.Hkv + h) * p.topk + e.r)] =
              static_cast<int32_t>(id);
          ix.edge_query.push_back(e.t);
          ix.edge_rank.push_back(e.r);
          ix.edge_limit.push_back(e.limit);
        }
        ix.unit_head.push_back(static_cast<int32_t>(h));
        ix.unit_batch.push_back(static_cast<int32_t>(b));
        ix.unit_block.push_back(static_cast<int32_t>(blk));
        ix.unit_edge_begin.push_back(ix.num_edges());
        edges.clear();
      }
    }
    ix.head_unit_begin.push_back(ix.num_units());
  }
  return ix;
}

}  // namespace kvouter::testing_index
