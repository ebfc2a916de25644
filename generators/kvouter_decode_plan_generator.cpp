// kvouter_decode_plan: a decode step's plan in the fixed decode layout (runtime/include/kvouter/plan.h,
// PlanOptions::decode_layout), built on the device from the step's selection and lengths and
// the device-resident block tables (DeviceStepRunner::write_block_tables). The same arrays as the
// host's build_decode_tiles (runtime/src/plan.cpp), element for element:
//   tile (t * Hkv + h) * topk + r is rank r of selected[t, h, :], with T = 1;
//   a rank that attends nothing (padding, a block at or beyond L_t, a repeat of an earlier rank,
//   a block without an allocated page before L_t) gets limit 0, no page, and partial index -1;
//   otherwise each page of the block before L_t with an allocated id, limit min(block, L_t - start),
//   and partial index = its tile.
// Rows past the step's tiles (the runner pads its arrays to whole rows) are written as empty.
//
// Page ids are checked where the tables are written (an id at or past num_pages is refused
// there); here an id outside [0, num_pages) is no page, and every index is clamped into its
// buffer, so that nothing is read outside the inputs.
#include <Halide.h>

#include "kvouter/tile_layout.h"

namespace kvouter::pipeline {
namespace {

using namespace Halide;

class KvouterDecodePlan : public Generator<KvouterDecodePlan> {
 public:
  // selected [Tq, Hkv, topk] in C order, then kv_len [Tq]: one upload per step.
  Input<Buffer<int32_t, 1>> step{"step"};
  // The block tables [B, max_pages] as the KV writer's 32-bit pool (1, entry, 1, sequence), so
  // that entries are written in place by kvouter_kv_write.
  Input<Buffer<uint32_t, 4>> tables{"tables"};
  Input<int32_t> tq{"tq"}, hkv{"hkv"}, topk{"topk"};
  Input<int32_t> block_size{"block_size"}, page_size{"page_size"}, num_pages{"num_pages"};
  Output<Buffer<int32_t, 2>> tile_pages{"tile_pages"};        // (j, tile): [tiles, ppb]
  Output<Buffer<int32_t, 2>> tile_limit{"tile_limit"};        // (edge, tile): [tiles, 1]
  // [Tq, Hkv, topk] flat: in the decode layout entry (t, h, r) is tile (t * Hkv + h) * topk + r's.
  Output<Buffer<int32_t, 1>> partial_index{"partial_index"};

  void generate() {
    const Expr n = tq * hkv * topk;
    const Expr ppb = block_size / page_size;
    const Expr last_step = step.dim(0).max();
    Var tl("tl"), j("j"), e("e");

    // Tile x's facts.
    auto query_of = [&](const Expr& x) { return clamp(x / max(hkv * topk, 1), 0, max(tq - 1, 0)); };
    auto id_of = [&](const Expr& x) { return select(x < n, step(clamp(x, 0, last_step)), -1); };
    auto len_of = [&](const Expr& x) { return step(clamp(n + query_of(x), 0, last_step)); };
    auto entry_of = [&](const Expr& x, const Expr& jj) {
      const Expr at = clamp(id_of(x) * ppb + jj, tables.dim(1).min(), tables.dim(1).max());
      const Expr seq = clamp(query_of(x), tables.dim(3).min(), tables.dim(3).max());
      return reinterpret(Int(32), tables(0, at, 0, seq));
    };
    // Per output, Funcs of its own (computed in its thread): whether an earlier rank of the same
    // (query, head) names the same block, and the block's positions before L whose page is
    // allocated.
    struct Facts {
      Func repeat, avail;
    };
    auto facts = [&](const std::string& tag) {
      Facts f{Func("repeat_" + tag), Func("avail_" + tag)};
      Var v("v_" + tag);
      RDom rr(0, topk, "rr_" + tag);
      const Expr rank_v = v % max(topk, 1);
      const Expr other = step(clamp(v - rank_v + rr, 0, last_step));
      f.repeat(v) = 0;
      f.repeat(v) = f.repeat(v) | select(rr < rank_v && other == id_of(v), 1, 0);
      RDom rj(0, ppb, "rj_" + tag);
      const Expr pos = id_of(v) * block_size + rj * page_size, L = len_of(v), page = entry_of(v, rj);
      f.avail(v) = 0;
      f.avail(v) = f.avail(v) + select(pos < L && page >= 0 && page < num_pages, min(L - pos, page_size), 0);
      return f;
    };
    auto good = [&](Facts f, const Expr& x) {
      return x < n && id_of(x) >= 0 && id_of(x) * block_size < len_of(x) && f.repeat(x) == 0 && f.avail(x) > 0;
    };

    const Facts fp = facts("pages");
    const Expr page = entry_of(tl, j), pos = id_of(tl) * block_size + j * page_size;
    tile_pages(j, tl) = select(good(fp, tl) && pos < len_of(tl) && page >= 0 && page < num_pages, page, layout::kNoPage);

    const Facts fl = facts("limit");
    tile_limit(e, tl) = select(good(fl, tl), min(block_size, len_of(tl) - id_of(tl) * block_size), 0);

    const Facts fi = facts("index");
    partial_index(tl) = select(good(fi, tl), tl, layout::kNoPartial);

    step.set_estimates({{0, 8192 + 128}});
    tables.set_estimates({{0, 1}, {0, 4096}, {0, 1}, {0, 128}});
    tq.set_estimate(128);
    hkv.set_estimate(4);
    topk.set_estimate(16);
    block_size.set_estimate(64);
    page_size.set_estimate(16);
    num_pages.set_estimate(1 << 20);
    tile_pages.set_estimates({{0, 4}, {0, 8192}});
    tile_limit.set_estimates({{0, 1}, {0, 8192}});
    partial_index.set_estimates({{0, 8192}});

    // One thread per tile (per partial index entry), its facts in registers; on a GPU the three
    // outputs in one kernel (compute_with), so that the plan is one launch.
    const bool gpu = get_target().has_gpu_feature();
    constexpr int kThreads = 64;
    Var xo("xo"), xi("xi");
    auto per_thread = [&](Func out, Facts f, const Var& lane) {
      out.split(lane, xo, xi, kThreads, TailStrategy::GuardWithIf);
      if (gpu) {
        out.gpu_blocks(xo).gpu_threads(xi);
      } else {
        out.parallel(xo);
      }
      f.repeat.compute_at(out, xi);
      f.avail.compute_at(out, xi);
    };
    per_thread(tile_pages, fp, tl);  // its ppb pages in order in the thread
    per_thread(tile_limit, fl, tl);
    per_thread(partial_index, fi, tl);
    if (gpu) {
      tile_limit.compute_with(tile_pages, xi);
      partial_index.compute_with(tile_pages, xi);
    }
  }
};

}  // namespace
}  // namespace kvouter::pipeline

HALIDE_REGISTER_GENERATOR(kvouter::pipeline::KvouterDecodePlan, kvouter_decode_plan)
