#include "dense_eigen.h"

#include <Eigen/Dense>
#include <cmath>
#include <limits>

#include "kvouter/errors.h"
#include "kvouter/stats.h"

namespace kvouter::reference {

std::vector<uint8_t> attended_mask(const InputsView& in, const Problem& p, int64_t b, int64_t t,
                                   int64_t h) {
  const int64_t L = p.kv_len[static_cast<size_t>(b)];
  std::vector<uint8_t> mask(static_cast<size_t>(L), 0);
  const int64_t last = p.last_position(b, t - p.cu[static_cast<size_t>(b)]);
  for (int64_t r = 0; r < p.topk; ++r) {
    const int32_t id = in.selected.data[static_cast<size_t>((t * p.Hkv + h) * p.topk + r)];
    if (id < 0) continue;
    for (int64_t pos = id * p.block_size; pos < std::min(L, (id + 1) * p.block_size); ++pos) {
      const int32_t page = in.block_tables.data[static_cast<size_t>(b * p.max_pages + pos / p.page_size)];
      if (page >= 0 && pos <= last) mask[static_cast<size_t>(pos)] = 1;
    }
  }
  return mask;
}

template <class Scalar>
Outputs dense_attention(const InputsView& in, const Problem& p) {
  using Mat = Eigen::Matrix<Scalar, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  Outputs res = outputs_for(p);
  const Scalar ninf = -std::numeric_limits<Scalar>::infinity();
  const int64_t work = p.B * p.Hkv, esize = dtype_bytes(p.dtype);
  const auto* kbytes = static_cast<const uint8_t*>(in.k_pages.data);
  const auto* vbytes = static_cast<const uint8_t*>(in.v_pages.data);
  const auto* qbytes = static_cast<const uint8_t*>(in.q.data);
#pragma omp parallel for schedule(dynamic)
  for (int64_t w = 0; w < work; ++w) {
    const int64_t b = w / p.Hkv, h = w % p.Hkv;
    const int64_t L = p.kv_len[static_cast<size_t>(b)], t0 = p.cu[static_cast<size_t>(b)],
                  qo = p.qo_len(b);
    if (qo == 0) continue;
    // Gather this sequence's K and V of head h, widened from their storage dtype; unallocated
    // pages stay zero (and are masked).
    std::vector<float> krow(static_cast<size_t>(p.D)), vrow(static_cast<size_t>(p.D));
    Mat K = Mat::Zero(L, p.D), V = Mat::Zero(L, p.D);
    for (int64_t pos = 0; pos < L; ++pos) {
      const int32_t page = in.block_tables.data[static_cast<size_t>(b * p.max_pages + pos / p.page_size)];
      if (page < 0) continue;
      const int64_t off = ((page * p.Hkv + h) * p.page_size + pos % p.page_size) * p.D;
      widen(p.dtype, kbytes + off * esize, p.D, krow.data());
      widen(p.dtype, vbytes + off * esize, p.D, vrow.data());
      for (int64_t d = 0; d < p.D; ++d) {
        K(pos, d) = krow[static_cast<size_t>(d)];
        V(pos, d) = vrow[static_cast<size_t>(d)];
      }
    }
    std::vector<std::vector<uint8_t>> masks;
    for (int64_t i = 0; i < qo; ++i) masks.push_back(attended_mask(in, p, b, t0 + i, h));
    for (int64_t lane = 0; lane < p.qhead; ++lane) {
      const int64_t j = h * p.qhead + lane;
      Mat Q(qo, p.D);
      for (int64_t i = 0; i < qo; ++i) {
        widen(p.dtype, qbytes + (((t0 + i) * p.Hq + j) * p.D) * esize, p.D, krow.data());
        for (int64_t d = 0; d < p.D; ++d) Q(i, d) = krow[static_cast<size_t>(d)];
      }
      Mat S = (Q * K.transpose()) * static_cast<Scalar>(p.scale);
      for (int64_t i = 0; i < qo; ++i) {
        Scalar mx = ninf;
        for (int64_t pos = 0; pos < L; ++pos) {
          if (!masks[i][pos]) S(i, pos) = ninf;
          mx = std::max(mx, S(i, pos));
        }
        Scalar sum = 0;
        for (int64_t pos = 0; pos < L; ++pos) {
          S(i, pos) = masks[i][pos] ? std::exp(S(i, pos) - mx) : Scalar(0);
          sum += S(i, pos);
        }
        if (sum > 0) S.row(i) /= sum;
        res.lse.data[static_cast<size_t>((t0 + i) * p.Hq + j)] =
            sum > 0 ? static_cast<float>(mx + std::log(sum)) : -std::numeric_limits<float>::infinity();
      }
      Mat O = S * V;
      for (int64_t i = 0; i < qo; ++i) {
        for (int64_t d = 0; d < p.D; ++d) res.out.data[static_cast<size_t>(((t0 + i) * p.Hq + j) * p.D + d)] = static_cast<float>(O(i, d));
      }
    }
  }
  return res;
}

template Outputs dense_attention<float>(const InputsView&, const Problem&);
template Outputs dense_attention<double>(const InputsView&, const Problem&);

namespace {

class DenseBackend final : public Backend {
 public:
  std::string name() const override { return "dense"; }
  std::string schedule() const override { return "eigen-f32"; }
  Outputs run(const Plan& plan, const InputsView& in) override {
    const Stopwatch t;
    Outputs o = dense_attention<float>(in, plan.problem);
    timing_.forward_ms = t.ms();
    timing_.combine_ms = 0;
    return o;
  }
};

}  // namespace

std::unique_ptr<Backend> make_dense_backend(const BackendConfig& cfg) {
  if (!cfg.schedule.empty() && cfg.schedule != "eigen-f32") {
    throw BackendError("schedule: backend 'dense' has only 'eigen-f32', got '" + cfg.schedule + "'");
  }
  if (!cfg.target.empty() && cfg.target != "host") {
    throw BackendError("target: backend 'dense' runs on 'host' only, got '" + cfg.target + "'");
  }
  return std::make_unique<DenseBackend>();
}

}  // namespace kvouter::reference
