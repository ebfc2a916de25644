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
