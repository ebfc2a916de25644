// kvouter_forward: the KV-outer forward pass over the runtime's tiles (runtime/include/kvouter/
// tile_layout.h). One tile = up to T edges (queries) that chose the same KV block of one KV head;
// the block is gathered from the paged cache once per tile, processed chunk by chunk, and every
// (edge, head lane) row of the tile is served from it. The algorithm lives here and nowhere else;
// schedules/ only schedule it.
#include <Halide.h>

#include "kvouter/tile_layout.h"
#include "kvouter_funcs.h"
#include "schedule_registry.h"

namespace kvouter::pipeline {
namespace {

using namespace Halide;

class KvouterForward : public Generator<KvouterForward> {
 public:
  GeneratorParam<std::string> schedule{"schedule", "cpu_tiled"};
  // The storage dtype of q, k_pages and v_pages (SPEC section 1): float32, float16, or bfloat16
  // (its bits, uint16). Values are widened to float32 on load; everything after is float32.
  GeneratorParam<std::string> storage{"storage", "float32"};
  // Shape specialisation; 0 = taken from the buffers at run time (the generic variant).
  GeneratorParam<int> head_dim{"D", 0};
  GeneratorParam<int> page_size{"page_size", 0};
  GeneratorParam<int> block_size{"block_size", 0};
  GeneratorParam<int> qhead{"qhead", 0};
  GeneratorParam<int> tile_edge_count{"T", 0};
  // Schedule knobs (see Knobs).
  GeneratorParam<int> chunk{"chunk", knob_defaults::chunk};
  GeneratorParam<int> vec{"vec", knob_defaults::vec};
  GeneratorParam<int> rows{"rows", knob_defaults::rows};
  GeneratorParam<int> unroll{"unroll", knob_defaults::unroll};
  GeneratorParam<int> grain{"grain", knob_defaults::grain};
  GeneratorParam<int> slice{"slice", knob_defaults::slice};
  GeneratorParam<int> ahead{"ahead", knob_defaults::ahead};
  // Estimates for the autoschedulers (default: the prefill shape). Autoscheduled twins are
  // compiled with the real extents, so their splits never exceed an output's extent.
  GeneratorParam<int> est_tq{"est_tq", 2048};
  GeneratorParam<int> est_hq{"est_hq", 16};
  GeneratorParam<int> est_hkv{"est_hkv", 2};
  GeneratorParam<int> est_pages{"est_pages", 256};
  GeneratorParam<int> est_tiles{"est_tiles", 3200};

  Input<Buffer<void, 3>> q{"q"};              // (d, j, t), of the storage type
  Input<Buffer<void, 4>> k_pages{"k_pages"};  // (d, slot, h, page)
  Input<Buffer<void, 4>> v_pages{"v_pages"};
  Input<Buffer<int32_t, 1>> tile_head{"tile_head"};    // (tile)
  Input<Buffer<int32_t, 2>> tile_pages{"tile_pages"};  // (page in block, tile)
  Input<Buffer<int32_t, 2>> tile_query{"tile_query"};  // (edge, tile)
  Input<Buffer<int32_t, 2>> tile_limit{"tile_limit"};  // (edge, tile)
  Input<float> scale{"scale"};
  Output<Buffer<float, 3>> partials{"partials"};       // (ch, row, tile), row = edge * qhead + lane

  Type storage_type() const {
    const std::string s = storage;
    if (s == "float32") return Float(32);
    if (s == "float16") return Float(16);
    if (s == "bfloat16") return UInt(16);  // the bits: widened by a shift, on every target
    throw CompileError("kvouter_forward: storage '" + s + "': expected float32, float16 or bfloat16");
  }

  void configure() {
    const Type t = storage_type();
    q.set_type(t);
    k_pages.set_type(t);
    v_pages.set_type(t);
  }

  // A stored value, exactly, as float32.
  Expr widen(Expr x) const {
    if (std::string(storage) == "bfloat16") return reinterpret(Float(32), cast(UInt(32), x) << 16);
    return cast(Float(32), x);
  }

  void generate() {
    const ScheduleInfo* info = using_autoscheduler() ? nullptr : find_schedule(schedule);
    if (!using_autoscheduler() && (!info || !info->forward)) {
      throw CompileError("kvouter_forward: schedule '" + std::string(schedule) +
                         "' is not a manual forward schedule");
    }
    if (ahead < 0 || (ahead > 0 && (!info || !info->takes_ahead() || get_target().has_gpu_feature()))) {
      throw CompileError("kvouter_forward: ahead=" + std::to_string(int(ahead)) + ": schedule '" + std::string(schedule) +
                         "' does not request rows ahead (ahead must be 0; cpu_decode takes it, on a CPU target)");
    }
    ForwardFuncs f;
    Var d = f.d, p = f.p, row = f.row, c = f.c, tile = f.tile, ch = f.ch;

    const bool static_block = block_size > 0 && page_size > 0;
    Expr D = head_dim > 0 ? Expr(int(head_dim)) : q.dim(0).extent();
    Expr PS = page_size > 0 ? Expr(int(page_size)) : k_pages.dim(1).extent();
    Expr PPB = static_block ? Expr(int(block_size) / int(page_size)) : tile_pages.dim(0).extent();
    Expr BS = static_block ? Expr(int(block_size)) : PS * PPB;
    Expr Hkv = k_pages.dim(2).extent();
    Expr QH = qhead > 0 ? Expr(int(qhead)) : q.dim(1).extent() / Hkv;
    Expr T = tile_edge_count > 0 ? Expr(int(tile_edge_count)) : tile_query.dim(0).extent();
    // chunk 0: the whole block as one chunk (knob_defaults), which needs the block specialised.
    if (chunk == 0 && !static_block) {
      throw CompileError("kvouter_forward: chunk=0 (the whole block as one chunk) needs block_size and "
                         "page_size specialised");
    }
    const int C = static_block ? (chunk == 0 ? int(block_size) : std::min(int(chunk), int(block_size))) : int(chunk);
    Expr NC = (BS + C - 1) / C;
    f.D = D;
    f.static_D = head_dim;
    f.static_rows = tile_edge_count > 0 && qhead > 0 ? int(tile_edge_count) * int(qhead) : 0;
    f.static_T = tile_edge_count;
    f.static_C = static_block ? C : 0;
    f.static_page = page_size > 0 ? int(page_size) : 0;
    f.storage = storage_type();
    // On CUDA, K and V rows in 16-byte groups of channels that a schedule may load as vectors
    // (ld.global.nc.v4.b32 in float32): the device cache's pools are dense and their buffers
    // 256-byte aligned, which the stride constraints and the alignment below state to Halide
    // (without them the NVPTX backend splits a vector load into scalar ones). Only the host
    // pointer's alignment is checked at run time; the device pointers are the cache's allocations.
    const int elem_bytes = storage_type().bytes(), group = 16 / elem_bytes;
    if (!using_autoscheduler() && get_target().has_feature(Target::CUDA) && head_dim > 0 && head_dim % group == 0) {
      for (Input<Buffer<void, 4>>* pool : {&k_pages, &v_pages}) {
        pool->set_host_alignment(16);
        pool->dim(2).set_stride((pool->dim(2).stride() / group) * group);
        pool->dim(3).set_stride((pool->dim(3).stride() / group) * group);
      }
      f.kv_group = group;
    }
    f.static_NC = static_block ? (int(block_size) + C - 1) / C : 0;
    f.rd = RDom(0, D, "rd");
    f.rp = RDom(0, C, "rp");
    f.rc = RDom(0, NC, "rc");

    // Gathers. Every data-dependent index is clamped: nothing is read out of bounds even for
    // padding edges (tile_query = -1) and unallocated pages (-1), which the mask then removes.
    Expr h = clamp(tile_head(tile), 0, Hkv - 1);
    Expr edge = row / QH, lane = row % QH;
    Expr query = clamp(tile_query(clamp(edge, 0, T - 1), tile), 0, q.dim(2).extent() - 1);
    if (using_autoscheduler()) {
      f.qf(d, row, tile) = widen(q(d, clamp(h * QH + lane, 0, q.dim(1).extent() - 1), query)) * scale;
    } else {
      // Through qt, the same values: a schedule may compute qt once per query (a tile's rows are
      // then dense loads of it) instead of gathering each tile's rows.
      f.qt(f.lane, d, f.h, f.t) = widen(q(d, clamp(f.h * QH + f.lane, 0, q.dim(1).extent() - 1), f.t)) * scale;
      f.qf(d, row, tile) = f.qt(lane, d, h, query);
    }
    Expr pos = c * C + p;
    Expr page = tile_pages(clamp(pos / PS, 0, PPB - 1), tile);
    Expr phys = clamp(page, 0, k_pages.dim(3).extent() - 1);
    f.kf(d, p, c, tile) = widen(k_pages(d, pos % PS, h, phys));
    f.vf(d, p, c, tile) = widen(v_pages(d, pos % PS, h, phys));
    // SPEC §2: below the edge's limit (L_b and the causal bound, folded by the planner), inside
    // the block, on an allocated page.
    // As a Func per edge (query) of the tile, not per row: the query heads of one query share it,
    // and a manual schedule computes it once per chunk. The autoschedulers get the expression
    // inline, the pipeline they were tuned and checked on (a stored bool would be an 8-bit buffer,
    // which the Vulkan targets do not enable).
    // The mask of position x of chunk c for edge `ed`, stated once.
    auto mask = [&](Expr x, Expr ed) {
      Expr at = c * C + x;
      return at < min(tile_limit(clamp(ed, 0, T - 1), tile), BS) && tile_pages(clamp(at / PS, 0, PPB - 1), tile) >= 0;
    };
    Expr attended, attended_r;
    if (using_autoscheduler()) {
      attended = mask(p, edge);
      attended_r = mask(f.rp.x, edge);
    } else {
      f.att(p, f.e, c, tile) = mask(p, f.e);
      attended = f.att(p, edge, c, tile);
      attended_r = f.att(f.rp.x, edge, c, tile);
    }

    const float kMasked = layout::kMaskedScore;
    if (ahead > 0) {
      // Position p of chunk c of the tile `ahead` tiles on: its K and V rows requested into the L2
      // (kvouter_prefetch_l2, kvouter/prefetch.h, which returns 0), where the schedule places
      // pf. The scores start from its 0, so that it is computed. (Requests of 2 to 8 positions
      // at once were no faster, 8 slower: experiments/results/cpu/2026-12-04/decode_ahead_zen4.md.)
      Expr later = min(tile + int(ahead), tile_head.dim(0).max());
      Expr later_head = clamp(tile_head(later), 0, Hkv - 1);
      Expr later_page = clamp(tile_pages(clamp(pos / PS, 0, PPB - 1), later), 0, k_pages.dim(3).extent() - 1);
      auto buffer_of = [](const ImageParam& b) {
        return Internal::Variable::make(type_of<halide_buffer_t*>(), b.name() + ".buffer", b.parameter());
      };
      f.pf(p, c, tile) = Internal::Call::make(Float(32), "kvouter_prefetch_l2",
                                              {buffer_of(k_pages), buffer_of(v_pages), pos % PS, later_head, later_page},
                                              Internal::Call::Extern);
      f.s(p, row, c, tile) = f.pf(p, c, tile);
    } else {
      f.s(p, row, c, tile) = 0.f;
    }
    f.s(p, row, c, tile) += f.qf(f.rd, row, tile) * f.kf(f.rd, p, c, tile);
    f.cmax(row, c, tile) = kMasked;
    f.cmax(row, c, tile) = max(f.cmax(row, c, tile), select(attended_r, f.s(f.rp.x, row, c, tile), kMasked));
    f.pexp(p, row, c, tile) = select(attended, exp(f.s(p, row, c, tile) - f.cmax(row, c, tile)), 0.f);
    f.cpv(d, row, c, tile) = 0.f;
    f.cpv(d, row, c, tile) += f.pexp(f.rp.x, row, c, tile) * f.vf(d, f.rp.x, c, tile);
    f.csum(row, c, tile) = 0.f;
    f.csum(row, c, tile) += f.pexp(f.rp.x, row, c, tile);
    Expr dd = min(ch, D - 1);
    f.chunk_partials = info && info->chunk_partials && f.static_NC == 1;
    if (f.chunk_partials) {
      // The block is one chunk: its (o, m, l) are the tile's partials as they are, stored straight
      // from the chunk's stages (no online state, no per-d copies of m and l).
      partials(ch, row, tile) = select(ch < D, f.cpv(dd, row, 0, tile), ch == D, f.cmax(row, 0, tile),
                                       f.csum(row, 0, tile));
    } else {
      // Online softmax across the chunks of the block. m and l are carried per d (each point's
      // update then reads only itself: race-free, vectorisable); the output reads them from d - 1.
      f.st(d, row, tile) = Tuple(0.f, kMasked, 0.f);
      Expr cm = f.cmax(row, f.rc.x, tile);
      if (f.static_NC == 1) {
        // The block is one chunk: the merge with the initial state (0, kMasked, 0) is the identity
        // (alpha = 0 and beta = 1 where a position is attended; 0 * 1 + 0 * 1 where none is), so the
        // chunk's own (o, m, l) are stored as they are, without the merge's two exps per channel.
        f.st(d, row, tile) = Tuple(f.cpv(d, row, f.rc.x, tile), cm, f.csum(row, f.rc.x, tile));
      } else {
        Expr m_old = f.st(d, row, tile)[1];
        Expr m_new = max(m_old, cm);
        Expr alpha = exp(m_old - m_new), beta = exp(cm - m_new);
        f.st(d, row, tile) = Tuple(f.st(d, row, tile)[0] * alpha + f.cpv(d, row, f.rc.x, tile) * beta, m_new,
                                   f.st(d, row, tile)[2] * alpha + f.csum(row, f.rc.x, tile) * beta);
      }
      partials(ch, row, tile) = select(ch < D, f.st(dd, row, tile)[0], ch == D, f.st(dd, row, tile)[1],
                                       f.st(dd, row, tile)[2]);
    }
    f.out = partials;

    // Dense C-order inputs; extents pinned where specialised.
    q.dim(0).set_stride(1);
    k_pages.dim(0).set_stride(1);
    v_pages.dim(0).set_stride(1);
    partials.dim(0).set_stride(1);
    if (head_dim > 0) {
      q.dim(0).set_bounds(0, int(head_dim));
      k_pages.dim(0).set_bounds(0, int(head_dim));
      v_pages.dim(0).set_bounds(0, int(head_dim));
      q.dim(1).set_stride(int(head_dim));
      k_pages.dim(1).set_stride(int(head_dim));
      v_pages.dim(1).set_stride(int(head_dim));
      partials.dim(0).set_bounds(0, int(head_dim) + layout::kPartialExtra);
      partials.dim(1).set_stride(int(head_dim) + layout::kPartialExtra);
    }
    if (page_size > 0) {
      k_pages.dim(1).set_bounds(0, int(page_size));
      v_pages.dim(1).set_bounds(0, int(page_size));
    }
    if (static_block) tile_pages.dim(0).set_bounds(0, int(block_size) / int(page_size));
    if (tile_edge_count > 0) {
      tile_query.dim(0).set_bounds(0, int(tile_edge_count));
      tile_limit.dim(0).set_bounds(0, int(tile_edge_count));
    }
    if (tile_edge_count > 0 && qhead > 0) partials.dim(1).set_bounds(0, int(tile_edge_count) * int(qhead));

    const int eD = head_dim > 0 ? int(head_dim) : 128, eP = page_size > 0 ? int(page_size) : 16;
    const int eB = block_size > 0 ? int(block_size) : 64, eT = tile_edge_count > 0 ? int(tile_edge_count) : 16;
    const int eQH = qhead > 0 ? int(qhead) : int(est_hq) / int(est_hkv);
    q.set_estimates({{0, eD}, {0, int(est_hq)}, {0, int(est_tq)}});
    k_pages.set_estimates({{0, eD}, {0, eP}, {0, int(est_hkv)}, {0, int(est_pages)}});
    v_pages.set_estimates({{0, eD}, {0, eP}, {0, int(est_hkv)}, {0, int(est_pages)}});
    tile_head.set_estimates({{0, int(est_tiles)}});
    tile_pages.set_estimates({{0, eB / eP}, {0, int(est_tiles)}});
    tile_query.set_estimates({{0, eT}, {0, int(est_tiles)}});
    tile_limit.set_estimates({{0, eT}, {0, int(est_tiles)}});
    scale.set_estimate(0.088f);
    partials.set_estimates({{0, eD + layout::kPartialExtra}, {0, eT * eQH}, {0, int(est_tiles)}});

    if (using_autoscheduler()) return;
    const Knobs k = resolve_knobs({int(chunk), int(vec), int(rows), int(unroll), int(grain), int(slice), int(ahead)},
                                  get_target());
    info->forward(f, k, get_target());
  }
};

}  // namespace
}  // namespace kvouter::pipeline

HALIDE_REGISTER_GENERATOR(kvouter::pipeline::KvouterForward, kvouter_forward)
