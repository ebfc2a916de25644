#include "direct.h"

#include <cmath>
#include <cstring>

#include "kvouter/errors.h"
#include "kvouter/stats.h"
#include "kvouter/tile_layout.h"

namespace kvouter::reference {

namespace {

// 8 float lanes, as the seed's SIMD module: GCC vector extensions lower to one AVX register (or
// two SSE ones). Explicit, because without -ffast-math the compiler will not vectorise a float
// reduction by itself.
typedef float v8f __attribute__((vector_size(32)));

inline v8f load8(const float* p) {
  v8f v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
inline void store8(float* p, v8f v) { std::memcpy(p, &v, sizeof(v)); }

float dot(const float* a, const float* b, int64_t n) {
  v8f acc = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t d = 0;
  for (; d + 8 <= n; d += 8) acc += load8(a + d) * load8(b + d);
  float s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
  for (; d < n; ++d) s += a[d] * b[d];
  return s;
}

// y = y * alpha + beta * x
void scale_axpy(float* y, float alpha, float beta, const float* x, int64_t n) {
  const v8f va = {alpha, alpha, alpha, alpha, alpha, alpha, alpha, alpha};
  const v8f vb = {beta, beta, beta, beta, beta, beta, beta, beta};
  int64_t d = 0;
  for (; d + 8 <= n; d += 8) store8(y + d, load8(y + d) * va + vb * load8(x + d));
  for (; d < n; ++d) y[d] = y[d] * alpha + beta * x[d];
}

}  // namespace

Partials direct_forward(const Plan& plan, const InputsView& in) {
  Partials parts = Partials::empty(plan);
  direct_forward(plan, in, &parts);
  return parts;
}

void direct_forward(const Plan& plan, const InputsView& in, Partials* out) {
  const Problem& p = plan.problem;
  const KvIndex& ix = plan.index;
  Partials& parts = *out;
  const int64_t C = p.D + layout::kPartialExtra;
  const int64_t bs = p.block_size, D = p.D, esize = dtype_bytes(p.dtype);
  const auto* kbytes = static_cast<const uint8_t*>(in.k_pages.data);
  const auto* vbytes = static_cast<const uint8_t*>(in.v_pages.data);
  const auto* qbytes = static_cast<const uint8_t*>(in.q.data);
#pragma omp parallel
  {
    std::vector<float> kblk(static_cast<size_t>(bs * D)), vblk(static_cast<size_t>(bs * D));
    std::vector<uint8_t> valid(static_cast<size_t>(bs));
    std::vector<float> qrow(static_cast<size_t>(D));
#pragma omp for schedule(dynamic)
    for (int64_t u = 0; u < ix.num_units(); ++u) {
      const int64_t h = ix.unit_head[u], b = ix.unit_batch[u], blk = ix.unit_block[u];
      const int64_t L = p.kv_len[static_cast<size_t>(b)];
      // Gather the unit's K/V block once.
      for (int64_t pos = 0; pos < bs; ++pos) {
        const int64_t abs_pos = blk * bs + pos;
        const int32_t page = abs_pos < L ? in.block_tables.data[static_cast<size_t>(b * p.max_pages + abs_pos / p.page_size)] : -1;
        valid[pos] = page >= 0;
        if (!valid[pos]) continue;
        const int64_t off = ((page * p.Hkv + h) * p.page_size + abs_pos % p.page_size) * D * esize;
        widen(p.dtype, kbytes + off, D, &kblk[pos * D]);
        widen(p.dtype, vbytes + off, D, &vblk[pos * D]);
      }
      for (int64_t e = ix.unit_edge_begin[u]; e < ix.unit_edge_begin[u + 1]; ++e) {
        const int64_t t = ix.edge_query[e], limit = ix.edge_limit[e];
        const int64_t part = plan.tiles.edge_partial[e];
        for (int64_t lane = 0; lane < p.qhead; ++lane) {
          const int64_t qoff = (t * p.Hq + h * p.qhead + lane) * D;
          const float* q = in.q.f32() + qoff;
          if (p.dtype != Dtype::kFloat32) {  // 16-bit storage: the row widened once
            widen(p.dtype, qbytes + qoff * esize, D, qrow.data());
            q = qrow.data();
          }
          float* o = &parts.rows.data[static_cast<size_t>((part * p.qhead + lane) * C)];
          float m = layout::kMaskedScore, l = 0;
          for (int64_t pos = 0; pos < limit; ++pos) {
            if (!valid[pos]) continue;
            const float s = p.scale * dot(q, &kblk[pos * D], D);
            if (s > m) {  // online softmax: rescale what has been accumulated
              const float alpha = std::exp(m - s);
              l = l * alpha + 1.f;
              scale_axpy(o, alpha, 1.f, &vblk[pos * D], D);
              m = s;
            } else {
              const float w = std::exp(s - m);
              l += w;
              scale_axpy(o, 1.f, w, &vblk[pos * D], D);
            }
          }
          o[D] = m;
          o[D + 1] = l;
        }
      }
    }
  }
}

namespace {

class DirectBackend final : public Backend {
 public:
  std::string name() const override { return "direct"; }
  std::string schedule() const override { return "seed-simd8"; }
  // Timed as the Halide backends are: the partials and the outputs are allocated and initialised
  // before the clock starts; the forward and the combine are timed.
  Outputs run(const Plan& plan, const InputsView& in) override {
    Partials parts = Partials::empty(plan);
    Outputs o = outputs_for(plan.problem);
    Stopwatch t;
    direct_forward(plan, in, &parts);
    timing_.forward_ms = t.lap_ms();
    combine_partials(plan, parts, o);
    timing_.combine_ms = t.lap_ms();
    return o;
  }
};

}  // namespace

std::unique_ptr<Backend> make_direct_backend(const BackendConfig& cfg) {
  if (!cfg.schedule.empty() && cfg.schedule != "seed-simd8") {
    throw BackendError("schedule: backend 'direct' has only 'seed-simd8', got '" + cfg.schedule + "'");
  }
  if (!cfg.target.empty() && cfg.target != "host") {
    throw BackendError("target: backend 'direct' runs on 'host' only, got '" + cfg.target + "'");
  }
  return std::make_unique<DirectBackend>();
}

}  // namespace kvouter::reference
