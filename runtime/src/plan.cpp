#include "kvouter/plan.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <exception>
#include <limits>
#include <stdexcept>
#include <string>
#include <thread>
#include <type_traits>

#include "kvouter/errors.h"
#include "kvouter/tile_layout.h"
#include "thread_pool.h"
#include "kvouter/stats.h"

namespace kvouter {

namespace {

[[noreturn]] __attribute__((noinline)) void bad_table_entry(int64_t b, int64_t lp, int64_t num_pages, int32_t page) {
  // validate() reports it first unless the planner trusts the tables
  throw InputError("block_tables[" + std::to_string(b) + ", " + std::to_string(lp) + "]",
                   "a page id < num_pages = " + std::to_string(num_pages) + " (or negative)", std::to_string(page));
}

// A block's page ids (ppb of them; 1, 2, 4 or 8 in every shape measured, copied as one move).
inline void copy_pages(int32_t* dst, const int32_t* src, size_t ppb) {
  switch (ppb) {
    case 1: std::memcpy(dst, src, 4); break;
    case 2: std::memcpy(dst, src, 8); break;
    case 4: std::memcpy(dst, src, 16); break;
    case 8: std::memcpy(dst, src, 32); break;
    default: for (size_t j = 0; j < ppb; ++j) dst[j] = src[j];
  }
}

}  // namespace

KvIndex build_kvouter_index(const InputsView& in, const Problem& p) {
  PlanWorkspace ws;
  KvIndex ix;
  build_kvouter_index(in, p, ws, &ix);
  return ix;
}

namespace {

// One KV head's units and edges, written into the index's arrays from unit slot `unit0` and edge
// slot `edge0` on (every head has slots for its bounds, so heads can be planned at once).
using HeadResult = PlanWorkspace::HeadResult;

// Decode sequences (one query) are planned in two halves, kDecodeAhead sequences apart: the scan
// of sequence b + kDecodeAhead (its distinct blocks, and a request for their block-table entries)
// runs before the units of sequence b are written from its table entries. An engine plans between
// a step's staging copies, which leave the plan's inputs out of the caches, and each entry is a
// random line of the block tables (experiments/results/cpu/2026-12-02/plan_cold.md).
constexpr int64_t kDecodeAhead = 2;
constexpr int64_t kDecodeRing = kDecodeAhead + 1;

// Scan: decode query t of sequence b's selection row `row` into ring slot `slot`: its distinct
// valid blocks as set bits, each with its first rank.
inline void decode_scan(const Problem& p, int64_t b, int64_t t, const int32_t* __restrict row,
                        const int32_t* __restrict table, PlanWorkspace::HeadScratch& hs, int64_t slot) {
  const int64_t bs = p.block_size, topk = p.topk, np = p.ppb;
  const int64_t L = p.kv_len[static_cast<size_t>(b)];
  const int64_t reach = std::min<int64_t>(L - 1, p.last_position(b, t - p.cu[static_cast<size_t>(b)]));
  uint64_t* const __restrict bits = hs.ring_bits.data() + slot * hs.ring_words;
  int32_t* const __restrict first_rank = hs.ring_rank.data() + slot * p.msb;
  int64_t lo = p.msb, hi = -1;
  for (int64_t r = 0; r < topk; ++r) {
    const int32_t id = row[r];
    if (id < 0 || id * bs > reach) continue;  // padding, beyond L_b, causal future
    __builtin_prefetch(table + id * np);
    const uint64_t bit = uint64_t{1} << (id & 63);
    if (bits[id >> 6] & bit) continue;  // repeated
    bits[id >> 6] |= bit;
    first_rank[id] = static_cast<int32_t>(r);
    lo = std::min<int64_t>(lo, id);
    hi = std::max<int64_t>(hi, id);
  }
  hs.ring_lo[static_cast<size_t>(slot)] = lo;
  hs.ring_hi[static_cast<size_t>(slot)] = hi;
}

// The arrays a decode query's units are emitted into, each at the query's first unit / edge slot.
struct DecodeOut {
  int32_t* pages;   // unit_pages
  int32_t* blocks;  // unit_block
  int32_t* ranks;   // edge_rank
  int32_t* limits;  // edge_limit
};

// Emit: the units of the query scanned into ring slot `slot`, in ascending block order (the set
// bits of its span's words), each with its first rank: its pages, block, rank and limit into
// `out`. Returns their count and adds the attended positions to *attended; the slot is clear
// after. Compiled for the common pages-per-block counts (the page reads unrolled).
template <int64_t kN>
__attribute__((always_inline)) inline int64_t decode_emit(const Problem& p, int64_t b, int64_t t,
                                                          const int32_t* __restrict table,
                                                          PlanWorkspace::HeadScratch& hs, int64_t slot,
                                                          const DecodeOut& out, int64_t* attended) {
  const int64_t np = kN > 0 ? kN : p.ppb;
  const int64_t ps = p.page_size, bs = p.block_size, num_pages = p.num_pages;
  const int64_t L = p.kv_len[static_cast<size_t>(b)];
  const int64_t last = p.last_position(b, t - p.cu[static_cast<size_t>(b)]);
  uint64_t* const __restrict bits = hs.ring_bits.data() + slot * hs.ring_words;
  const int32_t* const __restrict first_rank = hs.ring_rank.data() + slot * p.msb;
  int32_t* const __restrict pages = out.pages;
  int32_t* const __restrict blocks = out.blocks;
  int32_t* const __restrict ranks = out.ranks;
  int32_t* const __restrict limits = out.limits;
  const int64_t lo = hs.ring_lo[static_cast<size_t>(slot)], hi = hs.ring_hi[static_cast<size_t>(slot)];
  int64_t n = 0, att = 0;
  for (int64_t w = lo >> 6; w <= hi >> 6 && hi >= 0; ++w) {
    const uint64_t word_bits = bits[w];
    bits[w] = 0;
    for (uint64_t word = word_bits; word != 0; word &= word - 1) {
      const int32_t id = static_cast<int32_t>(w * 64 + __builtin_ctzll(word));
      const int64_t start = id * bs;
      const int32_t* const src = table + id * np;
      int32_t* const dst = pages + n * np;
      const int64_t limit = std::min(bs, last + 1 - start);
      int64_t avail = 0;
      bool in_range = start + bs <= L;  // the whole block before L_b: every page read as it is
      if (in_range) {
        uint32_t any_bad = 0;
        for (int64_t j = 0; j < np; ++j) {
          const int32_t page = src[j];
          dst[j] = page;
          any_bad |= static_cast<uint32_t>(static_cast<int64_t>(static_cast<uint32_t>(page)) >= num_pages);
        }
        in_range = any_bad == 0;
        avail = bs;
      }
      if (!in_range) {  // the block's tail past L_b, or an unallocated (negative) or bad page id
        avail = 0;
        for (int64_t j = 0; j < np; ++j) {
          const int64_t pos = start + j * ps;
          int32_t page = pos < L ? src[j] : layout::kNoPage;
          if (page >= num_pages) bad_table_entry(b, id * np + j, num_pages, page);
          page = page < 0 ? layout::kNoPage : page;
          dst[j] = page;
          avail += page == layout::kNoPage ? 0 : std::clamp<int64_t>(L - pos, 0, ps);
        }
        if (avail == 0) continue;  // no allocated page
      }
      if (limit >= std::min(bs, L - start)) {
        att += avail;  // the whole block up to L_b (decode's every edge)
      } else {
        for (int64_t j = 0; j < np && j * ps < limit; ++j) {
          if (dst[j] != layout::kNoPage) att += std::min(ps, limit - j * ps);
        }
      }
      blocks[n] = id;
      ranks[n] = first_rank[id];
      limits[n++] = static_cast<int32_t>(limit);
    }
  }
  *attended += att;
  return n;
}

__attribute__((noinline)) int64_t plan_decode_emit(const Problem& p, int64_t b, int64_t t, const int32_t* table,
                                                   PlanWorkspace::HeadScratch& hs, int64_t slot, const DecodeOut& out,
                                                   int64_t* attended) {
  switch (p.ppb) {
    case 1: return decode_emit<1>(p, b, t, table, hs, slot, out, attended);
    case 2: return decode_emit<2>(p, b, t, table, hs, slot, out, attended);
    case 4: return decode_emit<4>(p, b, t, table, hs, slot, out, attended);
    case 8: return decode_emit<8>(p, b, t, table, hs, slot, out, attended);
    default: return decode_emit<0>(p, b, t, table, hs, slot, out, attended);
  }
}

void build_head(const InputsView& in, const Problem& p, int64_t h, int64_t b0, int64_t b1, PlanWorkspace::HeadScratch& hs,
                KvIndex& ix, int64_t unit0, int64_t edge0, HeadResult* result) {
  const size_t ppb = static_cast<size_t>(p.ppb);
  const int64_t ps = p.page_size, bs = p.block_size, Hkv = p.Hkv, topk = p.topk, max_pages = p.max_pages;
  const int64_t ippb = p.ppb, num_pages = p.num_pages;
  const int32_t* const sel = in.selected.data;
  const int32_t* const tables = in.block_tables.data;
  int64_t* const seen = hs.seen.data();
  int64_t* const pages_stamp = hs.pages_stamp.data();
  int32_t* const block_pages = hs.pages.data();
  int32_t* const block_avail = hs.avail.data();
  int32_t* const count = hs.count.data();
  uint64_t* const touched_bits = hs.touched_bits.data();
  int32_t* const touched = hs.touched.data();
  PlanWorkspace::Edge* const edges = hs.edges.data();
  int32_t* const unit_head = ix.unit_head.data();
  int32_t* const unit_batch = ix.unit_batch.data();
  int32_t* const unit_block = ix.unit_block.data();
  int64_t* const unit_edge_end = ix.unit_edge_begin.data() + 1;
  int32_t* const unit_pages = ix.unit_pages.data();
  int32_t* const edge_query = ix.edge_query.data();
  int32_t* const edge_rank = ix.edge_rank.data();
  int32_t* const edge_limit = ix.edge_limit.data();
  int32_t* const inverse = ix.inverse.data();
  int64_t units = unit0, base = edge0;  // the next unit and edge slots
  int64_t attended = 0;
  int64_t scanned = b0;  // decode sequences before it are scanned (decode_scan)
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t L = p.kv_len[static_cast<size_t>(b)];
      const int64_t t_begin = p.cu[static_cast<size_t>(b)], t_end = p.cu[static_cast<size_t>(b) + 1];
      const int32_t* const table = tables + b * max_pages;
      // A block's pages (kNoPage where unallocated or wholly at or after L_b), and the positions
      // before L_b on its allocated pages; then the positions an edge attends up to its limit.
      auto read_block = [&](int32_t id, int32_t* pages) -> int64_t {
        const int64_t start = id * bs;
        int64_t avail = 0;
        for (int64_t j = 0; j < ippb; ++j) {
          const int64_t lp = id * ippb + j;
          int32_t page = lp * ps < L ? table[lp] : layout::kNoPage;
          if (page >= num_pages) bad_table_entry(b, lp, num_pages, page);
          if (page < 0) page = layout::kNoPage;
          pages[j] = page;
          avail += page == layout::kNoPage ? 0 : std::clamp<int64_t>(L - start - j * ps, 0, ps);
        }
        return avail;
      };
      auto attended_to = [&](const int32_t* pages, int64_t start, int64_t limit, int64_t avail) {
        if (limit >= std::min(bs, L - start)) return avail;  // the whole block up to L_b (decode's every edge)
        int64_t a = 0;
        for (int64_t j = 0; j < ippb && j * ps < limit; ++j) {
          if (pages[j] != layout::kNoPage) a += std::min(ps, limit - j * ps);
        }
        return a;
      };
      if (t_end - t_begin == 1) {
        // One query (decode): its distinct valid blocks are the units, one edge each, in
        // ascending block order; a repeated block's first rank is its edge. The scans run
        // kDecodeAhead sequences ahead of the emits (above); each index array is then written in
        // its own loop, so that no loop keeps more pointers live than there are registers.
        for (; scanned < b1 && scanned <= b + kDecodeAhead; ++scanned) {
          if (p.qo_len(scanned) == 1) {
            const int64_t st = p.cu[static_cast<size_t>(scanned)];
            decode_scan(p, scanned, st, sel + (st * Hkv + h) * topk, tables + scanned * max_pages, hs,
                        scanned % kDecodeRing);
          }
        }
        const int64_t n = plan_decode_emit(p, b, t_begin, table, hs, b % kDecodeRing,
                                           {unit_pages + units * ippb, unit_block + units, edge_rank + base, edge_limit + base},
                                           &attended);
        const int32_t t = static_cast<int32_t>(t_begin);
        int32_t* const inv = inverse + (t * Hkv + h) * topk;
        for (int64_t i = 0; i < n; ++i) {
          unit_batch[units + i] = static_cast<int32_t>(b);
          unit_edge_end[units + i] = base + i + 1;
          edge_query[base + i] = t;
        }
        for (int64_t i = 0; i < n; ++i) inv[edge_rank[base + i]] = static_cast<int32_t>(base + i);
        units += n;
        base += n;
        continue;
      }
      const int64_t hb = ++hs.generation;  // stamps this (head, sequence)'s reads of its table
      int64_t n = 0;
      int64_t lo = p.msb, hi = -1;  // the range of blocks touched
      for (int64_t t = t_begin; t < t_end; ++t) {
        const int64_t stamp = ++hs.generation;  // this (query, head): a repeated id counts once
        const int64_t last = p.last_position(b, t - t_begin);
        const int32_t* const row = sel + (t * Hkv + h) * topk;
        for (int64_t r = 0; r < topk; ++r) {
          const int32_t id = row[r];
          if (id < 0) continue;                                        // padding
          const size_t blk = static_cast<size_t>(id);
          if (seen[blk] == stamp) continue;
          seen[blk] = stamp;
          const int64_t start = id * bs;
          if (start >= L || start > last) continue;                    // beyond L_b / causal future
          int32_t* const pages = block_pages + blk * ppb;
          if (pages_stamp[blk] != hb) {
            pages_stamp[blk] = hb;
            block_avail[blk] = static_cast<int32_t>(read_block(id, pages));
          }
          if (block_avail[blk] == 0) continue;                         // no allocated page
          const int64_t limit = std::min(bs, last + 1 - start);
          attended += attended_to(pages, start, limit, block_avail[blk]);
          edges[n++] = {static_cast<int32_t>(t), static_cast<int32_t>(r), static_cast<int32_t>(limit), id};
          if (count[blk]++ == 0) {
            touched_bits[blk >> 6] |= uint64_t{1} << (blk & 63);
            lo = std::min<int64_t>(lo, id);
            hi = std::max<int64_t>(hi, id);
          }
        }
      }
      if (n == 0) continue;
      // Units in ascending block order (the set bits of the touched blocks' words, without a
      // comparison sort); each unit's edges keep their (query, rank) order.
      int64_t nu = 0;
      for (int64_t w = lo >> 6; w <= hi >> 6; ++w) {
        for (uint64_t bits = touched_bits[w]; bits != 0; bits &= bits - 1) {
          touched[nu++] = static_cast<int32_t>(w * 64 + __builtin_ctzll(bits));
        }
        touched_bits[w] = 0;
      }
      int64_t offset = base;
      for (int64_t k = 0; k < nu; ++k) {
        const int32_t id = touched[k];
        const int32_t c = count[id];
        count[id] = static_cast<int32_t>(offset);  // now the unit's cursor
        offset += c;
        const int64_t u = units + k;
        unit_batch[u] = static_cast<int32_t>(b);
        unit_block[u] = id;
        unit_edge_end[u] = offset;
        copy_pages(unit_pages + static_cast<size_t>(u) * ppb, block_pages + static_cast<size_t>(id) * ppb, ppb);
      }
      for (int64_t i = 0; i < n; ++i) {
        const PlanWorkspace::Edge& e = edges[i];
        const int32_t id = count[e.block]++;
        edge_query[id] = e.t;
        edge_rank[id] = e.r;
        edge_limit[id] = e.limit;
        inverse[(e.t * Hkv + h) * topk + e.r] = id;
      }
      for (int64_t k = 0; k < nu; ++k) count[touched[k]] = 0;
      units += nu;
      base += n;
    }
  std::fill(unit_head + unit0, unit_head + units, static_cast<int32_t>(h));  // every unit here is head h's
  result->unit0 = unit0;
  result->edge0 = edge0;
  result->units = units - unit0;
  result->edges = base - edge0;
  result->attended = attended;
}

// Task i of the plan: KV head i / chunks, sequences [chunk_begin(i % chunks), chunk_begin(i % chunks + 1)).
struct HeadsTask {
  const InputsView* in;
  const Problem* p;
  PlanWorkspace* ws;
  KvIndex* ix;
  int64_t units_per_head, edges_per_head, chunks;
  HeadResult* results;
  int64_t chunk_begin(int64_t c) const { return c * p->B / chunks; }
  // Task i's first unit and edge slots: its head's, then the bounds of the head's earlier sequences.
  void run(int64_t i, PlanWorkspace::HeadScratch& hs) const {
    const int64_t h = i / chunks, b0 = chunk_begin(i % chunks), b1 = chunk_begin(i % chunks + 1);
    const size_t s0 = static_cast<size_t>(b0);
    build_head(*in, *p, h, b0, b1, hs, *ix, h * units_per_head + ws->seq_units[s0], h * edges_per_head + ws->seq_edges[s0],
               &results[i]);
  }
};

int head_task(void*, int i, uint8_t* closure) {
  const HeadsTask& c = *reinterpret_cast<const HeadsTask*>(closure);
  try {
    c.run(i, c.ws->heads[static_cast<size_t>(i)]);
  } catch (...) {
    c.results[i].error = std::current_exception();  // rethrown by the caller, in task order
  }
  return 0;
}

// Heads at once: each head's sequences in enough chunks that the pool's threads all have tasks
// (a decode step has few KV heads and many sequences), never a chunk of fewer than 8 sequences.
// The machine's hardware threads, asked once (a system call: not on every plan).
int64_t machine_threads() {
  static const int64_t n = std::max<int64_t>(std::thread::hardware_concurrency(), 1);
  return n;
}

int64_t chunks_per_head(const Problem& p, int64_t asked) {
  // Asked: that many tasks in all, rounded up to a multiple of the KV heads.
  if (asked > 0) return std::clamp<int64_t>((asked + p.Hkv - 1) / std::max<int64_t>(p.Hkv, 1), 1, std::max<int64_t>(p.B, 1));
  const int64_t threads = machine_threads();
  return std::clamp<int64_t>((threads + p.Hkv - 1) / p.Hkv, 1, std::max<int64_t>(p.B / 8, 1));
}

// The unit and edge arrays sized to `units` and `edges` (resize: a size seen before allocates
// nothing); unit_edge_begin[0] = 0.
void size_index(KvIndex& ix, int64_t units, int64_t edges, size_t ppb) {
  ix.unit_head.resize(static_cast<size_t>(units));
  ix.unit_batch.resize(static_cast<size_t>(units));
  ix.unit_block.resize(static_cast<size_t>(units));
  ix.unit_edge_begin.resize(static_cast<size_t>(units + 1));
  ix.unit_edge_begin[0] = 0;
  ix.unit_pages.resize(static_cast<size_t>(units) * ppb);
  ix.edge_query.resize(static_cast<size_t>(edges));
  ix.edge_rank.resize(static_cast<size_t>(edges));
  ix.edge_limit.resize(static_cast<size_t>(edges));
}

// Moves `n` elements of a per-slot array from slot `from` to slot `to` (to <= from).
template <class T>
void move_slots(std::vector<T>& v, int64_t from, int64_t to, int64_t n, int64_t width = 1) {
  if (from != to && n > 0) {
    std::memmove(v.data() + to * width, v.data() + from * width, static_cast<size_t>(n * width) * sizeof(T));
  }
}

}  // namespace

void build_kvouter_index(const InputsView& in, const Problem& p, PlanWorkspace& ws, KvIndex* out, bool parallel,
                         int64_t sequence_chunks) {
  KvIndex& ix = *out;
  ix.attended_pairs = 0;
  ix.inverse.assign(static_cast<size_t>(p.Tq * p.Hkv * p.topk), -1);
  ix.head_unit_begin.assign(static_cast<size_t>(p.Hkv + 1), 0);
  if (p.Tq == 0) {
    // No query, no edge. The scratch below is sized by msb, which an empty block_tables
    // ([0, max_pages], found by fuzz_validate_plan) can make 2^31 without holding any data.
    size_index(ix, 0, 0, static_cast<size_t>(p.ppb));
    return;
  }
  const size_t msb = static_cast<size_t>(p.msb), ppb = static_cast<size_t>(p.ppb);
  const int64_t bs = p.block_size, Hkv = p.Hkv, topk = p.topk;
  // The arrays are sized once per step to bounds (per head, an edge per (query, rank) and a unit
  // per block a sequence's queries can reach) and cut to the counts at the end: sizes that repeat
  // from step to step touch no allocator and fill nothing. Heads planned at once write from slots
  // of their bounds, moved together after (nothing moves where every bound is met, as in decode
  // without repeats); in order, each head starts where the last ended.
  int64_t head_edges = 0, head_units = 0, max_group_edges = 0;
  ws.seq_units.resize(static_cast<size_t>(p.B) + 1);
  ws.seq_edges.resize(static_cast<size_t>(p.B) + 1);
  for (int64_t b = 0; b < p.B; ++b) {
    ws.seq_units[static_cast<size_t>(b)] = head_units;
    ws.seq_edges[static_cast<size_t>(b)] = head_edges;
    const int64_t n = p.qo_len(b) * topk;
    const int64_t blocks = (p.kv_len[static_cast<size_t>(b)] + bs - 1) / bs;
    head_edges += n;
    head_units += std::min(n, blocks);
    max_group_edges = std::max(max_group_edges, n);
  }
  ws.seq_units[static_cast<size_t>(p.B)] = head_units;
  ws.seq_edges[static_cast<size_t>(p.B)] = head_edges;
  if (head_edges * Hkv >= std::numeric_limits<int32_t>::max()) {
    throw InputError("selected", "fewer than 2^31 (query, KV head, rank) entries", std::to_string(head_edges * Hkv));
  }
  const int64_t max_units = head_units * Hkv, max_edges = head_edges * Hkv;
  size_index(ix, max_units, max_edges, ppb);
  // Tasks: a head's sequences in chunks (heads at once), or each head whole. Scratch: one set
  // per task planned at once (stamps never cleared: they grow once).
  const int64_t asked_chunks = parallel ? chunks_per_head(p, sequence_chunks) : 1;
  const bool at_once = Hkv * asked_chunks > 1 && parallel;
  const int64_t chunks = at_once ? asked_chunks : 1, tasks = Hkv * chunks;
  const size_t sets = at_once ? static_cast<size_t>(tasks) : 1;
  if (ws.heads.size() < sets) ws.heads.resize(sets);
  for (size_t i = 0; i < sets; ++i) {
    PlanWorkspace::HeadScratch& hs = ws.heads[i];
    if (hs.seen.size() < msb || hs.pages.size() < msb * ppb) {  // stamps below any generation
      hs.seen.assign(msb, -1);
      hs.touched_bits.assign((msb + 63) / 64, 0);
      hs.pages_stamp.assign(msb, -1);
      hs.pages.assign(msb * ppb, layout::kNoPage);
      hs.avail.assign(msb, 0);
      hs.count.assign(msb, 0);
    }
    if (hs.ring_lo.size() < static_cast<size_t>(kDecodeRing) || hs.ring_rank.size() < static_cast<size_t>(kDecodeRing) * msb) {
      // (the spans too where msb is 0: a step whose every sequence is empty still scans)
      hs.ring_words = static_cast<int64_t>((msb + 63) / 64);
      hs.ring_bits.assign(static_cast<size_t>(kDecodeRing * hs.ring_words), 0);
      hs.ring_rank.assign(static_cast<size_t>(kDecodeRing) * msb, 0);
      hs.ring_lo.assign(static_cast<size_t>(kDecodeRing), 0);
      hs.ring_hi.assign(static_cast<size_t>(kDecodeRing), -1);
    }
    if (hs.edges.size() < static_cast<size_t>(max_group_edges)) hs.edges.resize(static_cast<size_t>(max_group_edges));
    if (hs.touched.size() < static_cast<size_t>(max_group_edges)) hs.touched.resize(static_cast<size_t>(max_group_edges));
  }
  ws.results.assign(static_cast<size_t>(tasks), {});
  HeadResult* const results = ws.results.data();
  HeadsTask task{&in, &p, &ws, &ix, head_units, head_edges, chunks, results};
  if (at_once) {
    const int err = detail::par_for(head_task, static_cast<int>(tasks), &task);
    for (int64_t i = 0; i < tasks; ++i) {
      if (results[i].error) std::rethrow_exception(results[i].error);
    }
    if (err != 0) throw std::runtime_error("plan: Halide's thread pool failed with " + std::to_string(err));
  } else {
    // One after another, each head from where the last ended: nothing moves below.
    for (int64_t h = 0, u = 0, e = 0; h < Hkv; u += results[h].units, e += results[h].edges, ++h) {
      build_head(in, p, h, 0, p.B, ws.heads[0], ix, u, e, &results[h]);
    }
  }
  // The tasks' slots, moved together: units, edges, and the edge ids that point at moved edges.
  int64_t units = 0, edges = 0, attended = 0;
  for (int64_t i = 0; i < tasks; ++i) {
    const HeadResult& r = results[i];
    const int64_t h = i / chunks;
    const int64_t t0 = p.cu[static_cast<size_t>(task.chunk_begin(i % chunks))];
    const int64_t t1 = p.cu[static_cast<size_t>(task.chunk_begin(i % chunks + 1))];
    const int64_t u0 = r.unit0, e0 = r.edge0, shift = edges - e0;
    move_slots(ix.unit_head, u0, units, r.units);
    move_slots(ix.unit_batch, u0, units, r.units);
    move_slots(ix.unit_block, u0, units, r.units);
    move_slots(ix.unit_pages, u0, units, r.units, p.ppb);
    move_slots(ix.unit_edge_begin, u0 + 1, units + 1, r.units);
    move_slots(ix.edge_query, e0, edges, r.edges);
    move_slots(ix.edge_rank, e0, edges, r.edges);
    move_slots(ix.edge_limit, e0, edges, r.edges);
    if (shift != 0) {
      for (int64_t u = units + 1; u <= units + r.units; ++u) ix.unit_edge_begin[static_cast<size_t>(u)] += shift;
      for (int64_t t = t0; t < t1; ++t) {  // the task's queries
        int32_t* const row = ix.inverse.data() + (t * Hkv + h) * topk;
        for (int64_t k = 0; k < topk; ++k) row[k] = row[k] < 0 ? row[k] : static_cast<int32_t>(row[k] + shift);
      }
    }
    units += r.units;
    edges += r.edges;
    attended += r.attended;
    ix.head_unit_begin[static_cast<size_t>(h) + 1] = units;  // the last of the head's tasks sets it
  }
  size_index(ix, units, edges, ppb);
  ix.attended_pairs = attended;
}

TileSet build_tiles(const Problem& p, const KvIndex& ix, int64_t T, int64_t query_batch) {
  PlanWorkspace ws;
  TileSet ts;
  build_tiles(p, ix, T, query_batch, ws, &ts);
  return ts;
}

void build_tiles(const Problem& p, const KvIndex& ix, int64_t T, int64_t query_batch, PlanWorkspace& ws,
                 TileSet* out) {
  if (T <= 0) throw InputError("tile_edges (T)", "a positive number of edges per tile", std::to_string(T));
  TileSet& ts = *out;
  ws.decode_tiles_of = {-1, -1, -1};  // tile_head and tile_query are rewritten below
  ts.T = T;
  ts.ppb = p.ppb;
  const int64_t Q = query_batch > 0 ? query_batch : std::max<int64_t>(p.Tq, 1);
  ts.query_batch = Q;
  const int64_t batches = std::max<int64_t>((p.Tq + Q - 1) / Q, 1);
  std::vector<int64_t>& cursor = ws.cursor;
  auto reset_cursor = [&] {
    cursor.assign(ix.unit_edge_begin.begin(), ix.unit_edge_begin.end() - (ix.num_units() > 0 ? 1 : 0));
  };
  // Tiles never mix batches: a unit's edges (ascending by query) are cut at batch boundaries.
  // Tiles are ordered by batch, then unit; one batch keeps the plain unit order.
  int64_t n = 0;
  if (batches == 1 && T == 1) {
    n = ix.num_edges();
  } else if (batches == 1) {
    for (int64_t u = 0; u < ix.num_units(); ++u) n += (ix.unit_edge_begin[u + 1] - ix.unit_edge_begin[u] + T - 1) / T;
  } else {
    reset_cursor();
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
  if (batches == 1 && T == 1) {
    // One edge per tile, in the index's order (decode-like plans): the tiles are the edges, each
    // partial row its edge's id, and partial_index the inverse map itself.
    ts.tile_head.resize(static_cast<size_t>(n));
    ts.tile_unit.resize(static_cast<size_t>(n));
    ts.tile_pages.resize(static_cast<size_t>(n * p.ppb));
    ts.tile_query.assign(ix.edge_query.begin(), ix.edge_query.end());
    ts.tile_limit.assign(ix.edge_limit.begin(), ix.edge_limit.end());
    ts.partial_index.assign(ix.inverse.begin(), ix.inverse.end());
    ts.edge_partial.resize(static_cast<size_t>(n));
    ts.batch_tile_begin.assign({0, n});
    const size_t ppb = static_cast<size_t>(p.ppb);
    if (n > 0 && ix.num_units() == n) {  // (no memcpy of empty arrays: their data() may be null)
      // One edge per unit too (decode): tile u is unit u, every array a copy or the identity.
      std::memcpy(ts.tile_head.data(), ix.unit_head.data(), static_cast<size_t>(n) * sizeof(int32_t));
      std::memcpy(ts.tile_pages.data(), ix.unit_pages.data(), static_cast<size_t>(n) * ppb * sizeof(int32_t));
      for (int32_t e = 0; e < static_cast<int32_t>(n); ++e) ts.tile_unit[static_cast<size_t>(e)] = e;
      std::memcpy(ts.edge_partial.data(), ts.tile_unit.data(), static_cast<size_t>(n) * sizeof(int32_t));
      return;
    }
    int32_t* const tile_head = ts.tile_head.data();
    int32_t* const tile_unit = ts.tile_unit.data();
    int32_t* const tile_pages = ts.tile_pages.data();
    int32_t* const edge_partial = ts.edge_partial.data();
    const int32_t* const unit_pages = ix.unit_pages.data();
    for (int64_t u = 0; u < ix.num_units(); ++u) {
      const int32_t head = ix.unit_head[static_cast<size_t>(u)];
      const int32_t* const pages = unit_pages + static_cast<size_t>(u) * ppb;
      for (int64_t e = ix.unit_edge_begin[static_cast<size_t>(u)]; e < ix.unit_edge_begin[static_cast<size_t>(u) + 1]; ++e) {
        tile_head[e] = head;
        tile_unit[e] = static_cast<int32_t>(u);
        copy_pages(tile_pages + static_cast<size_t>(e) * ppb, pages, ppb);
        edge_partial[e] = static_cast<int32_t>(e);
      }
    }
    return;
  }
  ts.tile_head.resize(static_cast<size_t>(n));
  ts.tile_unit.resize(static_cast<size_t>(n));
  ts.tile_pages.resize(static_cast<size_t>(n * p.ppb));
  ts.tile_query.assign(static_cast<size_t>(n * T), layout::kNoQuery);
  ts.tile_limit.assign(static_cast<size_t>(n * T), 0);
  ts.partial_index.assign(ix.inverse.size(), layout::kNoPartial);
  ts.batch_tile_begin.assign(1, 0);
  std::vector<int32_t>& edge_partial = ts.edge_partial;
  edge_partial.resize(static_cast<size_t>(ix.num_edges()));

  reset_cursor();
  int64_t tile = 0;
  for (int64_t bt = 0; bt < batches; ++bt) {
    for (int64_t u = 0; u < ix.num_units(); ++u) {
      const int32_t* unit_pages = &ix.unit_pages[static_cast<size_t>(u * p.ppb)];
      int64_t e_end = cursor[u];
      if (batches == 1) {
        e_end = ix.unit_edge_begin[u + 1];
      } else {
        while (e_end < ix.unit_edge_begin[u + 1] && (bt == batches - 1 || ix.edge_query[e_end] < (bt + 1) * Q)) ++e_end;
      }
      for (int64_t e0 = cursor[u]; e0 < e_end; e0 += T, ++tile) {
        ts.tile_head[tile] = ix.unit_head[u];
        ts.tile_unit[tile] = static_cast<int32_t>(u);
        std::copy(unit_pages, unit_pages + p.ppb, &ts.tile_pages[static_cast<size_t>(tile * p.ppb)]);
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
}

bool is_decode_step(const Problem& p) {
  if (p.Tq != p.B) return false;
  for (int64_t b = 0; b < p.B; ++b) {
    if (p.cu[static_cast<size_t>(b)] != b) return false;  // cu rises by one from 0 to Tq = B
  }
  return true;
}

namespace {

// The fixed decode layout's rows of one query t (sequence t): each rank's tile, in rank order.
// Returns false at a reached table entry that is a bad page id. Compiled for the common
// pages-per-block counts (the page reads unrolled).
template <int64_t kN>
__attribute__((always_inline)) inline bool decode_rows(const Problem& p, int64_t t, const int32_t* __restrict sel,
                                                       const int32_t* __restrict table, int64_t* __restrict seen,
                                                       int64_t* generation, TileSet& ts, int64_t* units,
                                                       int64_t* attended) {
  const int64_t np = kN > 0 ? kN : p.ppb;
  const int64_t ps = p.page_size, bs = p.block_size, num_pages = p.num_pages, topk = p.topk;
  // One query per sequence: it may attend every position before L_b, causal or not.
  const int64_t L = p.kv_len[static_cast<size_t>(t)];
  int32_t* const __restrict pages = ts.tile_pages.data();
  int32_t* const __restrict limits = ts.tile_limit.data();
  int32_t* const __restrict pidx = ts.partial_index.data();
  int64_t n = 0, att = 0;
  for (int64_t h = 0; h < p.Hkv; ++h) {
    const int64_t stamp = ++*generation;  // this (query, head): a repeated id counts once
    const int64_t base = (t * p.Hkv + h) * topk;
    for (int64_t r = 0; r < topk; ++r) {
      const int64_t tile = base + r;
      const int32_t id = sel[tile];
      int32_t* const dst = pages + tile * np;
      const int64_t start = static_cast<int64_t>(id) * bs;
      int64_t avail = 0;
      if (id >= 0 && start < L && seen[id] != stamp) {
        seen[id] = stamp;
        const int32_t* const src = table + static_cast<int64_t>(id) * np;
        uint32_t any_bad = 0;
        for (int64_t j = 0; j < np; ++j) {
          const int32_t page = src[j];
          dst[j] = page;
          any_bad |= static_cast<uint32_t>(static_cast<int64_t>(static_cast<uint32_t>(page)) >= num_pages);
        }
        avail = bs;
        if (start + bs > L || any_bad != 0) {  // the block's tail past L_b, or an unallocated or bad page id
          avail = 0;
          for (int64_t j = 0; j < np; ++j) {
            const int64_t pos = start + j * ps;
            int32_t page = pos < L ? src[j] : layout::kNoPage;
            if (page >= num_pages) return false;
            page = page < 0 ? layout::kNoPage : page;
            dst[j] = page;
            avail += page == layout::kNoPage ? 0 : std::min<int64_t>(L - pos, ps);
          }
        }
      }
      if (avail == 0) {  // padding, beyond L_b, a repeat, or no allocated page
        for (int64_t j = 0; j < np; ++j) dst[j] = layout::kNoPage;
        limits[tile] = 0;
        pidx[tile] = layout::kNoPartial;
        continue;
      }
      att += avail;  // the whole block up to L_b
      limits[tile] = static_cast<int32_t>(std::min(bs, L - start));
      pidx[tile] = static_cast<int32_t>(tile);
      ++n;
    }
  }
  *units += n;
  *attended += att;
  return true;
}

__attribute__((noinline)) bool plan_decode_rows(const Problem& p, int64_t t, const int32_t* sel, const int32_t* table,
                                                int64_t* seen, int64_t* generation, TileSet& ts, int64_t* units,
                                                int64_t* attended) {
  switch (p.ppb) {
    case 1: return decode_rows<1>(p, t, sel, table, seen, generation, ts, units, attended);
    case 2: return decode_rows<2>(p, t, sel, table, seen, generation, ts, units, attended);
    case 4: return decode_rows<4>(p, t, sel, table, seen, generation, ts, units, attended);
    case 8: return decode_rows<8>(p, t, sel, table, seen, generation, ts, units, attended);
    default: return decode_rows<0>(p, t, sel, table, seen, generation, ts, units, attended);
  }
}

// Task i of a fixed decode layout: queries [begin(i), begin(i + 1)), with scratch set i; its
// result's units and attended positions, and edges -1 at a bad table entry.
struct DecodeTask {
  const InputsView* in;
  const Problem* p;
  PlanWorkspace* ws;
  TileSet* ts;
  int64_t tasks;
  int64_t begin(int64_t i) const { return i * p->Tq / tasks; }
  void run(int64_t i) const {
    // The block-table lines of query t + kDecodeAhead are requested before query t's rows are
    // written (an engine plans with its inputs out of the caches). Where the row's lines up to L_b
    // are no more than the query's entries (gpu-decode: 64 and 64), the whole span is requested
    // in order, which the hardware's stream prefetch follows; otherwise each entry's line (the
    // cost stays with the edges, not the table's width). Cold gpu-decode plan on the build
    // machine: 87-202 us swept, 94-248 us per entry (experiments/results/cpu/2026-12-03/plan_decode_layout.md).
    const Problem& pr = *p;
    const int64_t per_row = pr.Hkv * pr.topk, t0 = begin(i), t1 = begin(i + 1);
    constexpr int64_t kLine = 64 / sizeof(int32_t);
    const int32_t* const sel = in->selected.data;
    const int32_t* const tables = in->block_tables.data;
    auto request = [&](int64_t t) {
      const int32_t* const table = tables + t * pr.max_pages;
      const int64_t used = std::min<int64_t>(pr.max_pages, (pr.kv_len[static_cast<size_t>(t)] + pr.page_size - 1) / pr.page_size);
      if (used <= per_row * kLine) {
        for (int64_t k = 0; k < used; k += kLine) __builtin_prefetch(table + k);
        return;
      }
      const int32_t* const row = sel + t * per_row;
      for (int64_t k = 0; k < per_row; ++k) {
        if (row[k] >= 0) __builtin_prefetch(table + static_cast<int64_t>(row[k]) * pr.ppb);
      }
    };
    PlanWorkspace::HeadScratch& hs = ws->heads[static_cast<size_t>(i)];
    HeadResult& r = ws->results[static_cast<size_t>(i)];
    for (int64_t t = t0; t < std::min(t0 + kDecodeAhead, t1); ++t) request(t);
    for (int64_t t = t0; t < t1; ++t) {
      if (t + kDecodeAhead < t1) request(t + kDecodeAhead);
      if (!plan_decode_rows(pr, t, sel, tables + t * pr.max_pages, hs.seen.data(), &hs.generation, *ts, &r.units,
                            &r.attended)) {
        r.edges = -1;
        return;
      }
    }
  }
};

int decode_task(void*, int i, uint8_t* closure) {
  reinterpret_cast<const DecodeTask*>(closure)->run(i);  // throws nothing
  return 0;
}

}  // namespace

bool build_decode_tiles(const InputsView& in, const Problem& p, int64_t query_batch, PlanWorkspace& ws, TileSet* out,
                        int64_t* units, int64_t* attended, bool parallel, int64_t chunks, bool layout_only) {
  TileSet& ts = *out;
  // (A step of no query may claim any Hkv x topk: validate() bounds the product only with Tq.)
  const int64_t per_query = p.Tq == 0 ? 0 : p.Hkv * p.topk, n = p.Tq * per_query;
  if (n >= std::numeric_limits<int32_t>::max()) {
    throw InputError("selected", "fewer than 2^31 (query, KV head, rank) entries", std::to_string(n));
  }
  ts.T = 1;
  ts.ppb = p.ppb;
  ts.num_tiles = n;
  const int64_t Q = query_batch > 0 ? query_batch : std::max<int64_t>(p.Tq, 1);
  ts.query_batch = Q;
  ts.batch_tile_begin.assign(1, 0);
  for (int64_t t1 = std::min(Q, p.Tq); ts.batch_tile_begin.back() < n; t1 = std::min(t1 + Q, p.Tq)) {
    ts.batch_tile_begin.push_back(t1 * per_query);
  }
  if (ts.batch_tile_begin.size() == 1) ts.batch_tile_begin.push_back(0);
  ts.tile_unit.clear();
  ts.edge_partial.clear();
  const size_t built = layout_only ? 0 : static_cast<size_t>(n);
  ts.tile_pages.resize(built * static_cast<size_t>(p.ppb));
  ts.tile_limit.resize(built);
  ts.partial_index.resize(built);
  const std::array<int64_t, 3> shape{p.Tq, p.Hkv, p.topk};
  if (ws.decode_tiles_of != shape) {  // tile_head and tile_query depend on the shape alone
    ts.tile_head.resize(static_cast<size_t>(n));
    ts.tile_query.resize(static_cast<size_t>(n));
    for (int64_t t = 0; t < p.Tq; ++t) {
      for (int64_t h = 0; h < p.Hkv; ++h) {
        const size_t base = static_cast<size_t>((t * p.Hkv + h) * p.topk);
        std::fill_n(ts.tile_head.begin() + static_cast<std::ptrdiff_t>(base), p.topk, static_cast<int32_t>(h));
        std::fill_n(ts.tile_query.begin() + static_cast<std::ptrdiff_t>(base), p.topk, static_cast<int32_t>(t));
      }
    }
    ws.decode_tiles_of = shape;
  }
  *units = 0;
  *attended = 0;
  if (n == 0 || layout_only) return true;
  // Tasks over query ranges (at once on Halide's thread pool where asked: each query's tiles are
  // its own), of at least 16 queries; one scratch set each.
  const int64_t tasks = parallel ? std::clamp<int64_t>(chunks > 0 ? chunks : machine_threads(), 1, std::max<int64_t>(p.Tq / 16, 1)) : 1;
  if (ws.heads.size() < static_cast<size_t>(tasks)) ws.heads.resize(static_cast<size_t>(tasks));
  ws.results.assign(static_cast<size_t>(tasks), {});
  for (int64_t i = 0; i < tasks; ++i) {
    PlanWorkspace::HeadScratch& hs = ws.heads[static_cast<size_t>(i)];
    if (hs.seen.size() < static_cast<size_t>(p.msb)) hs.seen.assign(static_cast<size_t>(p.msb), -1);  // below any stamp
  }
  DecodeTask task{&in, &p, &ws, &ts, tasks};
  if (tasks > 1) {
    const int err = detail::par_for(decode_task, static_cast<int>(tasks), &task);
    if (err != 0) throw std::runtime_error("plan: Halide's thread pool failed with " + std::to_string(err));
  } else {
    task.run(0);
  }
  bool ok = true;
  for (const HeadResult& r : ws.results) {
    ok &= r.edges >= 0;
    *units += r.units;
    *attended += r.attended;
  }
  return ok;
}

double Plan::kv_unit_bytes() const {
  return 2.0 * static_cast<double>(units) * static_cast<double>(problem.block_size) *
         static_cast<double>(problem.D) * dtype_bytes(problem.dtype);
}

int64_t auto_tile_edges(const KvIndex& ix) {
  if (ix.num_units() == 0) return 16;
  const int64_t mean = (ix.num_edges() + ix.num_units() - 1) / ix.num_units();
  int64_t T = 1;
  while (T < mean && T < 16) T *= 2;
  return T;
}

Plan make_plan(const InputsView& in, const PlanOptions& opt) {
  Planner planner(opt);
  planner.plan(in);
  return planner.current();
}

const Plan& Planner::plan(const InputsView& in) { return build(in, true); }

const Plan& Planner::plan_checked_tables(const InputsView& in) { return build(in, false); }

const Plan& Planner::plan_on_device(const InputsView& in) { return build(in, false, true); }

const Plan& Planner::build(const InputsView& in, bool check_block_tables, bool on_device) {
  try {
    return build_step(in, check_block_tables, on_device);
  } catch (...) {
    ws_ = PlanWorkspace{};  // a plan stopped by bad input may leave its scratch marks set
    throw;
  }
}

const Plan& Planner::build_step(const InputsView& in, bool check_block_tables, bool on_device) {
  const Stopwatch t0;
  validate(in, &plan_.problem, check_block_tables);
  Plan& plan = plan_;
  plan.validate_ms = t0.ms();
  const Problem& p = plan.problem;
  // A tile's largest device buffer share: its partials, or the GPU schedules' per-tile
  // intermediates (scores and weights: block x rows; the block's K: block x D).
  auto tile_floats = [&](int64_t T) {
    const int64_t rows = T * p.qhead;
    return std::max({rows * (p.D + layout::kPartialExtra), p.block_size * rows, p.block_size * p.D});
  };
  if (opt_.decode_layout && opt_.tile_edges <= 1 && is_decode_step(p)) {
    // Query batches of equal tiles: as many queries as the limit holds.
    // (A step of no query may claim any Hkv x topk: validate() bounds the product only with Tq.)
    int64_t Q = 0;
    if (opt_.max_batch_partial_floats > 0 && p.Tq > 0) {
      int64_t query_floats = 0, all = 0;
      const bool huge = __builtin_mul_overflow(p.Hkv * p.topk, tile_floats(1), &query_floats);
      const bool fits = !huge && !__builtin_mul_overflow(p.Tq, query_floats, &all) && all <= opt_.max_batch_partial_floats;
      if (!fits) Q = huge ? 0 : opt_.max_batch_partial_floats / query_floats;
      if (!fits && Q == 0) {
        throw BackendError("plan: the partials of one query exceed the device's buffer limit of " +
                           std::to_string(opt_.max_batch_partial_floats) + " floats");
      }
    }
    int64_t units = 0, attended = 0;
    // The device builds one batch's tiles (its partial index is the step's).
    const bool device = on_device && Q == 0;
    if (build_decode_tiles(in, p, Q, ws_, &plan.tiles, &units, &attended, opt_.parallel_heads, opt_.sequence_chunks,
                           device)) {
      size_index(plan.index, 0, 0, static_cast<size_t>(p.ppb));
      plan.index.inverse.clear();
      plan.index.head_unit_begin.clear();
      plan.index.attended_pairs = 0;
      plan.decode_layout = true;
      plan.tiles_on_device = device;
      plan.units = plan.edges = device ? -1 : units;
      plan.attended_pairs = device ? -1 : attended;
      plan.plan_ms = t0.ms();
      return plan;
    }
    // A bad table entry: the indexed plan below reports it.
  }
  plan.decode_layout = false;
  plan.tiles_on_device = false;
  build_kvouter_index(in, p, ws_, &plan.index, opt_.parallel_heads, opt_.sequence_chunks);
  const int64_t T = opt_.tile_edges > 0 ? opt_.tile_edges : auto_tile_edges(plan.index);
  build_tiles(p, plan.index, T, 0, ws_, &plan.tiles);
  if (opt_.max_batch_partial_floats > 0) {
    // Query batches whose partials each fit the limit: start from the even split, halve the
    // batch until every batch fits (tiles cut at batch boundaries add padding rows).
    const int64_t tile_floats_T = tile_floats(T);
    auto fits = [&](const TileSet& ts) {
      for (size_t b = 0; b + 1 < ts.batch_tile_begin.size(); ++b) {
        if ((ts.batch_tile_begin[b + 1] - ts.batch_tile_begin[b]) * tile_floats_T > opt_.max_batch_partial_floats) return false;
      }
      return true;
    };
    if (!fits(plan.tiles)) {
      const double total = static_cast<double>(plan.tiles.num_tiles) * static_cast<double>(tile_floats_T);
      int64_t Q = std::max<int64_t>(1, static_cast<int64_t>(static_cast<double>(p.Tq) * static_cast<double>(opt_.max_batch_partial_floats) / total));
      for (;;) {
        build_tiles(p, plan.index, T, Q, ws_, &plan.tiles);
        if (fits(plan.tiles)) break;
        if (Q == 1) {
          throw BackendError("plan: the partials of one query exceed the device's buffer limit of " +
                             std::to_string(opt_.max_batch_partial_floats) + " floats");
        }
        Q = std::max<int64_t>(1, Q / 2);
      }
    }
  }
  plan.units = plan.index.num_units();
  plan.edges = plan.index.num_edges();
  plan.attended_pairs = plan.index.attended_pairs;
  plan.plan_ms = t0.ms();
  return plan;
}

}  // namespace kvouter
