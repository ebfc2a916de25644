#include "kvouter/plan.h"

#include <algorithm>
#include <chrono>
#include <limits>
#include <string>

#include "kvouter/errors.h"
#include "kvouter/tile_layout.h"

namespace kvouter {

namespace {

// Physical page of logical page lp of sequence b, or kNoPage when unallocated or wholly at or after
// L_b (entries there are never read, whatever they hold).
int32_t page_of(const Inputs& in, const Problem& p, int64_t b, int64_t lp) {
  if (lp * p.page_size >= p.kv_len[static_cast<size_t>(b)]) return layout::kNoPage;
  const int32_t page = in.block_tables.data[static_cast<size_t>(b * p.max_pages + lp)];
  return page < 0 ? layout::kNoPage : page;
}

// Positions in [0, limit) of block blk of sequence b that lie on allocated pages.
int64_t attended_in_block(const Inputs& in, const Problem& p, int64_t b, int64_t blk,
                          int64_t limit) {
  int64_t n = 0;
  for (int64_t j = 0; j < p.ppb && j * p.page_size < limit; ++j) {
    if (page_of(in, p, b, blk * p.ppb + j) != layout::kNoPage) {
      n += std::min(p.page_size, limit - j * p.page_size);
    }
  }
  return n;
}

}  // namespace

KvIndex build_kvouter_index(const Inputs& in, const Problem& p) {
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

TileSet build_tiles(const Inputs& in, const Problem& p, const KvIndex& ix, int64_t T, int64_t query_batch) {
  if (T <= 0) throw InputError("tile_edges (T)", "a positive number of edges per tile", std::to_string(T));
  TileSet ts;
  ts.T = T;
  ts.ppb = p.ppb;
  const int64_t Q = query_batch > 0 ? query_batch : std::max<int64_t>(p.Tq, 1);
  ts.query_batch = Q;
  const int64_t batches = std::max<int64_t>((p.Tq + Q - 1) / Q, 1);
  // Tiles never mix batches: a unit's edges (ascending by query) are cut at batch boundaries.
  // Tiles are ordered by batch, then unit; one batch keeps the plain unit order.
  int64_t n = 0;
  {
    std::vector<int64_t> cursor(ix.unit_edge_begin.begin(), ix.unit_edge_begin.end() - (ix.num_units() > 0 ? 1 : 0));
    for (int64_t bt = 0; bt < batches; ++bt) {
      for (int64_t u = 0; u < ix.num_units(); ++u) {
        int64_t e = cursor[u];
        const int64_t e_end = ix.unit_edge_begin[u + 1];
        int64_t count = 0;
        while (e < e_end && (bt == batches - 1 || ix.edge_query[e] < (bt + 1) * Q)) ++e, ++count;
        cursor[u] = e;
        n += (count + T - 1) / T;
      }
    }
  }
  int64_t partials = 0;
  if (__builtin_mul_overflow(n, T, &partials) || partials >= std::numeric_limits<int32_t>::max()) {
    throw InputError("tile_edges (T)", "fewer than 2^31 partial rows", std::to_string(n) + " tiles x " + std::to_string(T));
  }
  ts.num_tiles = n;
  ts.tile_head.resize(static_cast<size_t>(n));
  ts.tile_unit.resize(static_cast<size_t>(n));
  ts.tile_pages.assign(static_cast<size_t>(n * p.ppb), layout::kNoPage);
  ts.tile_query.assign(static_cast<size_t>(n * T), layout::kNoQuery);
  ts.tile_limit.assign(static_cast<size_t>(n * T), 0);
  ts.partial_index.assign(ix.inverse.size(), layout::kNoPartial);
  ts.batch_tile_begin.assign(1, 0);
  std::vector<int32_t>& edge_partial = ts.edge_partial;
  edge_partial.resize(static_cast<size_t>(ix.num_edges()));

  std::vector<int64_t> cursor(ix.unit_edge_begin.begin(), ix.unit_edge_begin.end() - (ix.num_units() > 0 ? 1 : 0));
  int64_t tile = 0;
  for (int64_t bt = 0; bt < batches; ++bt) {
    for (int64_t u = 0; u < ix.num_units(); ++u) {
      const int64_t b = ix.unit_batch[u], blk = ix.unit_block[u];
      int64_t e_end = cursor[u];
      while (e_end < ix.unit_edge_begin[u + 1] && (bt == batches - 1 || ix.edge_query[e_end] < (bt + 1) * Q)) ++e_end;
      for (int64_t e0 = cursor[u]; e0 < e_end; e0 += T, ++tile) {
        ts.tile_head[tile] = ix.unit_head[u];
        ts.tile_unit[tile] = static_cast<int32_t>(u);
        for (int64_t j = 0; j < p.ppb; ++j) {
          ts.tile_pages[tile * p.ppb + j] = page_of(in, p, b, blk * p.ppb + j);
        }
        const int64_t e1 = std::min(e0 + T, e_end);
        for (int64_t e = e0; e < e1; ++e) {
          const int64_t slot = tile * T + (e - e0);
          ts.tile_query[slot] = ix.edge_query[e];
          ts.tile_limit[slot] = ix.edge_limit[e];
          edge_partial[e] = static_cast<int32_t>(slot);
        }
      }
      cursor[u] = e_end;
    }
    ts.batch_tile_begin.push_back(tile);
  }
  for (size_t i = 0; i < ix.inverse.size(); ++i) {
    if (ix.inverse[i] >= 0) ts.partial_index[i] = edge_partial[static_cast<size_t>(ix.inverse[i])];
  }
  return ts;
}

double Plan::kv_unit_bytes() const {
  return 2.0 * static_cast<double>(index.num_units()) * static_cast<double>(problem.block_size) *
         static_cast<double>(problem.D) * sizeof(float);
}

int64_t auto_tile_edges(const KvIndex& ix) {
  if (ix.num_units() == 0) return 16;
  const int64_t mean = (ix.num_edges() + ix.num_units() - 1) / ix.num_units();
  int64_t T = 1;
  while (T < mean && T < 16) T *= 2;
  return T;
}

Plan make_plan(const Inputs& in, const PlanOptions& opt) {
  const auto t0 = std::chrono::steady_clock::now();
  Plan plan;
  plan.problem = validate(in);
  plan.index = build_kvouter_index(in, plan.problem);
  const Problem& p = plan.problem;
  const int64_t T = opt.tile_edges > 0 ? opt.tile_edges : auto_tile_edges(plan.index);
  plan.tiles = build_tiles(in, p, plan.index, T);
  if (opt.max_batch_partial_floats > 0) {
    // Query batches whose partials each fit the limit: start from the even split, halve the
    // batch until every batch fits (tiles cut at batch boundaries add padding rows). A tile's
    // largest device buffer share: its partials, or the GPU schedules' per-tile intermediates
    // (scores and weights: block x rows; the block's K: block x D).
    const int64_t rows = T * p.qhead;
    const int64_t tile_floats = std::max({rows * (p.D + layout::kPartialExtra), p.block_size * rows, p.block_size * p.D});
    auto fits = [&](const TileSet& ts) {
      for (size_t b = 0; b + 1 < ts.batch_tile_begin.size(); ++b) {
        if ((ts.batch_tile_begin[b + 1] - ts.batch_tile_begin[b]) * tile_floats > opt.max_batch_partial_floats) return false;
      }
      return true;
    };
    if (!fits(plan.tiles)) {
      const double total = static_cast<double>(plan.tiles.num_tiles) * static_cast<double>(tile_floats);
      int64_t Q = std::max<int64_t>(1, static_cast<int64_t>(static_cast<double>(p.Tq) * static_cast<double>(opt.max_batch_partial_floats) / total));
      for (;;) {
        plan.tiles = build_tiles(in, p, plan.index, T, Q);
        if (fits(plan.tiles)) break;
        if (Q == 1) {
          throw BackendError("plan: the partials of one query exceed the device's buffer limit of " +
                             std::to_string(opt.max_batch_partial_floats) + " floats");
        }
        Q = std::max<int64_t>(1, Q / 2);
      }
    }
  }
  for (int64_t u = 0; u < plan.index.num_units(); ++u) {
    for (int64_t e = plan.index.unit_edge_begin[u]; e < plan.index.unit_edge_begin[u + 1]; ++e) {
      plan.attended_pairs += attended_in_block(in, p, plan.index.unit_batch[u],
                                               plan.index.unit_block[u], plan.index.edge_limit[e]);
    }
  }
  plan.plan_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  return plan;
}

}  // namespace kvouter
