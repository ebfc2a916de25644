// fuzz_run: whole runs on fuzzed valid small inputs through the `direct` backend and the JIT
// backend (host CPU), both checked against the float64 Eigen oracle and against each other
// (SPEC §2 tolerance |err| <= 2e-4 + 2e-4 max|ref|), and against SPEC's empty-row rule: a
// (query, head) that attends nothing gives out = 0 and lse = -inf; every other row is finite.
// The JIT compiles once per (schedule, D, page, block, qhead, T), so those come from a small menu
// (6 specialisations, compiled on first use and cached in process), each in the three storage
// dtypes (the backends read float16 / bfloat16 bits; the oracle reads their values).
#include <fuzzer/FuzzedDataProvider.h>

#include <cmath>
#include <limits>
#include <map>
#include <memory>
#include <set>

#include "dense_eigen.h"
#include "direct.h"
#include "fuzz_common.h"
#include "kvouter/errors.h"
#include "kvouter/jit.h"
#include "plan_invariants.h"

namespace {

using namespace kvouter;

struct Shape {
  int64_t D, page_size, block_size, qhead, T;
};
// Odd sizes on purpose: D not a multiple of the vector width, three pages per block, T = 1.
constexpr Shape kShapes[] = {{8, 2, 4, 2, 1}, {16, 4, 8, 1, 4}, {5, 2, 6, 2, 4}};
const char* const kSchedules[] = {"cpu_simple", "cpu_tiled"};

Backend& jit_backend(const std::string& schedule, int64_t T) {
  static std::map<std::pair<std::string, int64_t>, std::unique_ptr<Backend>> backends;
  auto& b = backends[{schedule, T}];
  if (!b)
    b = halide::make_jit_backend({"jit", schedule, {{"T", std::to_string(T)}}, "host"}, "", "cpu");
  return *b;
}

float value(FuzzedDataProvider& fdp, float amplitude) {
  return static_cast<float>(fdp.ConsumeIntegral<int8_t>()) / 128.f * amplitude;
}

Inputs fuzzed_valid_inputs(FuzzedDataProvider& fdp, const Shape& s) {
  Inputs in;
  in.page_size = s.page_size;
  in.block_size = s.block_size;
  const int64_t ppb = s.block_size / s.page_size;
  const int64_t B = fdp.ConsumeIntegralInRange<int64_t>(1, 3);
  const int64_t Hkv = fdp.ConsumeIntegralInRange<int64_t>(1, 2), Hq = Hkv * s.qhead;
  const int64_t topk = fdp.ConsumeIntegralInRange<int64_t>(1, 4);
  const int64_t msb = fdp.ConsumeIntegralInRange<int64_t>(1, 4);
  const int64_t max_pages = msb * ppb + fdp.ConsumeIntegralInRange<int64_t>(0, ppb - 1);
  const int64_t num_pages = fdp.ConsumeIntegralInRange<int64_t>(1, 8);
  std::vector<int64_t> qo(static_cast<size_t>(B)), L(static_cast<size_t>(B));
  int64_t Tq = 0;
  for (auto& n : qo) Tq += n = fdp.ConsumeIntegralInRange<int64_t>(0, 5);
  const bool with_used = fdp.ConsumeBool();
  for (auto& l : L)
    l = with_used ? fdp.ConsumeIntegralInRange<int64_t>(0, msb * s.block_size) : msb * s.block_size;

  in.cu_seqlens_q = Tensor<int64_t>({B + 1});
  for (int64_t b = 0; b < B; ++b) in.cu_seqlens_q.data[b + 1] = in.cu_seqlens_q.data[b] + qo[b];
  if (with_used) {
    in.used_kv_lens = Tensor<int32_t>({B});
    for (int64_t b = 0; b < B; ++b) in.used_kv_lens->data[b] = static_cast<int32_t>(L[b]);
  }
  in.block_tables = Tensor<int32_t>({B, max_pages});
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t lp = 0; lp < max_pages; ++lp) {
      // Pages at or after L_b are never read, whatever they hold.
      const bool used = lp * s.page_size < L[b];
      in.block_tables.data[b * max_pages + lp] =
          used ? static_cast<int32_t>(fdp.ConsumeIntegralInRange<int64_t>(-1, num_pages - 1))
               : fdp.PickValueInArray<int32_t>({-1, 0, std::numeric_limits<int32_t>::max()});
    }
  }
  in.selected = Tensor<int32_t>({Tq, Hkv, topk});
  for (auto& id : in.selected.data)
    id = static_cast<int32_t>(fdp.ConsumeIntegralInRange<int64_t>(-2, msb - 1));
  in.causal = fdp.ConsumeBool();
  if (fdp.ConsumeBool()) in.softmax_scale = fdp.PickValueInArray<float>({0.1f, 1.f, 3.5f, -0.5f});

  const float amplitude = fdp.PickValueInArray<float>({1.f, 4.f, 16.f});
  in.q = Tensor<float>({Tq, Hq, s.D});
  in.k_pages = Tensor<float>({num_pages, Hkv, s.page_size, s.D});
  in.v_pages = Tensor<float>({num_pages, Hkv, s.page_size, s.D});
  for (auto* t : {&in.q, &in.k_pages, &in.v_pages}) {
    for (float& x : t->data) x = value(fdp, amplitude);
  }
  // SPEC section 1: any of the three storage dtypes (the values rounded to it).
  in.store_as(fdp.PickValueInArray<Dtype>({Dtype::kFloat32, Dtype::kFloat16, Dtype::kBFloat16}));
  return in;
}

double max_abs(const HostArray<float>& v) {
  double m = 0;
  for (float x : v) {
    if (std::isfinite(x)) m = std::max(m, static_cast<double>(std::fabs(x)));
  }
  return m;
}

// SPEC §2's tolerance, for out and for the finite lse values alike.
void expect_close(const Outputs& got, const Outputs& ref, const char* what) {
  FUZZ_CHECK(got.out.shape == ref.out.shape && got.lse.shape == ref.lse.shape, "%s: output shapes",
             what);
  const double tol_out = 2e-4 + 2e-4 * max_abs(ref.out.data),
               tol_lse = 2e-4 + 2e-4 * max_abs(ref.lse.data);
  for (size_t i = 0; i < ref.out.data.size(); ++i) {
    FUZZ_CHECK(std::fabs(static_cast<double>(got.out.data[i]) - ref.out.data[i]) <= tol_out,
               "%s: out[%zu] = %g, reference %g", what, i, got.out.data[i], ref.out.data[i]);
  }
  for (size_t i = 0; i < ref.lse.data.size(); ++i) {
    const float g = got.lse.data[i], r = ref.lse.data[i];
    if (std::isinf(r)) {
      FUZZ_CHECK(g == r, "%s: lse[%zu] = %g, reference %g", what, i, g, r);
    } else {
      FUZZ_CHECK(std::fabs(static_cast<double>(g) - r) <= tol_lse,
                 "%s: lse[%zu] = %g, reference %g", what, i, g, r);
    }
  }
}

// SPEC §2: empty rows are out = 0, lse = -inf exactly; the others are finite.
void expect_spec_rows(const Inputs& in, const Problem& p, const Outputs& o, const char* what) {
  for (int64_t t = 0; t < p.Tq; ++t) {
    const int64_t b = fuzz::batch_of(p, t);
    for (int64_t h = 0; h < p.Hkv; ++h) {
      std::set<int64_t> ids;
      for (int64_t r = 0; r < p.topk; ++r) {
        const int32_t id = in.selected.data[static_cast<size_t>((t * p.Hkv + h) * p.topk + r)];
        if (id >= 0) ids.insert(id);
      }
      bool empty = true;
      for (int64_t id : ids) empty = empty && fuzz::spec_block_count(in, p, b, t, id) == 0;
      for (int64_t j = h * p.qhead; j < (h + 1) * p.qhead; ++j) {
        const float lse = o.lse.data[static_cast<size_t>(t * p.Hq + j)];
        FUZZ_CHECK(empty ? (std::isinf(lse) && lse < 0) : std::isfinite(lse),
                   "%s: lse[%lld, %lld] = %g (empty row: %d)", what, (long long)t, (long long)j,
                   lse, empty);
        for (int64_t d = 0; d < p.D; ++d) {
          const float x = o.out.data[static_cast<size_t>((t * p.Hq + j) * p.D + d)];
          FUZZ_CHECK(empty ? x == 0.f : std::isfinite(x),
                     "%s: out[%lld, %lld, %lld] = %g (empty row: %d)", what, (long long)t,
                     (long long)j, (long long)d, x, empty);
        }
      }
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider fdp(data, size);
  const Shape& shape = kShapes[fdp.ConsumeIntegralInRange<size_t>(0, std::size(kShapes) - 1)];
  const char* schedule =
      kSchedules[fdp.ConsumeIntegralInRange<size_t>(0, std::size(kSchedules) - 1)];
  const Inputs in = fuzzed_valid_inputs(fdp, shape);
  Backend& jit = jit_backend(schedule, shape.T);
  Plan plan;
  try {
    plan = make_plan(in, jit.plan_options());
  } catch (const InputError& e) {
    FUZZ_CHECK(false, "the generator made invalid inputs: %s", e.what());
  }
  Inputs values = in;  // the oracle reads the values, never the 16-bit bits the backends read
  values.store_as(Dtype::kFloat32);
  const Outputs ref = reference::dense_attention<double>(values, validate(values));
  const Outputs direct = reference::make_direct_backend({})->run(plan, in);
  const Outputs jitted = jit.run(plan, in);
  expect_spec_rows(in, plan.problem, ref, "oracle");
  expect_spec_rows(in, plan.problem, direct, "direct");
  expect_spec_rows(in, plan.problem, jitted, schedule);
  expect_close(direct, ref, "direct vs oracle");
  expect_close(jitted, ref, "jit vs oracle");
  expect_close(jitted, direct, "jit vs direct");
  return 0;
}
