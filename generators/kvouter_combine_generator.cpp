// kvouter_combine: merges each (query, query head)'s partials with the log-sum-exp rule.
// partial_index (runtime tile_layout.h) maps (rank, KV head, query) to a partial row, or -1.
#include <Halide.h>

#include <limits>

#include "kvouter/tile_layout.h"
#include "kvouter_funcs.h"
#include "schedule_registry.h"

namespace kvouter::pipeline {
namespace {

using namespace Halide;

class KvouterCombine : public Generator<KvouterCombine> {
 public:
  GeneratorParam<std::string> schedule{"schedule", "cpu_tiled"};
  GeneratorParam<int> head_dim{"D", 0};
  GeneratorParam<int> qhead{"qhead", 0};
  // Edges per tile of the forward's partials (its T); 0 = from the buffers. Specialised, a partial
  // index splits into (tile, edge) without a division. The autoscheduled twins take it from the
  // buffers all the same: specialised, Anderson2021's Vulkan combine passes a bool kernel
  // argument, which Halide 21 declares in a Uniform block (invalid SPIR-V; the validation layer
  // says so on empty_rows).
  GeneratorParam<int> tile_edge_count{"T", 0};
  GeneratorParam<int> vec{"vec", knob_defaults::vec};
  GeneratorParam<int> grain{"grain", knob_defaults::grain};
  // Estimates for the autoschedulers (see kvouter_forward).
  GeneratorParam<int> est_tq{"est_tq", 2048};
  GeneratorParam<int> est_hq{"est_hq", 16};
  GeneratorParam<int> est_hkv{"est_hkv", 2};
  GeneratorParam<int> est_topk{"est_topk", 16};
  GeneratorParam<int> est_partials{"est_partials", 51200};

  Input<Buffer<float, 3>> partials{"partials"};          // (ch, row, tile): the forward's output
  Input<Buffer<int32_t, 3>> partial_index{"partial_index"};  // (rank, h, t)
  Output<Buffer<float, 3>> out{"out"};                   // (d, j, t)
  Output<Buffer<float, 2>> lse{"lse"};                   // (j, t)

  void generate() {
    CombineFuncs f;
    Var d = f.d, j = f.j, t = f.t, r = f.r;
    Expr D = head_dim > 0 ? Expr(int(head_dim)) : partials.dim(0).extent() - layout::kPartialExtra;
    Expr QH = qhead > 0 ? Expr(int(qhead)) : out.dim(1).extent() / partial_index.dim(1).extent();
    const bool static_T = tile_edge_count > 0 && !using_autoscheduler();
    Expr T = static_T ? Expr(int(tile_edge_count)) : partials.dim(1).extent() / QH;  // edges per tile
    Expr NP = T * partials.dim(2).extent();
    f.D = D;
    f.rk = RDom(0, partial_index.dim(0).extent(), "rk");
    Expr h = j / QH, lane = j % QH;
    // Partial row p of the tile layout: tile p / T, edge p % T, row edge * qhead + lane.
    auto at = [&](Expr c, Expr p) { return partials(c, (p % T) * QH + lane, p / T); };
    Expr pid = partial_index(r, h, t);
    Expr pc = clamp(pid, 0, NP - 1);
    const float kMasked = layout::kMaskedScore;
    f.mval(r, j, t) = select(pid >= 0, at(D, pc), kMasked);
    f.mmax(j, t) = kMasked;
    f.mmax(j, t) = max(f.mmax(j, t), f.mval(f.rk.x, j, t));
    Expr rk = f.rk.x;
    Expr pk = clamp(partial_index(rk, h, t), 0, NP - 1);
    Expr w = select(f.mval(rk, j, t) > layout::kEmptyThreshold, exp(f.mval(rk, j, t) - f.mmax(j, t)), 0.f);
    f.lsum(j, t) = 0.f;
    f.lsum(j, t) += w * at(D + 1, pk);
    f.osum(d, j, t) = 0.f;
    f.osum(d, j, t) += w * at(d, pk);
    out(d, j, t) = select(f.lsum(j, t) > 0.f, f.osum(d, j, t) / f.lsum(j, t), 0.f);
    // Empty rows get kMaskedScore here; the host turns it into SPEC's -inf (GPU kernels do not
    // promise IEEE infinities).
    lse(j, t) = select(f.lsum(j, t) > 0.f, f.mmax(j, t) + log(f.lsum(j, t)), kMasked);
    f.out = out;
    f.lse = lse;

    partials.dim(0).set_stride(1);
    partial_index.dim(0).set_stride(1);
    out.dim(0).set_stride(1);
    if (head_dim > 0) {
      partials.dim(0).set_bounds(0, int(head_dim) + layout::kPartialExtra);
      out.dim(0).set_bounds(0, int(head_dim));
    }
    if (static_T && qhead > 0) partials.dim(1).set_bounds(0, int(tile_edge_count) * int(qhead));
    const int eD = head_dim > 0 ? int(head_dim) : 128;
    const int eQH = qhead > 0 ? int(qhead) : int(est_hq) / int(est_hkv);
    partials.set_estimates({{0, eD + layout::kPartialExtra}, {0, 16 * eQH}, {0, std::max(1, int(est_partials) / 16)}});
    partial_index.set_estimates({{0, int(est_topk)}, {0, int(est_hkv)}, {0, int(est_tq)}});
    out.set_estimates({{0, eD}, {0, int(est_hq)}, {0, int(est_tq)}});
    lse.set_estimates({{0, int(est_hq)}, {0, int(est_tq)}});

    if (using_autoscheduler()) return;
    const ScheduleInfo* info = find_schedule(schedule);
    if (!info || !info->combine) {
      throw CompileError("kvouter_combine: schedule '" + std::string(schedule) +
                         "' is not a manual combine schedule");
    }
    Knobs k;
    k.vec = vec;
    k.grain = grain;
    info->combine(f, resolve_knobs(k, get_target()), get_target());
  }
};

}  // namespace
}  // namespace kvouter::pipeline

HALIDE_REGISTER_GENERATOR(kvouter::pipeline::KvouterCombine, kvouter_combine)
