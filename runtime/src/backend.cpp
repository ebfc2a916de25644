#include "kvouter/backend.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "kvouter/errors.h"
#include "kvouter/tile_layout.h"

namespace kvouter {

OutputsView::OutputsView(Outputs& o)
    : out(o.out.ptr(), {o.out.shape.size() == 3 ? o.out.shape[0] : 0, o.out.shape.size() == 3 ? o.out.shape[1] : 0,
                        o.out.shape.size() == 3 ? o.out.shape[2] : 0}),
      lse(o.lse.ptr(), {o.lse.shape.size() == 2 ? o.lse.shape[0] : 0, o.lse.shape.size() == 2 ? o.lse.shape[1] : 0}) {}

Outputs outputs_for(const Problem& p) {
  return {Tensor<float>({p.Tq, p.Hq, p.D}), Tensor<float>({p.Tq, p.Hq})};
}

void check_outputs(const OutputsView& o, const Problem& p) {
  auto check = [](const char* field, const TensorView<float>& v, std::initializer_list<int64_t> want) {
    const TensorView<float> w(nullptr, want);
    if (v.rank != w.rank || v.shape != w.shape) throw InputError(field, "shape " + shape_str(w), shape_str(v));
    if (!v.row_major()) throw InputError(field, "a row-major contiguous view", "other strides");
    if (v.numel() > 0 && v.data == nullptr) throw InputError(field, "memory for " + std::to_string(v.numel()) + " floats", "a null pointer");
  };
  check("out", o.out, {p.Tq, p.Hq, p.D});
  check("lse", o.lse, {p.Tq, p.Hq});
}

void Backend::run_into(const Plan& plan, const InputsView& in, const OutputsView& out) {
  check_outputs(out, plan.problem);
  const Outputs res = run(plan, in);
  std::copy(res.out.data.begin(), res.out.data.end(), out.out.data);
  std::copy(res.lse.data.begin(), res.lse.data.end(), out.lse.data);
}

Partials Partials::empty(const Plan& plan) {
  const Problem& p = plan.problem;
  const int64_t C = p.D + layout::kPartialExtra;
  Partials parts{Tensor<float>({plan.tiles.num_partials(), p.qhead, C})};
  for (int64_t r = 0; r < plan.tiles.num_partials() * p.qhead; ++r) parts.rows.data[r * C + p.D] = layout::kMaskedScore;
  return parts;
}

Outputs combine_partials(const Plan& plan, const Partials& parts) {
  Outputs res = outputs_for(plan.problem);
  combine_partials(plan, parts, res);
  return res;
}

void combine_partials(const Plan& plan, const Partials& parts, const OutputsView& res) {
  const Problem& p = plan.problem;
  const auto& pidx = plan.tiles.partial_index;
  std::vector<double> acc(static_cast<size_t>(p.D));
  const int64_t C = p.D + layout::kPartialExtra;
  auto row_of = [&](int32_t partial, int64_t lane) { return &parts.rows.data[(partial * p.qhead + lane) * C]; };
  for (int64_t t = 0; t < p.Tq; ++t) {
    for (int64_t j = 0; j < p.Hq; ++j) {
      const int64_t h = j / p.qhead, lane = j % p.qhead;
      const int32_t* row = &pidx[static_cast<size_t>((t * p.Hkv + h) * p.topk)];
      float mmax = layout::kMaskedScore;
      for (int64_t r = 0; r < p.topk; ++r) {
        if (row[r] >= 0) mmax = std::max(mmax, row_of(row[r], lane)[p.D]);
      }
      float* out = &res.out.data[static_cast<size_t>((t * p.Hq + j) * p.D)];
      if (mmax <= layout::kEmptyThreshold) {
        res.lse.data[t * p.Hq + j] = -std::numeric_limits<float>::infinity();
        std::fill(out, out + p.D, 0.f);
        continue;
      }
      std::fill(acc.begin(), acc.end(), 0.0);
      double lsum = 0;
      for (int64_t r = 0; r < p.topk; ++r) {
        if (row[r] < 0) continue;
        const float* o = row_of(row[r], lane);
        const float m = o[p.D];
        if (m <= layout::kEmptyThreshold) continue;
        const double w = std::exp(static_cast<double>(m) - mmax);
        lsum += w * o[p.D + 1];
        for (int64_t d = 0; d < p.D; ++d) acc[d] += w * o[d];
      }
      for (int64_t d = 0; d < p.D; ++d) out[d] = static_cast<float>(acc[d] / lsum);
      res.lse.data[t * p.Hq + j] = static_cast<float>(mmax + std::log(lsum));
    }
  }
}

BackendRegistry& BackendRegistry::instance() {
  static BackendRegistry r;
  return r;
}

void BackendRegistry::add(BackendInfo info) {
  for (auto& i : infos_) {
    if (i.name == info.name) {
      i = std::move(info);
      return;
    }
  }
  infos_.push_back(std::move(info));
}

const BackendInfo* BackendRegistry::find(const std::string& name) const {
  for (const auto& i : infos_) {
    if (i.name == name) return &i;
  }
  return nullptr;
}

bool is_vulkan_target(const std::string& target) { return target.find("vulkan") != std::string::npos; }
bool is_cuda_target(const std::string& target) { return target.find("cuda") != std::string::npos; }

std::unique_ptr<Backend> BackendRegistry::make(const BackendConfig& cfg) const {
  const BackendInfo* info = find(cfg.backend);
  if (!info) {
    std::string known;
    for (const auto& i : infos_) known += (known.empty() ? "" : ", ") + i.name;
    throw BackendError("backend: expected one of {" + known + "}, got '" + cfg.backend + "'");
  }
  return info->make(cfg);
}

}  // namespace kvouter
