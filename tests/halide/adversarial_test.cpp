// Adversarial but valid inputs (the hardening issue's list), through every CPU backend family:
// outputs are finite wherever SPEC says so and match the float64 oracle.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>

#include "case_gen.h"
#include "case_kinds.h"
#include "cli_util.h"
#include "dense_eigen.h"
#include "registry.h"

namespace kvouter {
namespace {

using experiments::CaseSpec;

CaseSpec base() {
  CaseSpec s;
  s.qo = {5, 7};
  s.kv = {40, 64};
  s.Hq = 4; s.Hkv = 2; s.D = 16; s.block_size = 8; s.page_size = 4; s.topk = 4;
  return s;
}

struct Adversary {
  const char* name;
  std::function<Inputs()> make;
  bool magnitude_lse = false;  // LSE of order 1e4: compared relative to its size (float32 ulp)
};

Inputs huge_logits(Dtype dtype) {
  CaseSpec s = base();
  s.scale = 1e4f;
  s.dtype = dtype;
  return experiments::make_case(s);
}

Inputs every_row_empty(Dtype dtype) {
  CaseSpec s = base();
  s.dtype = dtype;
  Inputs in = experiments::make_case(s);
  std::fill(in.selected.data.begin(), in.selected.data.end(), -1);
  return in;
}

// K's values all subnormal, q's about 1e37 (case_kinds.h).
Inputs subnormal_k(Dtype dtype) { return testing::with_subnormal_keys(experiments::make_case(base()), dtype); }

std::vector<Adversary> adversaries() {
  return {
      {"huge_logits_scale_1e4", [] { return huge_logits(Dtype::kFloat32); }, true},
      {"every_row_empty", [] { return every_row_empty(Dtype::kFloat32); }},
      {"topk_1", [] {
         CaseSpec s = base();
         s.topk = 1;
         return experiments::make_case(s);
       }},
      {"tq_0", [] {
         CaseSpec s = base();
         s.qo = {0, 0};
         return experiments::make_case(s);
       }},
      {"one_sequence_64k_positions", [] {
         CaseSpec s = base();
         s.qo = {6};
         s.kv = {65536};
         s.block_size = 64; s.page_size = 16; s.topk = 16; s.Hq = 2; s.Hkv = 1; s.D = 32;
         s.benchmark_selection = true;
         return experiments::make_case(s);
       }},
      {"pages_shared_by_every_sequence", [] {
         CaseSpec s = base();
         s.qo = {3, 4, 2, 5};
         s.kv = {40, 40, 33, 17};
         s.shared_pages = true;
         return experiments::make_case(s);
       }},
      // SPEC section 1's 16-bit storage: large logits and empty rows in each 16-bit dtype.
      {"huge_logits_scale_1e4_float16", [] { return huge_logits(Dtype::kFloat16); }, true},
      {"huge_logits_scale_1e4_bfloat16", [] { return huge_logits(Dtype::kBFloat16); }, true},
      {"every_row_empty_float16", [] { return every_row_empty(Dtype::kFloat16); }},
      {"every_row_empty_bfloat16", [] { return every_row_empty(Dtype::kBFloat16); }},
      {"subnormal_k", [] { return subnormal_k(Dtype::kFloat32); }},
      {"subnormal_k_bfloat16", [] { return subnormal_k(Dtype::kBFloat16); }},
      {"used_kv_lens_at_msb_times_block", [] {
         CaseSpec s = base();
         s.kv = {64, 64};  // msb * block_size exactly
         Inputs in = experiments::make_case(s);
         const Problem p = validate(in);
         for (auto& L : in.used_kv_lens->data) L = static_cast<int32_t>(p.msb * p.block_size);
         return in;
       }},
  };
}

using Param = std::tuple<std::string, size_t>;
class AdversarialTest : public ::testing::TestWithParam<Param> {};

TEST_P(AdversarialTest, FiniteAndMatchesOracle) {
  const auto& [backend_schedule, index] = GetParam();
  const Adversary adv = adversaries()[index];
  const auto slash = backend_schedule.find('/');
  experiments::register_all_backends();
  auto backend = BackendRegistry::instance().make(
      {backend_schedule.substr(0, slash), backend_schedule.substr(slash + 1), {}, ""});
  const Inputs in = adv.make();
  const Plan plan = make_plan(in, backend->plan_options());
  Inputs values = in;  // the oracle computes from the values, never from 16-bit bits
  values.store_as(Dtype::kFloat32);
  const Outputs ref = reference::dense_attention<double>(values, validate(values));
  const Outputs got = backend->run(plan, in);
  for (size_t i = 0; i < got.lse.data.size(); ++i) {
    if (std::isfinite(ref.lse.data[i])) {
      ASSERT_TRUE(std::isfinite(got.lse.data[i])) << adv.name << " lse " << i;
    } else {
      ASSERT_TRUE(std::isinf(got.lse.data[i]) && got.lse.data[i] < 0) << adv.name << " lse " << i;
    }
  }
  for (float x : got.out.data) ASSERT_TRUE(std::isfinite(x)) << adv.name;
  const auto err = experiments::compare_outputs(got, ref);
  if (!adv.magnitude_lse) {
    EXPECT_TRUE(err.ok()) << adv.name << ": max|out err| " << err.max_out_err << " max|lse err| " << err.max_lse_err;
  } else {
    // Logits of order 1e4: float32 holds the LSE to about 1e-3 absolute (its ulp there), so the
    // LSE is held to SPEC's relative form 2e-4 + 2e-4 * max|ref| and out to SPEC's as usual.
    double ref_max = 0;
    for (float x : ref.lse.data) if (std::isfinite(x)) ref_max = std::max(ref_max, std::fabs(static_cast<double>(x)));
    double out_max = 0;
    for (float x : ref.out.data) out_max = std::max(out_max, std::fabs(static_cast<double>(x)));
    EXPECT_LE(err.max_lse_err, 2e-4 + 2e-4 * ref_max) << adv.name;
    EXPECT_LE(err.max_out_err, 2e-4 + 2e-4 * out_max) << adv.name;
  }
}

INSTANTIATE_TEST_SUITE_P(
    BackendXAdversary, AdversarialTest,
    ::testing::Combine(::testing::Values("direct/seed-simd8", "dense/eigen-f32", "jit/cpu_tiled", "jit/cpu_simple", "jit/cpu_decode", "aot/cpu_tiled"),
                       ::testing::Range<size_t>(0, adversaries().size())),
    [](const auto& info) {
      std::string b = std::get<0>(info.param);
      for (auto& c : b) if (c == '/' || c == '-') c = '_';
      return b + "_" + adversaries()[std::get<1>(info.param)].name;
    });

}  // namespace
}  // namespace kvouter
