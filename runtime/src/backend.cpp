#include "kvouter/backend.h"

#include <cmath>
#include <limits>

#include "kvouter/errors.h"
#include "kvouter/tile_layout.h"

namespace kvouter {

Partials Partials::empty(const Plan& plan) {
  const Problem& p = plan.problem;
  const int64_t C = p.D + layout::kPartialExtra;
  Partials parts{Tensor<float>({plan.tiles.num_partials(), p.qhead, C})};
  for (int64_t r = 0; r < plan.tiles.num_partials() * p.qhead; ++r) parts.rows.data[r * C + p.D] = layout::kMaskedScore;
  return parts;
}

Outputs combine_partials(const Plan& plan, const Partials& parts) {
  const Problem& p = plan.problem;
  Outputs res{Tensor<float>({p.Tq, p.Hq, p.D}), Tensor<float>({p.Tq, p.Hq})};
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
        continue;  // out stays 0
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
  return res;
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
