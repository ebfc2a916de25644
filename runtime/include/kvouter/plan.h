// Plan, then run (FlashInfer's plan()/run()): the CSR index and the tile arrays are built once,
// outside any timed region, and every backend consumes the same Plan.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <exception>
#include <vector>

#include "kvouter/inputs.h"
#include "kvouter/tile_layout.h"

namespace kvouter {

// Per KV head, a CSR over compact work units (batch, block): each unit is one KV block that at
// least one query of the batch attends after dedup, dropping and causal pruning. Its edges are the
// (query, rank) pairs that chose it, in ascending (query, rank) order.
struct KvIndex {
  std::vector<int64_t> head_unit_begin;  // [Hkv + 1] units of head h: [begin[h], begin[h+1])
  std::vector<int32_t> unit_head;        // [units]
  std::vector<int32_t> unit_batch;       // [units]
  std::vector<int32_t> unit_block;       // [units]
  std::vector<int64_t> unit_edge_begin;  // [units + 1] CSR offsets into the edge arrays
  std::vector<int32_t> edge_query;       // [edges] query token t
  std::vector<int32_t> edge_rank;        // [edges] rank r in selected[t, h, :]
  std::vector<int32_t> edge_limit;       // [edges] attended block positions [0, limit)
  std::vector<int32_t> inverse;          // [Tq, Hkv, topk] -> edge id, or -1
  // [units, ppb] the physical page of each of the unit's pages, layout::kNoPage where the page is
  // unallocated or wholly at or after L_b (the planner's one read of block_tables per unit).
  std::vector<int32_t> unit_pages;
  int64_t attended_pairs = 0;  // (t, h, p) triples really attended, before the qhead fan-out

  int64_t num_units() const { return static_cast<int64_t>(unit_head.size()); }
  int64_t num_edges() const { return static_cast<int64_t>(edge_query.size()); }
};

// Scratch of the index build, reused across steps: per-block stamps, counts and offsets sized by
// the widest block table seen (msb), never cleared (generation stamps), so that a step costs what
// its edges cost, whatever the table width or the pool size. One set per KV head planned at once.
struct PlanWorkspace {
  struct Edge {
    int32_t t, r, limit, block;
  };
  struct HeadScratch {
    int64_t generation = 0;
    std::vector<int64_t> seen;         // [msb] stamp of the last (query, head) that took the block
    std::vector<int64_t> pages_stamp;  // [msb] stamp of the (head, sequence) that read the pages
    std::vector<int32_t> pages;        // [msb, ppb] the block's physical pages (kNoPage: none)
    std::vector<int32_t> avail;        // [msb] positions of the block before L_b on allocated pages
    std::vector<int32_t> count;        // [msb] edges per block of the current (head, sequence); 0 after
    std::vector<uint64_t> touched_bits;  // [ceil(msb / 64)] blocks of the current (head, sequence)
    std::vector<int32_t> touched;        // the same, ascending
    std::vector<Edge> edges;           // edges of the current (head, sequence), in (query, rank) order
    // Decode sequences scanned ahead of their units (plan.cpp, kDecodeAhead), a ring of slots:
    // per slot the blocks taken (bits, clear after use), each one's first rank, the span.
    int64_t ring_words = 0;
    std::vector<uint64_t> ring_bits;   // [slots, ring_words]
    std::vector<int32_t> ring_rank;    // [slots, msb]
    std::vector<int64_t> ring_lo, ring_hi;  // [slots]
  };
  struct HeadResult {
    int64_t unit0 = 0, edge0 = 0;  // the head's first unit and edge slots
    int64_t units = 0, edges = 0, attended = 0;
    std::exception_ptr error;  // a head planned on a worker thread: rethrown in head order
  };
  std::vector<HeadScratch> heads;    // one per task planned at once
  std::vector<HeadResult> results;   // [tasks]: a head, or a chunk of a head's sequences
  std::vector<int64_t> seq_units, seq_edges;  // [B + 1] a head's unit and edge bounds before sequence b
  std::vector<int64_t> cursor;       // [units] build_tiles' per-unit edge cursor
  // (Tq, Hkv, topk) of the fixed decode layout whose tile_head and tile_query the tiles hold, or -1s.
  std::array<int64_t, 3> decode_tiles_of{-1, -1, -1};
};

// Linear in the edges: each (head, sequence)'s edges counting-sorted by block (plus a word per 64
// blocks of the span its selections touch).
// parallel: the KV heads planned at once on Halide's thread pool, each head's sequences in
// chunks, `sequence_chunks` tasks in all rounded up to a multiple of the heads (0: enough for the
// machine's threads); the same index.
KvIndex build_kvouter_index(const InputsView& in, const Problem& p);
void build_kvouter_index(const InputsView& in, const Problem& p, PlanWorkspace& ws, KvIndex* ix,
                         bool parallel = false, int64_t sequence_chunks = 0);

// Tiles: each work unit split into tiles of at most T edges (layout in tile_layout.h).
struct TileSet {
  int64_t T = 0;
  int64_t num_tiles = 0;
  int64_t ppb = 0;
  std::vector<int32_t> tile_head;      // [num_tiles]
  std::vector<int32_t> tile_unit;      // [num_tiles]
  std::vector<int32_t> tile_pages;     // [num_tiles, ppb]
  std::vector<int32_t> tile_query;     // [num_tiles, T]
  std::vector<int32_t> tile_limit;     // [num_tiles, T]
  std::vector<int32_t> partial_index;  // [Tq, Hkv, topk]
  std::vector<int32_t> edge_partial;   // [edges] index edge -> partial row tile * T + slot
  // Query batches (a device's buffer limits): batch b holds queries [b * query_batch, (b + 1) *
  // query_batch) and tiles [batch_tile_begin[b], batch_tile_begin[b + 1]); its queries' partials
  // lie in its tiles only. One batch (query_batch >= Tq) unless make_plan was asked for more.
  int64_t query_batch = 0;
  std::vector<int64_t> batch_tile_begin;  // [batches + 1]

  int64_t num_partials() const { return num_tiles * T; }

  // Batch b (of batches()) of a step with Tq queries: its queries [t0, t1) and its tiles
  // [tile_begin, tile_end). Every runner walks the batches through these two.
  struct Batch {
    int64_t t0, t1, tile_begin, tile_end;
  };
  int64_t batches() const {
    return std::max<int64_t>(static_cast<int64_t>(batch_tile_begin.size()) - 1, 1);
  }
  Batch batch(int64_t b, int64_t Tq) const {
    const int64_t q = std::max<int64_t>(query_batch, 1), n = batches();
    const bool tiled = !batch_tile_begin.empty();
    return {std::min(b * q, Tq), b + 1 == n ? Tq : std::min((b + 1) * q, Tq),
            tiled ? batch_tile_begin[static_cast<size_t>(b)] : 0, tiled ? batch_tile_begin[static_cast<size_t>(b) + 1] : 0};
  }
};

// Marks `rows` zeroed partial rows of `row_floats` (D + layout::kPartialExtra) as empty: m masked,
// o and l zero. The runners' stand-in when a step has no tile, so that the combine writes zeros
// and -inf.
inline void mark_empty_partials(float* rows_data, int64_t rows, int64_t row_floats, int64_t D) {
  for (int64_t r = 0; r < rows; ++r) rows_data[r * row_floats + D] = layout::kMaskedScore;
}

// From the index alone (each unit's pages are in KvIndex::unit_pages).
TileSet build_tiles(const Problem& p, const KvIndex& index, int64_t T, int64_t query_batch = 0);
void build_tiles(const Problem& p, const KvIndex& index, int64_t T, int64_t query_batch, PlanWorkspace& ws,
                 TileSet* ts);

struct PlanOptions {
  // T, edges per tile. 0 = automatic: the next power of two of the mean edges per work unit,
  // capped at 16 (decode-like plans, one query per unit, get T = 1 instead of 15 padding rows).
  int64_t tile_edges = 0;
  // 0 = one batch. Otherwise queries are batched so that no batch's tiles hold more than this
  // many floats in any one device buffer: partials, or the GPU schedules' per-tile scores and K
  // (GPU backends: the device's storage-buffer limit and Halide's int32 indexing).
  int64_t max_batch_partial_floats = 0;
  // Plan the KV heads at once on Halide's thread pool (a GPU step's host has the cores to spare),
  // each head's sequences split into chunks planned at once too; false: on the calling thread alone.
  bool parallel_heads = false;
  // With parallel_heads: the plan's tasks. A decode layout's query ranges (at least 16 queries a
  // task), or an indexed plan's (KV head, chunk of its sequences) pairs, this many rounded up to a
  // multiple of the KV heads. 0 = automatic: about the machine's hardware threads (an indexed
  // plan's chunks of at least 8 sequences).
  int64_t sequence_chunks = 0;
  // Decode steps (every sequence one query) in the fixed decode layout (build_decode_tiles):
  // their tiles straight from the selection, without a KvIndex. For the device step runner, whose
  // kernels read only the tiles; a plan whose tile_edges asks for more than 1 keeps the index.
  bool decode_layout = false;
};

int64_t auto_tile_edges(const KvIndex& index);

// Whether every sequence of the step has exactly one query (query t of sequence t): a decode step.
bool is_decode_step(const Problem& p);

// The fixed decode layout of a decode step (is_decode_step), T = 1: tile (t * Hkv + h) * topk + r
// is rank r of selected[t, h, :], and partial_index maps each rank to its own tile, or to
// kNoPartial where the rank attends nothing (padding, beyond L_b, a repeat of an earlier rank, a
// block without an allocated page before L_b; those tiles have limit 0 and no page). The tiles
// that attend are the KvIndex's units, with the same pages and limits; tile_head and tile_query
// depend only on (Tq, Hkv, topk). Nothing is sorted or compacted, so the cost is a pass over the
// selection and the table entries it reaches. Batches of query_batch queries (0: one batch).
// Returns false, with the tiles unspecified, where a reached block_tables entry is a bad page id:
// the indexed plan (build_kvouter_index) then reports it. Sets *units and *attended.
// parallel: query ranges planned at once on Halide's thread pool, `chunks` of them (0: the
// machine's threads), each of at least 16 queries. ws and ts are one planner's pair.
// layout_only: only the layout (the batches, tile_head and tile_query), for tiles that the device
// builds (kvouter_decode_plan); tile_pages, tile_limit and partial_index are left empty, the counts 0.
bool build_decode_tiles(const InputsView& in, const Problem& p, int64_t query_batch, PlanWorkspace& ws,
                        TileSet* ts, int64_t* units, int64_t* attended, bool parallel = false, int64_t chunks = 0,
                        bool layout_only = false);

struct Plan {
  Problem problem;
  KvIndex index;  // empty in the fixed decode layout
  TileSet tiles;
  bool decode_layout = false;  // the tiles are in the fixed decode layout (build_decode_tiles)
  // The decode layout's tile pages, limits and partial index are the device's to build
  // (Planner::plan_on_device): those arrays are empty here, and units, edges and attended_pairs
  // are -1 (not counted).
  bool tiles_on_device = false;
  int64_t units = 0, edges = 0;  // work units and edges (the decode layout: tiles that attend)
  int64_t attended_pairs = 0;  // (t, h, p) triples really attended, before the qhead fan-out
  double plan_ms = 0;          // wall time of make_plan
  double validate_ms = 0;      // the part of it that validate() took

  // SPEC §5: 4 * D * attended (t, j, p) triples.
  double flops() const {
    return 4.0 * static_cast<double>(problem.D) * static_cast<double>(attended_pairs) *
           static_cast<double>(problem.qhead);
  }
  // Bytes of K and V that one read of every work unit's block costs (each unit read once).
  double kv_unit_bytes() const;
};

// One step's plan, built once (validate() on every input, then the index and the tiles).
Plan make_plan(const InputsView& in, const PlanOptions& opt = {});

// FlashInfer's plan(), for a stream of steps: each plan() rebuilds the step's plan into the arrays
// of the previous one, so that once they have grown to a step's size no step allocates. It reads
// the selection, the block tables and the lengths, never K or V.
class Planner {
 public:
  explicit Planner(PlanOptions opt = {}) : opt_(opt) {}

  // Validates the step (validate()) and plans it.
  const Plan& plan(const InputsView& in);
  // The same, without re-checking block_tables' page ids over every sequence's length: for callers
  // that check the entries where they write them (a KV cache's appends). The entries a selection
  // reaches are still checked, and a bad one is the same InputError naming the entry.
  const Plan& plan_checked_tables(const InputsView& in);
  // For a device that builds a decode step's tiles itself (the step runner's kvouter_decode_plan,
  // from its resident block tables): with options().decode_layout, a decode step whose partials
  // fit one query batch is validated (its block_tables entries trusted, as the runner checks them
  // where they are written) and laid out without its rank pass (Plan::tiles_on_device); any other
  // step is planned as plan_checked_tables().
  const Plan& plan_on_device(const InputsView& in);

  const Plan& current() const { return plan_; }
  const PlanOptions& options() const { return opt_; }
  // New options for the next plans (the scratch arrays are kept).
  void set_options(const PlanOptions& opt) { opt_ = opt; }

 private:
  const Plan& build(const InputsView& in, bool check_block_tables, bool on_device = false);
  const Plan& build_step(const InputsView& in, bool check_block_tables, bool on_device);
  PlanOptions opt_;
  Plan plan_;
  PlanWorkspace ws_;
};

}  // namespace kvouter
