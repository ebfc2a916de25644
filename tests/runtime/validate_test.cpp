// SPEC §3: every violation is a typed InputError whose message names the field, the expected and
// the actual value.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>

#include "case_gen.h"
#include "kvouter/errors.h"
#include "kvouter/plan.h"

namespace kvouter {
namespace {

Inputs good() {
  experiments::CaseSpec s;
  s.qo = {3, 2};
  s.kv = {16, 12};
  s.Hq = 4; s.Hkv = 2; s.D = 8; s.block_size = 8; s.page_size = 4; s.topk = 2;
  return experiments::make_case(s);
}

struct Violation {
  const char* name;
  std::function<void(Inputs&)> mutate;
  std::vector<std::string> message_parts;  // each must appear in the message
};

class ValidateTest : public ::testing::TestWithParam<Violation> {};

TEST_P(ValidateTest, RaisesTypedErrorNamingField) {
  Inputs in = good();
  ASSERT_NO_THROW(validate(in));
  GetParam().mutate(in);
  try {
    validate(in);
    FAIL() << "no error for " << GetParam().name;
  } catch (const InputError& e) {
    const std::string msg = e.what();
    for (const auto& part : GetParam().message_parts) EXPECT_NE(msg.find(part), std::string::npos) << msg;
    EXPECT_NE(msg.find("expected"), std::string::npos) << msg;
    EXPECT_NE(msg.find("got"), std::string::npos) << msg;
  }
}

void set_dim(Tensor<float>& t, int d, int64_t v) {
  t.shape[d] = v;
  t.data.assign(static_cast<size_t>(Tensor<float>::count(t.shape)), 0.f);
}

INSTANTIATE_TEST_SUITE_P(
    Spec3, ValidateTest,
    ::testing::Values(
        Violation{"hq_not_multiple", [](Inputs& in) { set_dim(in.q, 1, 3); }, {"Hq", "multiple of Hkv = 2", "3"}},
        Violation{"hkv_zero", [](Inputs& in) { set_dim(in.k_pages, 1, 0); set_dim(in.v_pages, 1, 0); }, {"Hkv"}},
        Violation{"d_zero", [](Inputs& in) { set_dim(in.q, 2, 0); }, {"D"}},
        Violation{"topk_zero", [](Inputs& in) { in.selected.shape[2] = 0; in.selected.data.clear(); }, {"topk"}},
        Violation{"block_not_multiple", [](Inputs& in) { in.block_size = 6; }, {"block_size", "multiple of page_size = 4", "6"}},
        Violation{"block_zero", [](Inputs& in) { in.block_size = 0; }, {"block_size"}},
        Violation{"cu_not_zero", [](Inputs& in) { in.cu_seqlens_q.data[0] = 1; }, {"cu_seqlens_q[0]", "0", "1"}},
        Violation{"cu_decreasing", [](Inputs& in) { in.cu_seqlens_q.data[1] = 6; }, {"cu_seqlens_q[2]", "non-decreasing"}},
        Violation{"cu_end", [](Inputs& in) { in.cu_seqlens_q.data[2] = 4; }, {"cu_seqlens_q[2]", "Tq = 5", "4"}},
        Violation{"batch_cu", [](Inputs& in) { in.cu_seqlens_q.shape = {4}; in.cu_seqlens_q.data = {0, 3, 5, 5}; }, {"cu_seqlens_q.shape[0]", "3", "4"}},
        // fuzz_validate_plan: an empty table claiming B = 2^63 - 1 made B + 1 overflow.
        Violation{"batch_overflow", [](Inputs& in) { in.block_tables.shape = {std::numeric_limits<int64_t>::max(), 0}; in.block_tables.data.clear(); }, {"block_tables.shape[0]", "9223372036854775807"}},
        Violation{"batch_used", [](Inputs& in) { in.used_kv_lens->shape = {1}; in.used_kv_lens->data = {16}; }, {"used_kv_lens.shape[0]", "2", "1"}},
        Violation{"kv_shape", [](Inputs& in) { set_dim(in.v_pages, 2, 2); }, {"v_pages.shape"}},
        Violation{"d_mismatch", [](Inputs& in) { set_dim(in.k_pages, 3, 4); set_dim(in.v_pages, 3, 4); }, {"k_pages.shape[3]", "8", "4"}},
        Violation{"page_size_mismatch", [](Inputs& in) { in.page_size = 2; }, {"k_pages.shape[2]", "page_size", "2", "4"}},
        Violation{"selected_tq", [](Inputs& in) { in.selected.shape[0] = 4; in.selected.data.resize(4 * 2 * 2); }, {"selected.shape[0]", "5", "4"}},
        Violation{"selected_hkv", [](Inputs& in) { in.selected.shape[1] = 1; in.selected.data.resize(5 * 2); }, {"selected.shape[1]", "2", "1"}},
        Violation{"selected_id", [](Inputs& in) { in.selected.data[7] = 99; }, {"selected[1, 1, 1]", "msb = 2", "99"}},
        Violation{"used_negative", [](Inputs& in) { in.used_kv_lens->data[1] = -1; }, {"used_kv_lens[1]", "-1"}},
        Violation{"used_too_long", [](Inputs& in) { in.used_kv_lens->data[0] = 17; }, {"used_kv_lens[0]", "16", "17"}},
        Violation{"table_page", [](Inputs& in) { in.block_tables.data[1] = 1000; }, {"block_tables[0, 1]", "num_pages", "1000"}},
        Violation{"rank", [](Inputs& in) { in.q.shape = {5, 32}; }, {"q", "3 dimensions", "2"}},
        Violation{"data_size", [](Inputs& in) { in.q.data.pop_back(); }, {"q", "elements"}},
        Violation{"overflow", [](Inputs& in) { in.q.shape = {int64_t{1} << 40, int64_t{1} << 40, 8}; }, {"q", "64 bits"}},
        Violation{"scale_nan", [](Inputs& in) { in.softmax_scale = std::nanf(""); }, {"softmax_scale", "finite"}}),
    [](const auto& info) { return std::string(info.param.name); });

TEST(Validate, TableEntriesBeyondLengthAreNotChecked) {
  Inputs in = good();
  // Sequence 1 has L = 12: its pages 3.. cover no position < L, so garbage there is allowed.
  in.block_tables.data[1 * 4 + 3] = 1000;
  EXPECT_NO_THROW(validate(in));
}

TEST(Validate, EmptyQueryIsValid) {
  experiments::CaseSpec s;
  s.qo = {0, 0};
  s.kv = {8, 8};
  Inputs in = experiments::make_case(s);
  const Problem p = validate(in);
  EXPECT_EQ(p.Tq, 0);
  Plan plan = make_plan(in);
  EXPECT_EQ(plan.tiles.num_tiles, 0);
}

TEST(Validate, DefaultScale) {
  Inputs in = good();
  EXPECT_FLOAT_EQ(validate(in).scale, 1.f / std::sqrt(8.f));
  in.softmax_scale = 0.5f;
  EXPECT_FLOAT_EQ(validate(in).scale, 0.5f);
}

// fuzz_validate_plan (corpus crash_view_strides_overflow): a zero extent beside extents whose
// product passes 2^63 made the view's stride computation overflow (UBSan). Such a view addresses
// nothing: no element, row-major, no overflow.
TEST(Validate, AZeroExtentBesideHugeOnesOverflowsNothing) {
  TensorView<const float> v(nullptr, {int64_t{1} << 40, int64_t{1} << 31, 0});
  EXPECT_EQ(v.numel(), 0);
  EXPECT_TRUE(v.row_major());
  TensorView<const float> w(nullptr, {0, int64_t{1} << 31, int64_t{1} << 40});
  EXPECT_EQ(w.numel(), 0);
  EXPECT_TRUE(w.row_major());
}

}  // namespace
}  // namespace kvouter
