// The invariants of the CSR index and of the tiles (plan.h, tile_layout.h), checked against a
// brute-force reading of SPEC §2. Every violation aborts.
#pragma once

#include <algorithm>
#include <set>
#include <tuple>

#include "fuzz_common.h"
#include "kvouter/plan.h"
#include "kvouter/tile_layout.h"

namespace kvouter::fuzz {

// SPEC §2 read literally: is KV position pos attended by query t (of sequence b) on KV head h?
// Only positions of blocks that selected[t, h, :] names are asked about.
inline bool spec_attends(const Inputs& in, const Problem& p, int64_t b, int64_t t, int64_t pos) {
  const int64_t L = p.kv_len[static_cast<size_t>(b)];
  if (pos >= L) return false;
  if (in.block_tables.data[static_cast<size_t>(b * p.max_pages + pos / p.page_size)] < 0)
    return false;
  if (!p.causal) return true;
  const int64_t i = t - p.cu[static_cast<size_t>(b)], qo = p.qo_len(b);
  return L >= qo ? pos <= L - qo + i : pos <= i;
}

// Attended positions of block blk for query t, head h, by SPEC §2.
inline int64_t spec_block_count(const Inputs& in, const Problem& p, int64_t b, int64_t t,
                                int64_t blk) {
  int64_t n = 0;
  for (int64_t pos = blk * p.block_size; pos < (blk + 1) * p.block_size; ++pos) {
    n += spec_attends(in, p, b, t, pos);
  }
  return n;
}

inline int64_t batch_of(const Problem& p, int64_t t) {
  int64_t b = 0;
  while (p.cu[static_cast<size_t>(b) + 1] <= t) ++b;
  return b;
}

// Returns the number of attended (t, h, p) triples by brute force.
inline int64_t check_index(const Inputs& in, const Problem& p, const KvIndex& ix) {
  const int64_t units = ix.num_units(), edges = ix.num_edges();
  FUZZ_CHECK(ix.head_unit_begin.size() == static_cast<size_t>(p.Hkv + 1), "head_unit_begin size");
  FUZZ_CHECK(ix.head_unit_begin.front() == 0 && ix.head_unit_begin.back() == units,
             "head_unit_begin ends");
  FUZZ_CHECK(ix.unit_batch.size() == static_cast<size_t>(units) &&
                 ix.unit_block.size() == static_cast<size_t>(units) &&
                 ix.unit_edge_begin.size() == static_cast<size_t>(units + 1),
             "unit array sizes");
  FUZZ_CHECK(ix.edge_rank.size() == static_cast<size_t>(edges) &&
                 ix.edge_limit.size() == static_cast<size_t>(edges),
             "edge array sizes");
  FUZZ_CHECK(ix.inverse.size() == static_cast<size_t>(p.Tq * p.Hkv * p.topk), "inverse size");
  FUZZ_CHECK(ix.unit_edge_begin.front() == 0 && ix.unit_edge_begin.back() == edges,
             "unit_edge_begin ends");

  std::vector<int32_t> inverse(ix.inverse.size(), -1);
  std::set<std::tuple<int64_t, int64_t, int64_t>> unit_keys;  // (h, b, blk)
  std::set<std::tuple<int64_t, int64_t, int64_t>> edge_keys;  // (h, t, blk)
  for (int64_t h = 0; h < p.Hkv; ++h) {
    FUZZ_CHECK(ix.head_unit_begin[h] <= ix.head_unit_begin[h + 1], "head ranges decrease at %lld",
               (long long)h);
    for (int64_t u = ix.head_unit_begin[h]; u < ix.head_unit_begin[h + 1]; ++u) {
      const int64_t b = ix.unit_batch[u], blk = ix.unit_block[u];
      FUZZ_CHECK(ix.unit_head[u] == h, "unit %lld head", (long long)u);
      FUZZ_CHECK(b >= 0 && b < p.B && blk >= 0 && blk < p.msb, "unit %lld (b, blk) out of range",
                 (long long)u);
      FUZZ_CHECK(blk * p.block_size < p.kv_len[static_cast<size_t>(b)],
                 "unit %lld block beyond L_b", (long long)u);
      FUZZ_CHECK(unit_keys.insert({h, b, blk}).second, "unit %lld repeats (h, b, blk)",
                 (long long)u);
      FUZZ_CHECK(ix.unit_edge_begin[u] < ix.unit_edge_begin[u + 1], "unit %lld has no edge",
                 (long long)u);
      for (int64_t e = ix.unit_edge_begin[u]; e < ix.unit_edge_begin[u + 1]; ++e) {
        const int64_t t = ix.edge_query[e], r = ix.edge_rank[e], limit = ix.edge_limit[e];
        FUZZ_CHECK(t >= p.cu[static_cast<size_t>(b)] && t < p.cu[static_cast<size_t>(b) + 1],
                   "edge %lld query %lld outside sequence %lld", (long long)e, (long long)t,
                   (long long)b);
        FUZZ_CHECK(r >= 0 && r < p.topk, "edge %lld rank", (long long)e);
        FUZZ_CHECK(in.selected.data[static_cast<size_t>((t * p.Hkv + h) * p.topk + r)] == blk,
                   "edge %lld does not point at its unit's block", (long long)e);
        if (e > ix.unit_edge_begin[u]) {
          FUZZ_CHECK(std::make_pair(ix.edge_query[e - 1], ix.edge_rank[e - 1]) <
                         std::make_pair(ix.edge_query[e], ix.edge_rank[e]),
                     "edges of unit %lld not in ascending (query, rank) order", (long long)u);
        }
        FUZZ_CHECK(edge_keys.insert({h, t, blk}).second, "block %lld taken twice by query %lld",
                   (long long)blk, (long long)t);
        const int64_t last = p.last_position(b, t - p.cu[static_cast<size_t>(b)]);
        const int64_t want = std::min(p.block_size, last + 1 - blk * p.block_size);
        FUZZ_CHECK(limit == want && limit > 0, "edge %lld limit %lld, want %lld", (long long)e,
                   (long long)limit, (long long)want);
        const size_t slot = static_cast<size_t>((t * p.Hkv + h) * p.topk + r);
        inverse[slot] = static_cast<int32_t>(e);
      }
    }
  }
  FUZZ_CHECK(inverse == ix.inverse, "inverse does not map exactly the edges");

  // Completeness: every (t, h, block) with an attended position has its edge.
  int64_t attended = 0;
  for (int64_t t = 0; t < p.Tq; ++t) {
    const int64_t b = batch_of(p, t);
    for (int64_t h = 0; h < p.Hkv; ++h) {
      std::set<int64_t> ids;
      for (int64_t r = 0; r < p.topk; ++r) {
        const int32_t id = in.selected.data[static_cast<size_t>((t * p.Hkv + h) * p.topk + r)];
        if (id >= 0) ids.insert(id);
      }
      for (int64_t id : ids) {
        const int64_t n = spec_block_count(in, p, b, t, id);
        attended += n;
        if (n > 0)
          FUZZ_CHECK(edge_keys.count({h, t, id}),
                     "attended block %lld of query %lld head %lld has no edge", (long long)id,
                     (long long)t, (long long)h);
      }
    }
  }
  return attended;
}

inline void check_tiles(const Inputs& in, const Problem& p, const KvIndex& ix, const TileSet& ts,
                        int64_t T) {
  FUZZ_CHECK(ts.T == T && ts.ppb == p.ppb, "T / ppb");
  int64_t want_tiles = 0;
  for (int64_t u = 0; u < ix.num_units(); ++u) {
    want_tiles += (ix.unit_edge_begin[u + 1] - ix.unit_edge_begin[u] + T - 1) / T;
  }
  FUZZ_CHECK(ts.num_tiles == want_tiles, "num_tiles %lld, want %lld", (long long)ts.num_tiles,
             (long long)want_tiles);
  const size_t n = static_cast<size_t>(ts.num_tiles);
  FUZZ_CHECK(ts.tile_head.size() == n && ts.tile_unit.size() == n &&
                 ts.tile_pages.size() == n * p.ppb && ts.tile_query.size() == n * T &&
                 ts.tile_limit.size() == n * T,
             "tile array sizes");
  FUZZ_CHECK(ts.partial_index.size() == ix.inverse.size() &&
                 ts.edge_partial.size() == static_cast<size_t>(ix.num_edges()),
             "partial arrays sizes");
  std::vector<int> slot_edges(static_cast<size_t>(ts.num_partials()), 0);
  for (int64_t e = 0; e < ix.num_edges(); ++e) {
    const int64_t slot = ts.edge_partial[e];
    FUZZ_CHECK(slot >= 0 && slot < ts.num_partials(), "edge %lld partial out of range",
               (long long)e);
    FUZZ_CHECK(++slot_edges[static_cast<size_t>(slot)] == 1, "partial %lld shared by two edges",
               (long long)slot);
    FUZZ_CHECK(ts.tile_query[slot] == ix.edge_query[e] && ts.tile_limit[slot] == ix.edge_limit[e],
               "slot %lld edge data", (long long)slot);
    const int64_t tile = slot / T, u = ts.tile_unit[tile];
    FUZZ_CHECK(e >= ix.unit_edge_begin[u] && e < ix.unit_edge_begin[u + 1],
               "edge %lld in a tile of another unit", (long long)e);
  }
  for (int64_t tile = 0; tile < ts.num_tiles; ++tile) {
    const int64_t u = ts.tile_unit[tile];
    FUZZ_CHECK(u >= 0 && u < ix.num_units() && ts.tile_head[tile] == ix.unit_head[u],
               "tile %lld unit/head", (long long)tile);
    const int64_t b = ix.unit_batch[u], blk = ix.unit_block[u],
                  L = p.kv_len[static_cast<size_t>(b)];
    for (int64_t j = 0; j < p.ppb; ++j) {
      const int64_t lp = blk * p.ppb + j;
      const int32_t entry = in.block_tables.data[static_cast<size_t>(b * p.max_pages + lp)];
      const int32_t want = (lp * p.page_size >= L || entry < 0) ? layout::kNoPage : entry;
      FUZZ_CHECK(ts.tile_pages[tile * p.ppb + j] == want, "tile %lld page %lld", (long long)tile,
                 (long long)j);
      if (want != layout::kNoPage)
        FUZZ_CHECK(want < p.num_pages, "tile %lld reads page %d >= num_pages", (long long)tile,
                   want);
    }
    for (int64_t s = 0; s < T; ++s) {
      const int64_t slot = tile * T + s;
      if (!slot_edges[static_cast<size_t>(slot)]) {
        FUZZ_CHECK(ts.tile_query[slot] == layout::kNoQuery && ts.tile_limit[slot] == 0,
                   "padding slot %lld", (long long)slot);
      }
    }
  }
  for (size_t i = 0; i < ix.inverse.size(); ++i) {
    const int32_t want = ix.inverse[i] >= 0 ? ts.edge_partial[static_cast<size_t>(ix.inverse[i])]
                                            : layout::kNoPartial;
    FUZZ_CHECK(ts.partial_index[i] == want, "partial_index[%zu]", i);
  }
}

}  // namespace kvouter::fuzz
