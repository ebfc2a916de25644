// The oracle and the seed-style baseline: dense float against dense float64, direct against the
// float64 oracle on every case kind, and SPEC's empty-row rule.
#include <gtest/gtest.h>

#include <cmath>

#include "case_kinds.h"
#include "cli_util.h"
#include "dense_eigen.h"
#include "direct.h"

namespace kvouter {
namespace {

class ReferenceTest : public ::testing::TestWithParam<std::pair<std::string, experiments::CaseSpec>> {};

TEST_P(ReferenceTest, DirectAndDenseFloatMatchOracle) {
  Inputs in = experiments::make_case(GetParam().second);
  const Plan plan = make_plan(in, {5});
  const Outputs ref = reference::dense_attention<double>(in, plan.problem);
  for (const char* name : {"direct", "dense"}) {
    auto backend = std::string(name) == "direct" ? reference::make_direct_backend({})
                                                 : reference::make_dense_backend({});
    const Outputs got = backend->run(plan, in);
    const auto err = experiments::compare_outputs(got, ref);
    EXPECT_TRUE(err.ok()) << name << ": max|out err| " << err.max_out_err << " max|lse err| "
                          << err.max_lse_err;
  }
}

INSTANTIATE_TEST_SUITE_P(CaseKinds, ReferenceTest, ::testing::ValuesIn(testing::case_kinds()),
                         [](const auto& info) { return info.param.first; });

// The baselines read 16-bit storage: direct and dense in each 16-bit dtype on every case kind,
// against the oracle computed from the values (values_only: never the bits).
class ReferenceStorageTest
    : public ::testing::TestWithParam<std::tuple<std::pair<std::string, experiments::CaseSpec>, Dtype>> {};

TEST_P(ReferenceStorageTest, DirectAndDenseMatchOracle) {
  experiments::CaseSpec spec = std::get<0>(GetParam()).second;
  spec.dtype = std::get<1>(GetParam());
  const Inputs in = experiments::make_case(spec);
  const Inputs values = testing::values_only(in);
  const Plan plan = make_plan(in, {5});
  const Outputs ref = reference::dense_attention<double>(values, validate(values));
  for (const char* name : {"direct", "dense"}) {
    auto backend = std::string(name) == "direct" ? reference::make_direct_backend({})
                                                 : reference::make_dense_backend({});
    const auto err = experiments::compare_outputs(backend->run(plan, in), ref);
    EXPECT_TRUE(err.ok()) << name << " in " << dtype_name(spec.dtype) << ": max|out err| " << err.max_out_err
                          << " max|lse err| " << err.max_lse_err;
  }
}

INSTANTIATE_TEST_SUITE_P(CaseKindsXDtype, ReferenceStorageTest,
                         ::testing::Combine(::testing::ValuesIn(testing::case_kinds()), ::testing::ValuesIn(testing::dtypes16())),
                         [](const auto& info) { return std::get<0>(info.param).first + "_" + dtype_name(std::get<1>(info.param)); });

// Rounding to 16 bits: nearest, ties to even, with subnormals, overflow and NaN; and back exactly.
TEST(Dtype, RoundingAndWidening) {
  // float16: 1 + 2^-11 is a tie between 1 and 1 + 2^-10: even (1). 1 + 3 * 2^-11 rounds up.
  EXPECT_EQ(float_to_half(1.0f), 0x3C00);
  EXPECT_EQ(float_to_half(1.0f + std::ldexp(1.0f, -11)), 0x3C00);
  EXPECT_EQ(float_to_half(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3C02);
  EXPECT_EQ(float_to_half(-2.0f), 0xC000);
  EXPECT_EQ(float_to_half(65504.0f), 0x7BFF);
  EXPECT_EQ(float_to_half(65520.0f), 0x7C00);  // the tie past the largest half: infinity
  EXPECT_EQ(float_to_half(65519.0f), 0x7BFF);
  EXPECT_EQ(float_to_half(std::ldexp(1.0f, -24)), 0x0001);  // smallest subnormal
  EXPECT_EQ(float_to_half(std::ldexp(1.0f, -25)), 0x0000);  // its half: tie to even (0)
  EXPECT_EQ(float_to_half(std::ldexp(3.0f, -26)), 0x0001);
  EXPECT_EQ(float_to_half(std::ldexp(1023.0f, -24)), 0x03FF);  // largest subnormal
  EXPECT_EQ(float_to_half(std::ldexp(1.0f, -14)), 0x0400);     // smallest normal
  EXPECT_EQ(float_to_half(INFINITY), 0x7C00);
  EXPECT_TRUE(std::isnan(half_to_float(float_to_half(NAN))));
  // bfloat16: the upper half, rounded.
  EXPECT_EQ(float_to_bf16(1.0f), 0x3F80);
  EXPECT_EQ(float_to_bf16(1.0f + std::ldexp(1.0f, -8)), 0x3F80);      // tie: even
  EXPECT_EQ(float_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3F82);  // tie: even (up)
  EXPECT_EQ(float_to_bf16(-3.0f), 0xC040);
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(NAN))));
  EXPECT_EQ(float_to_bf16(3.4e38f), 0x7F80);  // past bfloat16's largest finite value: infinity
  // Every 16-bit pattern widens and rounds back to itself (NaNs to a NaN).
  std::vector<uint16_t> all(65536);
  for (uint32_t b = 0; b < 65536; ++b) all[b] = static_cast<uint16_t>(b);
  std::vector<float> wide(65536);
  widen(Dtype::kFloat16, all.data(), 65536, wide.data());
  for (uint32_t b = 0; b < 65536; ++b) {
    ASSERT_EQ(std::isnan(wide[b]), std::isnan(half_to_float(all[b]))) << b;
    if (std::isnan(wide[b])) continue;
    ASSERT_EQ(wide[b], half_to_float(all[b])) << b;  // the F16C path against the portable one
    ASSERT_EQ(float_to_half(wide[b]), all[b]) << b;
  }
  widen(Dtype::kBFloat16, all.data(), 65536, wide.data());
  for (uint32_t b = 0; b < 65536; ++b) {
    if (std::isnan(wide[b])) continue;
    ASSERT_EQ(float_to_bf16(wide[b]), all[b]) << b;
  }
}

// store_as keeps bits and values in agreement, and a round trip through a case folder keeps both.
TEST(Dtype, StoreAsKeepsValuesAndBitsTogether) {
  experiments::CaseSpec spec = testing::case_kinds()[0].second;
  for (Dtype t : testing::dtypes16()) {
    spec.dtype = t;
    const Inputs in = experiments::make_case(spec);
    ASSERT_EQ(in.k_bits.data.size(), in.k_pages.data.size());
    for (size_t i = 0; i < in.k_bits.data.size(); ++i) {
      const float w = t == Dtype::kFloat16 ? half_to_float(in.k_bits.data[i]) : bf16_to_float(in.k_bits.data[i]);
      ASSERT_EQ(w, in.k_pages.data[i]) << i;
    }
  }
}

TEST(Reference, EmptyRowsGiveZerosAndNegInf) {
  experiments::CaseSpec s;
  s.qo = {3};
  s.kv = {16};
  s.Hq = 2; s.Hkv = 1; s.D = 8; s.block_size = 8; s.page_size = 4; s.topk = 2;
  Inputs in = experiments::make_case(s);
  std::fill(in.selected.data.begin(), in.selected.data.end(), -1);
  in.selected.data[4] = 1;  // only query 2 attends (block 1: causal bound 15 allows it)
  const Plan plan = make_plan(in);
  for (const Outputs& o : {reference::dense_attention<double>(in, plan.problem),
                           reference::make_direct_backend({})->run(plan, in)}) {
    for (int64_t t = 0; t < 2; ++t) {
      for (int64_t j = 0; j < 2; ++j) {
        EXPECT_TRUE(std::isinf(o.lse.data[t * 2 + j]) && o.lse.data[t * 2 + j] < 0);
        for (int64_t d = 0; d < 8; ++d) EXPECT_EQ(o.out.data[(t * 2 + j) * 8 + d], 0.f);
      }
    }
    EXPECT_TRUE(std::isfinite(o.lse.data[4]));
  }
}

TEST(Reference, OracleMatchesHandComputedSoftmax) {
  // One query, one key block of 2 positions: closed form.
  experiments::CaseSpec s;
  s.qo = {1};
  s.kv = {2};
  s.Hq = 1; s.Hkv = 1; s.D = 2; s.block_size = 2; s.page_size = 2; s.topk = 1; s.causal = false;
  Inputs in = experiments::make_case(s);
  in.selected.data = {0};
  in.q.data = {1.f, 0.f};
  const int32_t page = in.block_tables.data[0];
  float* k = &in.k_pages.data[page * 4];
  float* v = &in.v_pages.data[page * 4];
  k[0] = 1; k[1] = 0; k[2] = 0; k[3] = 1;    // scores (scaled by 1/sqrt 2): 1/sqrt2, 0
  v[0] = 1; v[1] = 2; v[2] = 3; v[3] = 4;
  const Outputs o = reference::dense_attention<double>(in, validate(in));
  const double s0 = 1 / std::sqrt(2.0), w0 = std::exp(s0), w1 = 1.0;
  EXPECT_NEAR(o.out.data[0], (w0 * 1 + w1 * 3) / (w0 + w1), 1e-6);
  EXPECT_NEAR(o.out.data[1], (w0 * 2 + w1 * 4) / (w0 + w1), 1e-6);
  EXPECT_NEAR(o.lse.data[0], std::log(w0 + w1), 1e-6);
}

// The benchmark's compact cases (CaseSpec::reachable_pages_only): every kept page holds exactly
// the full pool's values for its original page, every dropped page is in a block no query of its
// sequence selected, and the outputs are the same problem's.
TEST(CaseGen, ReachablePagesOnlyIsTheSameProblem) {
  for (int kind = 0; kind < 3; ++kind) {
    experiments::CaseSpec s = experiments::named_shape("tiny");
    if (kind == 1) s = testing::case_kinds()[0].second;  // the first case kind: random selections
    if (kind == 2) {  // a pool of several generator chunks, pages straddling their boundaries
      s.D = 72;
      s.qo = {1, 1, 1};
      s.kv = {3000, 900, 2000};
      s.page_size = 8;
      s.block_size = 32;
    }
    const Inputs full = experiments::make_case(s);
    s.reachable_pages_only = true;
    const Inputs part = experiments::make_case(s);
    ASSERT_EQ(full.block_tables.shape, part.block_tables.shape);
    EXPECT_EQ(full.selected.data, part.selected.data);
    EXPECT_EQ(full.q.data, part.q.data);
    EXPECT_LE(part.k_pages.shape[0], full.k_pages.shape[0]);
    const int64_t pf = full.k_pages.numel() / full.k_pages.shape[0];
    const int64_t B = full.block_tables.shape[0], cols = full.block_tables.shape[1], ppb = s.block_size / s.page_size;
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t c = 0; c < cols; ++c) {
        const int32_t was = full.block_tables.data[b * cols + c], now = part.block_tables.data[b * cols + c];
        if (now >= 0) {
          ASSERT_GE(was, 0);
          for (int64_t i = 0; i < pf; ++i) {
            ASSERT_EQ(part.k_pages.data[now * pf + i], full.k_pages.data[was * pf + i]) << "page " << was;
            ASSERT_EQ(part.v_pages.data[now * pf + i], full.v_pages.data[was * pf + i]) << "page " << was;
          }
        } else if (was >= 0) {
          for (int64_t t = full.cu_seqlens_q.data[b]; t < full.cu_seqlens_q.data[b + 1]; ++t) {
            for (int64_t i = 0; i < s.Hkv * s.topk; ++i) {
              EXPECT_NE(full.selected.data[t * s.Hkv * s.topk + i], c / ppb) << "dropped a selected block";
            }
          }
        }
      }
    }
    auto direct = reference::make_direct_backend({"direct", "", {}, "host"});
    const Outputs a = direct->run(make_plan(full, direct->plan_options()), full);
    const Outputs b2 = direct->run(make_plan(part, direct->plan_options()), part);
    EXPECT_EQ(a.out.data, b2.out.data);
    EXPECT_EQ(a.lse.data, b2.lse.data);
  }
}

}  // namespace
}  // namespace kvouter
