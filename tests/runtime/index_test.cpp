// build_kvouter_index and build_tiles: dedup, dropping, causal pruning, the inverse map round
// trip, determinism, and the tile arrays; the linear build against the first, block-by-block one
// (index_reference.h); the Planner reused across steps, its checks, and its allocations.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <limits>
#include <new>
#include <thread>

#include "case_gen.h"
#include "case_kinds.h"
#include "HalideBuffer.h"
#include "kvouter/aot.h"
#include "kvouter/aot_kernels.h"
#include "kvouter/errors.h"
#include "kvouter/host_copy.h"
#include "kvouter/plan.h"
#include "allocation_counter.h"
#include "kvouter/tile_layout.h"
#include "runtime/index_reference.h"

namespace kvouter {
namespace {

// One sequence, one head, block 4, page 2: hand-written selections.
Inputs hand_case(std::vector<int32_t> sel, int64_t qo, int64_t L, bool causal, int64_t topk) {
  experiments::CaseSpec s;
  s.qo = {qo};
  s.kv = {L};
  s.Hq = 1; s.Hkv = 1; s.D = 4; s.block_size = 4; s.page_size = 2; s.topk = topk; s.causal = causal;
  s.extra_blocks = 2;  // the table addresses blocks beyond L
  Inputs in = experiments::make_case(s);
  in.selected.data.assign(sel.begin(), sel.end());
  return in;
}

TEST(Index, RepeatedIdCountsOnce) {
  Inputs in = hand_case({1, 1, 0, 1}, 1, 12, false, 4);
  const Problem p = validate(in);
  const KvIndex ix = build_kvouter_index(in, p);
  ASSERT_EQ(ix.num_edges(), 2);
  // The first occurrence of each block is kept, as rank 0 (block 1) and rank 2 (block 0): two
  // different edges, each of the unit of its block; the repeats are dropped.
  ASSERT_GE(ix.inverse[0], 0);
  ASSERT_GE(ix.inverse[2], 0);
  EXPECT_NE(ix.inverse[0], ix.inverse[2]);
  EXPECT_EQ(ix.edge_rank[ix.inverse[0]], 0);
  EXPECT_EQ(ix.edge_rank[ix.inverse[2]], 2);
  auto block_of = [&](int32_t edge) {
    for (int64_t u = 0; u < ix.num_units(); ++u) {
      if (edge >= ix.unit_edge_begin[u] && edge < ix.unit_edge_begin[u + 1]) return ix.unit_block[u];
    }
    return -1;
  };
  EXPECT_EQ(block_of(ix.inverse[0]), 1);
  EXPECT_EQ(block_of(ix.inverse[2]), 0);
  EXPECT_EQ(ix.inverse[1], -1);
  EXPECT_EQ(ix.inverse[3], -1);
}

// fuzz_validate_plan: no sequence, and a table of 0 x (2^31 - 1) pages (no data) made the
// index allocate per-block scratch for 2^31 blocks (16 GiB).
TEST(Index, EmptyBatchWithWideTableAllocatesNothingPerBlock) {
  Inputs in = hand_case({}, 0, 0, false, 1);
  in.cu_seqlens_q.shape = {1};
  in.cu_seqlens_q.data = {0};
  in.used_kv_lens.reset();
  in.block_tables.shape = {0, std::numeric_limits<int32_t>::max()};
  in.block_tables.data.clear();
  in.page_size = in.block_size = 1;
  in.k_pages = Tensor<float>({1, 1, 1, 4});
  in.v_pages = Tensor<float>({1, 1, 1, 4});
  const Problem p = validate(in);
  EXPECT_EQ(p.msb, std::numeric_limits<int32_t>::max());
  const KvIndex ix = build_kvouter_index(in, p);
  EXPECT_EQ(ix.num_units(), 0);
  EXPECT_EQ(ix.head_unit_begin, (std::vector<int64_t>{0, 0}));
  EXPECT_EQ(make_plan(in).tiles.num_tiles, 0);
}

TEST(Index, DropsBlocksBeyondLength) {
  // L = 6: blocks 0 and 1 (positions 4..5 of block 1) exist; block 2 starts at 8 >= L.
  Inputs in = hand_case({2, 1, -1}, 1, 6, false, 3);
  const Problem p = validate(in);
  const KvIndex ix = build_kvouter_index(in, p);
  ASSERT_EQ(ix.num_edges(), 1);
  EXPECT_EQ(ix.inverse[0], -1);
  EXPECT_EQ(ix.edge_limit[ix.inverse[1]], 2);  // partial last block: 2 valid positions
  EXPECT_EQ(ix.inverse[2], -1);
}

TEST(Index, PrunesCausalFutureBlocks) {
  // qo = 3, L = 12, causal: query i attends p <= 9 + i. Block 2 = positions 8..11.
  Inputs in = hand_case({2, 0, 2, 0, 2, 0}, 3, 12, true, 2);
  const Problem p = validate(in);
  const KvIndex ix = build_kvouter_index(in, p);
  EXPECT_EQ(ix.edge_limit[ix.inverse[0]], 2);  // query 0: positions 8, 9
  EXPECT_EQ(ix.edge_limit[ix.inverse[2]], 3);
  EXPECT_EQ(ix.edge_limit[ix.inverse[4]], 4);
  // L < qo: query i attends p <= i, so block 1 (positions 4..7) is pruned for queries 0..3.
  Inputs in2 = hand_case(std::vector<int32_t>(10, 1), 10, 8, true, 1);
  const KvIndex ix2 = build_kvouter_index(in2, validate(in2));
  for (int t = 0; t < 4; ++t) EXPECT_EQ(ix2.inverse[t], -1) << t;
  EXPECT_EQ(ix2.edge_limit[ix2.inverse[4]], 1);
  EXPECT_EQ(ix2.edge_limit[ix2.inverse[5]], 2);
}

TEST(Index, PrunesBlocksWithoutAllocatedPages) {
  Inputs in = hand_case({0, 1}, 1, 8, false, 2);
  in.block_tables.data[2] = -1;  // block 1 = logical pages 2, 3
  in.block_tables.data[3] = -5;
  const KvIndex ix = build_kvouter_index(in, validate(in));
  EXPECT_GE(ix.inverse[0], 0);
  EXPECT_EQ(ix.inverse[1], -1);
}

TEST(Index, InverseRoundTripAndOrderOnEveryKind) {
  for (const auto& [name, spec] : testing::case_kinds()) {
    Inputs in = experiments::make_case(spec);
    const Problem p = validate(in);
    const KvIndex ix = build_kvouter_index(in, p);
    SCOPED_TRACE(name);
    std::vector<int> hits(static_cast<size_t>(ix.num_edges()), 0);
    for (int64_t i = 0; i < static_cast<int64_t>(ix.inverse.size()); ++i) {
      const int32_t e = ix.inverse[i];
      if (e < 0) continue;
      ++hits[e];
      const int64_t t = i / (p.Hkv * p.topk), r = i % p.topk;
      EXPECT_EQ(ix.edge_query[e], t);
      EXPECT_EQ(ix.edge_rank[e], r);
    }
    for (int h : hits) EXPECT_EQ(h, 1);
    for (int64_t u = 0; u < ix.num_units(); ++u) {
      EXPECT_LT(ix.unit_edge_begin[u], ix.unit_edge_begin[u + 1]);  // no empty unit
      for (int64_t e = ix.unit_edge_begin[u] + 1; e < ix.unit_edge_begin[u + 1]; ++e) {
        EXPECT_LT(ix.edge_query[e - 1], ix.edge_query[e]);  // ascending, one edge per query
      }
      for (int64_t e = ix.unit_edge_begin[u]; e < ix.unit_edge_begin[u + 1]; ++e) {
        EXPECT_GT(ix.edge_limit[e], 0);
        EXPECT_LE(ix.edge_limit[e], p.block_size);
      }
    }
    // Determinism: a second build is identical.
    const KvIndex again = build_kvouter_index(in, p);
    EXPECT_EQ(again.edge_query, ix.edge_query);
    EXPECT_EQ(again.inverse, ix.inverse);
    EXPECT_EQ(again.unit_block, ix.unit_block);
  }
}

TEST(Tiles, CoverEveryEdgeOnceWithPadding) {
  for (const auto& [name, spec] : testing::case_kinds()) {
    Inputs in = experiments::make_case(spec);
    const Problem p = validate(in);
    const KvIndex ix = build_kvouter_index(in, p);
    for (int64_t T : {1, 3, 16}) {
      SCOPED_TRACE(name + " T=" + std::to_string(T));
      const TileSet ts = build_tiles(p, ix, T);
      int64_t real = 0;
      for (int64_t s = 0; s < ts.num_partials(); ++s) {
        if (ts.tile_query[s] == layout::kNoQuery) {
          EXPECT_EQ(ts.tile_limit[s], 0);
        } else {
          ++real;
        }
      }
      EXPECT_EQ(real, ix.num_edges());
      for (size_t i = 0; i < ix.inverse.size(); ++i) {
        if (ix.inverse[i] < 0) {
          EXPECT_EQ(ts.partial_index[i], layout::kNoPartial);
          continue;
        }
        const int32_t slot = ts.partial_index[i];
        EXPECT_EQ(ts.tile_query[slot], ix.edge_query[ix.inverse[i]]);
        EXPECT_EQ(ts.tile_head[slot / T], ix.unit_head[ts.tile_unit[slot / T]]);
      }
      for (int32_t page : ts.tile_pages) EXPECT_LT(page, p.num_pages);
    }
  }
}

TEST(Tiles, QueryBatchesKeepTheirPartialsApart) {
  for (const auto& [name, spec] : testing::case_kinds()) {
    Inputs in = experiments::make_case(spec);
    const Problem p = validate(in);
    const KvIndex ix = build_kvouter_index(in, p);
    const TileSet whole = build_tiles(p, ix, 4);
    ASSERT_EQ(whole.batch_tile_begin, (std::vector<int64_t>{0, whole.num_tiles}));
    for (int64_t Q : {1, 3, 7}) {
      SCOPED_TRACE(name + " Q=" + std::to_string(Q));
      const TileSet ts = build_tiles(p, ix, 4, Q);
      ASSERT_EQ(ts.query_batch, Q);
      ASSERT_EQ(ts.batch_tile_begin.front(), 0);
      ASSERT_EQ(ts.batch_tile_begin.back(), ts.num_tiles);
      int64_t real = 0;
      for (size_t b = 0; b + 1 < ts.batch_tile_begin.size(); ++b) {
        for (int64_t s = ts.batch_tile_begin[b] * ts.T; s < ts.batch_tile_begin[b + 1] * ts.T; ++s) {
          if (ts.tile_query[s] == layout::kNoQuery) continue;
          ++real;
          EXPECT_EQ(ts.tile_query[s] / Q, static_cast<int32_t>(b)) << "slot " << s;
        }
      }
      EXPECT_EQ(real, ix.num_edges());
      for (size_t i = 0; i < ix.inverse.size(); ++i) {
        if (ix.inverse[i] < 0) continue;
        const int64_t t = static_cast<int64_t>(i) / (p.Hkv * p.topk), slot = ts.partial_index[i];
        EXPECT_EQ(ts.tile_query[slot], t);
        EXPECT_GE(slot / ts.T, ts.batch_tile_begin[t / Q]);
        EXPECT_LT(slot / ts.T, ts.batch_tile_begin[t / Q + 1]);
      }
    }
  }
}

TEST(Plan, BatchesQueriesToFitAPartialLimit) {
  Inputs in = experiments::make_case(experiments::named_shape("tiny"));
  const Plan whole = make_plan(in, {4});
  const int64_t row = whole.problem.qhead * (whole.problem.D + layout::kPartialExtra);
  const int64_t limit = whole.tiles.num_partials() * row / 5;
  const Plan split = make_plan(in, {4, limit});
  ASSERT_GT(split.tiles.batch_tile_begin.size(), 2u);
  for (size_t b = 0; b + 1 < split.tiles.batch_tile_begin.size(); ++b) {
    EXPECT_LE((split.tiles.batch_tile_begin[b + 1] - split.tiles.batch_tile_begin[b]) * split.tiles.T * row, limit);
  }
  EXPECT_EQ(split.attended_pairs, whole.attended_pairs);
  EXPECT_THROW(make_plan(in, {4, row - 1}), BackendError);
}

TEST(Plan, FlopsCountAttendedTriples) {
  // Non-causal, one query, blocks 0 and 1 of L = 6 (4 + 2 positions), qhead 1, D 4.
  Inputs in = hand_case({0, 1}, 1, 6, false, 2);
  const Plan plan = make_plan(in);
  EXPECT_EQ(plan.attended_pairs, 6);
  EXPECT_DOUBLE_EQ(plan.flops(), 4.0 * 4 * 6);
}

}  // namespace
}  // namespace kvouter

namespace kvouter {
namespace {

// Variations of every case kind: padding, repeated ids, unallocated pages, shared pages, causal
// and not, several seeds.
std::vector<std::pair<std::string, experiments::CaseSpec>> varied_kinds() {
  std::vector<std::pair<std::string, experiments::CaseSpec>> out;
  auto kinds = testing::case_kinds();
  {  // decode: one query per sequence (the planner's one-query path) beside longer and empty ones
    experiments::CaseSpec s;
    s.qo = {1, 1, 3, 1, 0, 1, 1}; s.kv = {37, 64, 20, 5, 9, 130, 1}; s.Hq = 4; s.Hkv = 2; s.D = 8;
    s.block_size = 8; s.page_size = 4; s.topk = 5;
    kinds.emplace_back("decode_mixed", s);
  }
  {  // decode over spans of many 64-block words
    experiments::CaseSpec s;
    s.qo = {1, 1}; s.kv = {700, 1000}; s.Hq = 2; s.Hkv = 2; s.D = 8; s.block_size = 4; s.page_size = 2;
    s.topk = 7;
    kinds.emplace_back("decode_wide", s);
  }
  for (const auto& [name, spec] : kinds) {
    for (uint64_t seed : {11u, 12u}) {
      experiments::CaseSpec s = spec;
      s.seed = seed;
      s.pad_prob = seed == 11 ? 0.2 : 0.0;
      s.dup_prob = seed == 11 ? 0.2 : 0.05;
      s.neg_page_prob = seed == 12 ? 0.25 : s.neg_page_prob;
      s.causal = seed == 11 ? s.causal : !s.causal;
      out.emplace_back(name + " seed " + std::to_string(seed), s);
    }
  }
  return out;
}

void expect_same_index(const KvIndex& a, const KvIndex& b) {
  EXPECT_EQ(a.head_unit_begin, b.head_unit_begin);
  EXPECT_EQ(a.unit_head, b.unit_head);
  EXPECT_EQ(a.unit_batch, b.unit_batch);
  EXPECT_EQ(a.unit_block, b.unit_block);
  EXPECT_EQ(a.unit_edge_begin, b.unit_edge_begin);
  EXPECT_EQ(a.edge_query, b.edge_query);
  EXPECT_EQ(a.edge_rank, b.edge_rank);
  EXPECT_EQ(a.edge_limit, b.edge_limit);
  EXPECT_EQ(a.inverse, b.inverse);
}

void expect_same_plan(const Plan& a, const Plan& b) {
  expect_same_index(a.index, b.index);
  EXPECT_EQ(a.index.unit_pages, b.index.unit_pages);
  EXPECT_EQ(a.attended_pairs, b.attended_pairs);
  EXPECT_EQ(a.tiles.T, b.tiles.T);
  EXPECT_EQ(a.tiles.num_tiles, b.tiles.num_tiles);
  EXPECT_EQ(a.tiles.tile_head, b.tiles.tile_head);
  EXPECT_EQ(a.tiles.tile_unit, b.tiles.tile_unit);
  EXPECT_EQ(a.tiles.tile_pages, b.tiles.tile_pages);
  EXPECT_EQ(a.tiles.tile_query, b.tiles.tile_query);
  EXPECT_EQ(a.tiles.tile_limit, b.tiles.tile_limit);
  EXPECT_EQ(a.tiles.partial_index, b.tiles.partial_index);
  EXPECT_EQ(a.tiles.batch_tile_begin, b.tiles.batch_tile_begin);
  EXPECT_EQ(a.problem.kv_len, b.problem.kv_len);
  EXPECT_EQ(a.problem.cu, b.problem.cu);
}

TEST(Index, LinearBuildMatchesTheBlockByBlockBuild) {
  for (const auto& [name, spec] : varied_kinds()) {
    SCOPED_TRACE(name);
    const Inputs in = experiments::make_case(spec);
    const Problem p = validate(in);
    const KvIndex ix = build_kvouter_index(in, p);
    expect_same_index(ix, testing_index::reference_kvouter_index(in, p));
    // Each unit's pages and the attended pairs, as the first build's page_of and
    // attended_in_block give them.
    int64_t attended = 0;
    for (int64_t u = 0; u < ix.num_units(); ++u) {
      for (int64_t j = 0; j < p.ppb; ++j) {
        EXPECT_EQ(ix.unit_pages[u * p.ppb + j],
                  testing_index::page_of(in, p, ix.unit_batch[u], ix.unit_block[u] * p.ppb + j));
      }
      for (int64_t e = ix.unit_edge_begin[u]; e < ix.unit_edge_begin[u + 1]; ++e) {
        attended += testing_index::attended_in_block(in, p, ix.unit_batch[u], ix.unit_block[u], ix.edge_limit[e]);
      }
    }
    EXPECT_EQ(ix.attended_pairs, attended);
  }
}

TEST(Planner, ReusedAcrossStepsOfChangingShapesGivesFreshPlans) {
  // One planner through steps that grow, shrink and change geometry: each plan equals a fresh one.
  Planner planner;
  Planner batched(PlanOptions{0, 1 << 16});
  const auto kinds = varied_kinds();
  for (size_t i = 0; i < kinds.size(); ++i) {
    const auto& [name, spec] = kinds[(i * 7) % kinds.size()];
    SCOPED_TRACE(name);
    const Inputs in = experiments::make_case(spec);
    expect_same_plan(planner.plan(in), make_plan(in));
    expect_same_plan(planner.plan_checked_tables(in), make_plan(in));
    expect_same_plan(batched.plan(in), make_plan(in, PlanOptions{0, 1 << 16}));
  }
}

TEST(Planner, ChecksTheTableEntriesASelectionReaches) {
  Inputs in = hand_case({1, 0}, 1, 12, false, 2);
  Planner planner;
  planner.plan_checked_tables(in);
  // A page id past the pool in block 1 (logical pages 2 and 3), which the selection reaches.
  in.block_tables.data[3] = 1000;
  for (bool full : {true, false}) {
    try {
      full ? planner.plan(in) : planner.plan_checked_tables(in);
      ADD_FAILURE() << "no error for a page id past the pool";
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find("block_tables[0, 3]"), std::string::npos) << e.what();
    }
  }
  // An entry no selection reaches is checked by plan() only (the caller vouches for the tables).
  in.block_tables.data[3] = 0;
  in.selected.data = {0, -1};
  in.block_tables.data[4] = 1000;  // block 2
  EXPECT_THROW(planner.plan(in), InputError);
  EXPECT_NO_THROW(planner.plan_checked_tables(in));
}

TEST(Planner, APlanAfterABadEntryIsAFreshPlan) {
  // Decode sequences are scanned ahead of their units (plan.cpp's ring): a bad page id met while
  // sequence 0's units are written leaves sequences 1 and 2 scanned. The planner's next step, with
  // other selections there, must plan what a fresh planner plans.
  experiments::CaseSpec s = experiments::named_shape("decode");
  s.D = 1;  // the plan never reads K/V
  s.kv = std::vector<int64_t>(s.kv.size(), 4096);
  Inputs in = experiments::make_case(s);
  const int64_t Hkv = in.selected.shape[1], topk = in.selected.shape[2], ppb = s.block_size / s.page_size;
  for (bool parallel : {false, true}) {
    SCOPED_TRACE(parallel ? "heads at once" : "one thread");
    PlanOptions opt;
    opt.parallel_heads = parallel;
    Planner planner(opt);
    planner.plan_checked_tables(in);
    Inputs bad = in;
    const int32_t id = bad.selected.data[0];  // sequence 0, head 0, rank 0
    ASSERT_GE(id, 0);
    bad.block_tables.data[static_cast<size_t>(id * ppb)] = 1 << 30;
    EXPECT_THROW(planner.plan_checked_tables(bad), InputError);
    Inputs next = in;
    for (int64_t t = 1; t <= 2; ++t) {  // sequences 1 and 2: every head's blocks moved down by one
      for (int64_t k = 0; k < Hkv * topk; ++k) {
        int32_t& x = next.selected.data[static_cast<size_t>(t * Hkv * topk + k)];
        x = x > 0 ? x - 1 : x;
      }
    }
    expect_same_plan(planner.plan_checked_tables(next), make_plan(next));
  }
}

// Halide's pool spawns its threads at its first parallel loop, and each thread starts on its own
// time: under AddressSanitizer a thread's start-up allocates (its own pthread_getattr_np, seen by
// the counter's hooks), and may fall inside a counted step. Returns once every thread of the pool
// has run a task of one loop at the same time, so that every start-up is behind it.
void wait_for_pool_threads() {
  struct Barrier {
    std::atomic<int> arrived{0};
    int n = 0;
  } b;
  b.n = halide_get_num_threads();
  ASSERT_GE(b.n, 1);
  halide_task_t task = [](void*, int, uint8_t* closure) -> int {
    Barrier& c = *reinterpret_cast<Barrier*>(closure);
    c.arrived.fetch_add(1);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (c.arrived.load() < c.n && std::chrono::steady_clock::now() < deadline) std::this_thread::yield();
    return 0;
  };
  ASSERT_EQ(halide_do_par_for(nullptr, task, 0, b.n, reinterpret_cast<uint8_t*>(&b)), 0);
  ASSERT_EQ(b.arrived.load(), b.n);
}

TEST(Planner, AStepOfTheSameSizeAllocatesNothing) {
  experiments::CaseSpec s = experiments::named_shape("decode");
  s.D = 1;  // the plan never reads K/V: decode's geometry with one channel
  s.kv = std::vector<int64_t>(s.kv.size(), 4096);
  Inputs in = experiments::make_case(s);
  for (bool parallel : {false, true}) {
    PlanOptions opt;
    opt.parallel_heads = parallel;
    Planner planner(opt);
    planner.plan_checked_tables(in);
    planner.plan(in);
    if (parallel) wait_for_pool_threads();
    for (bool checked : {false, true}) {
      // A new selection of the same size (every id moved to another block): same array sizes.
      for (auto& id : in.selected.data) id = id > 0 ? id - 1 : id;
      const int64_t before = testing_alloc::count.load();
      const Plan& plan = checked ? planner.plan_checked_tables(in) : planner.plan(in);
      EXPECT_EQ(testing_alloc::count.load() - before, 0)
          << (checked ? "plan_checked_tables" : "plan") << (parallel ? ", heads at once" : "");
      EXPECT_GT(plan.index.num_edges(), 0);
    }
  }
}

TEST(Planner, HeadsPlannedAtOnceGiveTheSamePlan) {
  // The KV heads on Halide's thread pool, each into its own slots, then moved together: the plan
  // of one thread, on every kind (repeats, padding, unallocated pages: heads whose bounds are not
  // met, so later heads move), and a bad table entry reported as one thread reports it.
  ASSERT_TRUE(halide::thread_pool_linked()) << "the heads would run in order: nothing parallel tested";
  PlanOptions opt;
  opt.parallel_heads = true;
  Planner parallel(opt);
  for (const auto& [name, spec] : varied_kinds()) {
    SCOPED_TRACE(name);
    const Inputs in = experiments::make_case(spec);
    expect_same_plan(parallel.plan(in), make_plan(in));
    expect_same_plan(parallel.plan_checked_tables(in), make_plan(in));
  }
  // Each head's sequences in chunks planned at once too (decode steps: many sequences, few
  // heads), on every kind, and on decode's geometry, in 2, 3 and 4096 tasks (rounded up to a
  // multiple of the heads; 4096: one sequence each).
  for (const int64_t chunks : {2, 3, 4096}) {
    SCOPED_TRACE("chunks " + std::to_string(chunks));
    PlanOptions copt = opt;
    copt.sequence_chunks = chunks;
    Planner chunked(copt);
    for (const auto& [name, spec] : varied_kinds()) {
      SCOPED_TRACE(name);
      const Inputs in = experiments::make_case(spec);
      expect_same_plan(chunked.plan(in), make_plan(in));
    }
    experiments::CaseSpec d = experiments::named_shape("decode");
    d.D = 1;  // the plan never reads K/V
    d.kv = {4096, 64, 1, 4096, 100, 4096, 3000, 17};  // short sequences: bounds not met
    d.qo = std::vector<int64_t>(d.kv.size(), 1);
    d.benchmark_selection = false;
    d.pad_prob = 0.2;  // and padding and repeats
    d.dup_prob = 0.3;
    const Inputs din = experiments::make_case(d);
    expect_same_plan(chunked.plan(din), make_plan(din));
  }
  experiments::CaseSpec s = experiments::named_shape("tiny");
  s.Hkv = 4;
  s.Hq = 8;
  Inputs in = experiments::make_case(s);
  expect_same_plan(parallel.plan(in), make_plan(in));
  // Heads 1 and 3 of query 0 each reach a bad page id of sequence 0 (two different entries); one
  // thread meets head 1's first, and so must the heads planned at once.
  const int64_t topk = in.selected.shape[2], ppb = s.block_size / s.page_size;
  const int32_t id1 = in.selected.data[static_cast<size_t>(1 * topk)];
  ASSERT_GE(id1, 0);
  const int32_t id3 = id1 == 0 ? 1 : 0;
  in.selected.data[static_cast<size_t>(3 * topk)] = id3;
  in.block_tables.data[static_cast<size_t>(id1 * ppb)] = 1 << 30;
  in.block_tables.data[static_cast<size_t>(id3 * ppb)] = 1 << 29;
  std::string want, got;
  try {
    Planner one;
    one.plan_checked_tables(in);
  } catch (const InputError& e) {
    want = e.what();
  }
  try {
    parallel.plan_checked_tables(in);
  } catch (const InputError& e) {
    got = e.what();
  }
  EXPECT_NE(want.find(std::to_string(1 << 30)), std::string::npos) << want;
  EXPECT_EQ(got, want);
}

// Decode steps of several geometries: padding, repeats, unallocated pages, empty and short
// sequences, one page per block and several, causal and not.
std::vector<std::pair<std::string, experiments::CaseSpec>> decode_kinds() {
  std::vector<std::pair<std::string, experiments::CaseSpec>> out;
  experiments::CaseSpec a;
  a.qo = {1, 1, 1, 1, 1, 1, 1}; a.kv = {37, 64, 0, 5, 9, 130, 1}; a.Hq = 4; a.Hkv = 2; a.D = 8;
  a.block_size = 8; a.page_size = 4; a.topk = 5;
  out.emplace_back("short", a);
  experiments::CaseSpec w;
  w.qo = {1, 1}; w.kv = {700, 1000}; w.Hq = 2; w.Hkv = 2; w.D = 8; w.block_size = 4; w.page_size = 4; w.topk = 7;
  out.emplace_back("wide", w);
  experiments::CaseSpec d = experiments::named_shape("decode");
  d.D = 1;  // the plan never reads K/V
  d.kv = {4096, 64, 1, 4096, 100, 4096, 3000, 17, 0, 65, 4096, 4096, 1024, 1000, 64, 4096, 33};
  d.qo = std::vector<int64_t>(d.kv.size(), 1);
  d.benchmark_selection = false;
  out.emplace_back("decode geometry", d);
  std::vector<std::pair<std::string, experiments::CaseSpec>> varied;
  for (const auto& [name, spec] : out) {
    for (uint64_t seed : {21u, 22u, 23u}) {
      experiments::CaseSpec s = spec;
      s.seed = seed;
      s.pad_prob = seed == 22 ? 0.0 : 0.2;
      s.dup_prob = seed == 22 ? 0.05 : 0.3;
      s.neg_page_prob = seed == 23 ? 0.25 : s.neg_page_prob;
      s.causal = seed != 22;
      varied.emplace_back(name + " seed " + std::to_string(seed), s);
    }
  }
  return varied;
}

// A plan in the fixed decode layout against the indexed plan of the same step: each rank's tile
// holds what the index's partial of that rank holds (head, query, pages, limit), a rank without a
// partial has none and attends nothing, and the counts agree.
void expect_same_decode_tiles(const Plan& f, const Plan& ix) {
  ASSERT_TRUE(f.decode_layout);
  ASSERT_FALSE(ix.decode_layout);
  const Problem& p = ix.problem;
  ASSERT_EQ(ix.tiles.T, 1);
  EXPECT_EQ(f.tiles.T, 1);
  EXPECT_EQ(f.tiles.ppb, p.ppb);
  const int64_t n = p.Tq * p.Hkv * p.topk;
  ASSERT_EQ(f.tiles.num_tiles, n);
  ASSERT_EQ(f.tiles.tile_head.size(), static_cast<size_t>(n));
  ASSERT_EQ(f.tiles.tile_query.size(), static_cast<size_t>(n));
  ASSERT_EQ(f.tiles.tile_limit.size(), static_cast<size_t>(n));
  ASSERT_EQ(f.tiles.tile_pages.size(), static_cast<size_t>(n * p.ppb));
  ASSERT_EQ(f.tiles.partial_index.size(), static_cast<size_t>(n));
  EXPECT_EQ(f.units, ix.units);
  EXPECT_EQ(f.edges, ix.edges);
  EXPECT_EQ(f.units, ix.index.num_units());
  EXPECT_EQ(f.attended_pairs, ix.attended_pairs);
  EXPECT_EQ(f.flops(), ix.flops());
  EXPECT_EQ(f.kv_unit_bytes(), ix.kv_unit_bytes());
  EXPECT_EQ(f.index.num_units(), 0);
  int64_t live = 0;
  for (int64_t t = 0; t < p.Tq; ++t) {
    for (int64_t h = 0; h < p.Hkv; ++h) {
      for (int64_t r = 0; r < p.topk; ++r) {
        const int64_t i = (t * p.Hkv + h) * p.topk + r;
        const size_t si = static_cast<size_t>(i);
        const int32_t x = ix.tiles.partial_index[si];
        EXPECT_EQ(f.tiles.tile_head[si], h);
        EXPECT_EQ(f.tiles.tile_query[si], t);
        if (x < 0) {
          EXPECT_EQ(f.tiles.partial_index[si], layout::kNoPartial) << "rank " << i;
          EXPECT_EQ(f.tiles.tile_limit[si], 0) << "rank " << i;
          for (int64_t j = 0; j < p.ppb; ++j) EXPECT_EQ(f.tiles.tile_pages[static_cast<size_t>(i * p.ppb + j)], layout::kNoPage);
          continue;
        }
        ++live;
        const size_t sx = static_cast<size_t>(x);
        EXPECT_EQ(f.tiles.partial_index[si], i) << "rank " << i;
        EXPECT_EQ(ix.tiles.tile_head[sx], h);
        EXPECT_EQ(ix.tiles.tile_query[sx], t);
        EXPECT_EQ(f.tiles.tile_limit[si], ix.tiles.tile_limit[sx]) << "rank " << i;
        for (int64_t j = 0; j < p.ppb; ++j) {
          EXPECT_EQ(f.tiles.tile_pages[static_cast<size_t>(i * p.ppb + j)], ix.tiles.tile_pages[static_cast<size_t>(x * p.ppb + j)])
              << "rank " << i << " page " << j;
        }
      }
    }
  }
  EXPECT_EQ(live, ix.units);
}

PlanOptions decode_layout_options(bool parallel = false, int64_t chunks = 0) {
  PlanOptions o;
  o.decode_layout = true;
  o.parallel_heads = parallel;
  o.sequence_chunks = chunks;
  return o;
}

TEST(Planner, DecodeLayoutHoldsTheIndexsPartials) {
  ASSERT_TRUE(halide::thread_pool_linked()) << "the query ranges would run in order: nothing parallel tested";
  for (const auto& [parallel, chunks] : std::vector<std::pair<bool, int64_t>>{{false, 0}, {true, 0}, {true, 2}, {true, 3}, {true, 64}}) {
    SCOPED_TRACE("parallel " + std::to_string(parallel) + " chunks " + std::to_string(chunks));
    Planner planner(decode_layout_options(parallel, chunks));
    for (const auto& [name, spec] : decode_kinds()) {
      SCOPED_TRACE(name);
      const Inputs in = experiments::make_case(spec);
      const Plan indexed = make_plan(in);
      expect_same_decode_tiles(planner.plan(in), indexed);
      expect_same_decode_tiles(planner.plan_checked_tables(in), indexed);
      EXPECT_EQ(planner.current().tiles.batch_tile_begin, (std::vector<int64_t>{0, in.selected.numel()}));
    }
  }
}

TEST(Planner, DecodeLayoutOnlyForDecodeSteps) {
  // Steps with a sequence of several queries, or of none, and plans asked for T > 1 keep the index.
  Planner planner(decode_layout_options());
  for (const auto& [name, spec] : varied_kinds()) {
    SCOPED_TRACE(name);
    const Inputs in = experiments::make_case(spec);
    const Plan& plan = planner.plan(in);
    bool decode = spec.qo.size() > 0;
    for (int64_t q : spec.qo) decode &= q == 1;
    EXPECT_EQ(plan.decode_layout, decode);
    if (!decode) expect_same_plan(plan, make_plan(in));
  }
  PlanOptions t2 = decode_layout_options();
  t2.tile_edges = 2;
  const Inputs in = experiments::make_case(decode_kinds().front().second);
  EXPECT_FALSE(Planner(t2).plan(in).decode_layout);
  expect_same_plan(Planner(t2).plan(in), make_plan(in, t2));
}

TEST(Planner, DecodeLayoutAcrossStepsOfOtherShapes) {
  // tile_head and tile_query are kept from step to step while the shape is the same: an indexed
  // step, or a decode step of another shape, in between must not leave them stale.
  Planner planner(decode_layout_options(true));
  const auto kinds = decode_kinds();
  const Inputs a = experiments::make_case(kinds[0].second), b = experiments::make_case(kinds[3].second);
  experiments::CaseSpec mixed = kinds[0].second;
  mixed.qo[1] = 3;
  const Inputs m = experiments::make_case(mixed);
  for (const Inputs* in : {&a, &m, &a, &b, &a, &a}) {
    const Plan indexed = make_plan(*in);
    const Plan& plan = planner.plan(*in);
    if (in == &m) {
      expect_same_plan(plan, indexed);
    } else {
      expect_same_decode_tiles(plan, indexed);
    }
  }
}

TEST(Planner, DecodeLayoutBatchesQueriesToFitAPartialLimit) {
  const Inputs in = experiments::make_case(decode_kinds()[6].second);
  const Problem p = validate(in);
  const int64_t per_query = p.Hkv * p.topk;
  const int64_t tile_floats = std::max({p.qhead * (p.D + layout::kPartialExtra), p.block_size * p.qhead, p.block_size * p.D});
  PlanOptions o = decode_layout_options();
  o.max_batch_partial_floats = 5 * per_query * tile_floats + 1;  // 5 queries a batch
  Planner planner(o);
  const Plan& plan = planner.plan(in);
  ASSERT_TRUE(plan.decode_layout);
  EXPECT_EQ(plan.tiles.query_batch, 5);
  std::vector<int64_t> want;
  for (int64_t t = 0; t < p.Tq; t += 5) want.push_back(t * per_query);
  want.push_back(p.Tq * per_query);
  EXPECT_EQ(plan.tiles.batch_tile_begin, want);
  for (int64_t b = 0; b < plan.tiles.batches(); ++b) {
    const TileSet::Batch r = plan.tiles.batch(b, p.Tq);
    EXPECT_LE((r.tile_end - r.tile_begin) * tile_floats, o.max_batch_partial_floats);
    for (int64_t i = r.t0 * per_query; i < r.t1 * per_query; ++i) {
      const int32_t x = plan.tiles.partial_index[static_cast<size_t>(i)];
      if (x >= 0) {
        EXPECT_GE(x, r.tile_begin);
        EXPECT_LT(x, r.tile_end);
      }
    }
  }
  o.max_batch_partial_floats = per_query * tile_floats - 1;  // not one query
  EXPECT_THROW(Planner(o).plan(in), BackendError);
}

TEST(Planner, DecodeLayoutReportsABadEntryAsTheIndexDoes) {
  // A reached table entry beyond the pool: the same InputError as the indexed plan's, which names
  // the first bad entry in its own order; then the next step plans afresh.
  Inputs in = experiments::make_case(decode_kinds()[6].second);
  const Problem p = validate(in);
  const Plan good = make_plan(in);
  // Two bad entries, in sequences 3 and 1, reached by head 1 and head 0.
  for (const auto& [t, h] : {std::pair<int64_t, int64_t>{3, 1}, {1, 0}}) {
    const int32_t id = in.selected.data[static_cast<size_t>((t * p.Hkv + h) * p.topk)];
    ASSERT_GE(id, 0);
    in.block_tables.data[static_cast<size_t>(t * p.max_pages + id * p.ppb)] = static_cast<int32_t>(p.num_pages + t);
  }
  std::string want;
  try {
    Planner().plan_checked_tables(in);
  } catch (const InputError& e) {
    want = e.what();
  }
  ASSERT_NE(want.find("block_tables["), std::string::npos) << want;
  for (bool parallel : {false, true}) {
    Planner planner(decode_layout_options(parallel, 4));
    std::string got;
    try {
      planner.plan_checked_tables(in);
    } catch (const InputError& e) {
      got = e.what();
    }
    EXPECT_EQ(got, want);
    const Inputs fine = experiments::make_case(decode_kinds()[6].second);
    expect_same_decode_tiles(planner.plan(fine), good);
  }
}

// The device's decode plan (generators/kvouter_decode_plan, its host build) against the host's
// layout of the same step: every array element for element, and the runner's padding rows empty.
TEST(Planner, DecodePlanKernelBuildsTheHostLayout) {
  halide::register_generated_aot_kernels();
  const halide::AotDecodePlan& kernel = halide::aot_decode_plan("host");
  Planner host(decode_layout_options());
  Planner device(decode_layout_options());
  for (const auto& [name, spec] : decode_kinds()) {
    SCOPED_TRACE(name);
    const Inputs in = experiments::make_case(spec);
    const Plan& want = host.plan(in);
    const Plan& shell = device.plan_on_device(in);
    ASSERT_TRUE(shell.tiles_on_device);
    ASSERT_TRUE(shell.decode_layout);
    EXPECT_EQ(shell.units, -1);
    EXPECT_EQ(shell.attended_pairs, -1);
    EXPECT_TRUE(shell.tiles.tile_pages.empty() && shell.tiles.tile_limit.empty() && shell.tiles.partial_index.empty());
    EXPECT_EQ(shell.tiles.tile_head, want.tiles.tile_head);
    EXPECT_EQ(shell.tiles.tile_query, want.tiles.tile_query);
    EXPECT_EQ(shell.tiles.batch_tile_begin, want.tiles.batch_tile_begin);
    const Problem& p = want.problem;
    const int64_t n = p.Tq * p.Hkv * p.topk, pad = 13, tq_pad = 3;
    // [selected | kv_len], the tables as the writer's pool (1, entry, 1, sequence).
    std::vector<int32_t> ints(in.selected.data.begin(), in.selected.data.end());
    for (int64_t t = 0; t < p.Tq; ++t) ints.push_back(static_cast<int32_t>(p.kv_len[static_cast<size_t>(t)]));
    Halide::Runtime::Buffer<int32_t> step(ints.data(), static_cast<int>(ints.size()));
    std::vector<uint32_t> words(in.block_tables.data.begin(), in.block_tables.data.end());
    Halide::Runtime::Buffer<uint32_t> tables(words.data(), 1, static_cast<int>(p.max_pages), 1, static_cast<int>(p.B));
    Halide::Runtime::Buffer<int32_t> pages(static_cast<int>(p.ppb), static_cast<int>(n + pad));
    Halide::Runtime::Buffer<int32_t> limit(1, static_cast<int>(n + pad));
    Halide::Runtime::Buffer<int32_t> pidx(static_cast<int>(p.topk * p.Hkv * (p.Tq + tq_pad)));  // flat
    pages.fill(12345);
    limit.fill(12345);
    pidx.fill(12345);
    const auto i32 = [](int64_t v) { return static_cast<int32_t>(v); };
    ASSERT_EQ(kernel.plan(step.raw_buffer(), tables.raw_buffer(), i32(p.Tq), i32(p.Hkv), i32(p.topk), i32(p.block_size),
                          i32(p.page_size), i32(p.num_pages), pages.raw_buffer(), limit.raw_buffer(), pidx.raw_buffer()),
              0);
    int64_t wrong = 0;
    for (int64_t i = 0; i < n + pad; ++i) {
      const bool real = i < n;
      const int32_t lim = real ? want.tiles.tile_limit[static_cast<size_t>(i)] : 0;
      wrong += limit(0, static_cast<int>(i)) != lim;
      for (int64_t j = 0; j < p.ppb; ++j) {
        const int32_t pg = real ? want.tiles.tile_pages[static_cast<size_t>(i * p.ppb + j)] : layout::kNoPage;
        wrong += pages(static_cast<int>(j), static_cast<int>(i)) != pg;
      }
    }
    for (int64_t t = 0; t < p.Tq + tq_pad; ++t) {
      for (int64_t h = 0; h < p.Hkv; ++h) {
        for (int64_t r = 0; r < p.topk; ++r) {
          const int64_t i = (t * p.Hkv + h) * p.topk + r;
          const int32_t x = t < p.Tq ? want.tiles.partial_index[static_cast<size_t>(i)] : layout::kNoPartial;
          wrong += pidx(static_cast<int>(i)) != x;
        }
      }
    }
    EXPECT_EQ(wrong, 0);
  }
}

TEST(Planner, PlanOnDeviceLeavesOtherStepsToTheHost) {
  // A step that is not a decode step, and a decode step of query batches, are planned on the host
  // (their tiles and counts as plan_checked_tables's).
  for (const auto& [name, spec] : varied_kinds()) {
    SCOPED_TRACE(name);
    const Inputs in = experiments::make_case(spec);
    Planner a(decode_layout_options()), b(decode_layout_options());
    const Plan& dev = a.plan_on_device(in);
    const Plan& ref = b.plan_checked_tables(in);
    EXPECT_EQ(dev.tiles_on_device, ref.decode_layout);
    if (!dev.tiles_on_device) {
      EXPECT_EQ(dev.tiles.tile_limit, ref.tiles.tile_limit);
      EXPECT_EQ(dev.units, ref.units);
    }
  }
  const Inputs in = experiments::make_case(decode_kinds()[0].second);
  PlanOptions o = decode_layout_options();
  const Problem p = validate(in);
  o.max_batch_partial_floats = p.Hkv * p.topk * std::max(p.qhead * (p.D + layout::kPartialExtra), p.block_size * p.D) * 2;
  Planner batching(o);
  const Plan& batched = batching.plan_on_device(in);
  EXPECT_FALSE(batched.tiles_on_device);
  EXPECT_TRUE(batched.decode_layout);
  EXPECT_GT(batched.tiles.batches(), 1);
}

}  // namespace
}  // namespace kvouter
