// Inputs and outputs as views of caller memory (an engine's own arrays): every CPU backend reads
// them in place and writes its results into caller buffers; bad views are typed errors naming the
// field; a run allocates nothing the size of the KV pool.
#include <gtest/gtest.h>

#include <cmath>

#include "case_gen.h"
#include "cli_util.h"
#include "dense_eigen.h"
#include "kvouter/backend.h"
#include "kvouter/errors.h"
#include "kvouter/tile_layout.h"
#include "allocation_counter.h"
#include "registry.h"

namespace kvouter {
namespace {

// An engine's arrays: the inputs live in plain vectors the engine owns, viewed without a copy.
struct EngineArrays {
  std::vector<float> q, k, v;
  std::vector<int32_t> selected, tables, lens;
  std::vector<int64_t> cu;
  Problem p;
  InputsView view;
};

EngineArrays engine_case(const experiments::CaseSpec& spec) {
  const Inputs in = experiments::make_case(spec);
  EngineArrays e;
  e.q.assign(in.q.data.begin(), in.q.data.end());
  e.k.assign(in.k_pages.data.begin(), in.k_pages.data.end());
  e.v.assign(in.v_pages.data.begin(), in.v_pages.data.end());
  e.selected.assign(in.selected.data.begin(), in.selected.data.end());
  e.tables.assign(in.block_tables.data.begin(), in.block_tables.data.end());
  e.cu.assign(in.cu_seqlens_q.data.begin(), in.cu_seqlens_q.data.end());
  if (in.used_kv_lens) e.lens.assign(in.used_kv_lens->data.begin(), in.used_kv_lens->data.end());
  auto dims = [](const std::vector<int64_t>& s) { return s; };
  const auto qs = dims(in.q.shape), ks = dims(in.k_pages.shape), ss = dims(in.selected.shape), ts = dims(in.block_tables.shape);
  e.view.q = TensorView<const float>(e.q.data(), {qs[0], qs[1], qs[2]});
  e.view.k_pages = TensorView<const float>(e.k.data(), {ks[0], ks[1], ks[2], ks[3]});
  e.view.v_pages = TensorView<const float>(e.v.data(), {ks[0], ks[1], ks[2], ks[3]});
  e.view.selected = TensorView<const int32_t>(e.selected.data(), {ss[0], ss[1], ss[2]});
  e.view.block_tables = TensorView<const int32_t>(e.tables.data(), {ts[0], ts[1]});
  e.view.cu_seqlens_q = TensorView<const int64_t>(e.cu.data(), {static_cast<int64_t>(e.cu.size())});
  if (in.used_kv_lens) e.view.used_kv_lens = TensorView<const int32_t>(e.lens.data(), {static_cast<int64_t>(e.lens.size())});
  e.view.block_size = in.block_size;
  e.view.page_size = in.page_size;
  e.view.causal = in.causal;
  e.view.softmax_scale = in.softmax_scale;
  e.p = validate(e.view);
  return e;
}

experiments::CaseSpec small_spec() {
  experiments::CaseSpec s;
  s.qo = {5, 1, 3};
  s.kv = {40, 17, 64};
  s.Hq = 4;
  s.Hkv = 2;
  s.D = 16;
  s.block_size = 8;
  s.page_size = 4;
  s.topk = 3;
  s.pad_prob = 0.1;
  s.neg_page_prob = 0.1;
  return s;
}

TEST(Views, EveryCpuBackendReadsAndWritesCallerMemory) {
  experiments::register_all_backends();
  EngineArrays e = engine_case(small_spec());
  const Outputs ref = reference::dense_attention<double>(e.view, e.p);
  for (const auto& [backend, schedule] : std::vector<std::pair<std::string, std::string>>{
           {"direct", ""}, {"dense", ""}, {"jit", "cpu_tiled"}, {"jit", "cpu_rowstream"}, {"aot", "cpu_tiled"}}) {
    SCOPED_TRACE(backend + " " + schedule);
    auto b = BackendRegistry::instance().make({backend, schedule, {}, ""});
    Planner planner(b->plan_options());
    const Plan& plan = planner.plan(e.view);
    std::vector<float> out(static_cast<size_t>(e.p.Tq * e.p.Hq * e.p.D), 7.f), lse(static_cast<size_t>(e.p.Tq * e.p.Hq), 7.f);
    b->run_into(plan, e.view,
                OutputsView(TensorView<float>(out.data(), {e.p.Tq, e.p.Hq, e.p.D}), TensorView<float>(lse.data(), {e.p.Tq, e.p.Hq})));
    Outputs got{Tensor<float>({e.p.Tq, e.p.Hq, e.p.D}), Tensor<float>({e.p.Tq, e.p.Hq})};
    got.out.data.assign(out.begin(), out.end());
    got.lse.data.assign(lse.begin(), lse.end());
    const auto err = experiments::compare_outputs(got, ref);
    EXPECT_TRUE(err.ok()) << err.max_out_err << " " << err.max_lse_err;
    // A change to the engine's K is seen by the next run: the backend reads the memory itself.
    for (float& x : e.k) x = -x;
    const Outputs flipped = b->run(plan, e.view);
    for (float& x : e.k) x = -x;
    EXPECT_NE(std::vector<float>(flipped.lse.data.begin(), flipped.lse.data.end()), lse);
  }
}

// An engine's steps through one backend: the host kernels' partials are the backend's, grown to
// the largest plan and reused, so that a later step allocates none; a smaller step after a larger
// one, and a step with no tile at all after both, see nothing of the earlier steps' partials.
TEST(Views, HalideBackendsReuseTheirPartialsAcrossSteps) {
  experiments::register_all_backends();
  experiments::CaseSpec big_spec = small_spec();
  big_spec.qo = {9, 4, 6};
  big_spec.kv = {90, 40, 120};
  big_spec.topk = 5;
  EngineArrays big = engine_case(big_spec), small = engine_case(small_spec()), none = engine_case(small_spec());
  for (int32_t& id : none.selected) id = -1;  // every row empty: a plan of no tile
  const Outputs ref_big = reference::dense_attention<double>(big.view, big.p);
  const Outputs ref_small = reference::dense_attention<double>(small.view, small.p);
  for (const auto& [backend, schedule] : std::vector<std::pair<std::string, std::string>>{
           {"jit", "cpu_tiled"}, {"aot", "cpu_tiled"}, {"jit", "cpu_decode"}}) {
    SCOPED_TRACE(backend + " " + schedule);
    auto b = BackendRegistry::instance().make({backend, schedule, {}, ""});
    Planner planner(b->plan_options());
    auto run = [&](EngineArrays& e) {
      Outputs got = outputs_for(e.p);
      b->run_into(planner.plan(e.view), e.view, got);
      return got;
    };
    for (int round = 0; round < 2; ++round) {
      SCOPED_TRACE(round);
      const Outputs got_big = run(big);
      EXPECT_TRUE(experiments::compare_outputs(got_big, ref_big).ok());
      const Plan& plan = planner.plan(big.view);
      const size_t partial_bytes = static_cast<size_t>(plan.tiles.num_partials() * big.p.qhead *
                                                       (big.p.D + layout::kPartialExtra)) * sizeof(float);
      Outputs again = outputs_for(big.p);
      testing_alloc::largest = 0;
      b->run_into(plan, big.view, again);
      EXPECT_LT(testing_alloc::largest.load(), partial_bytes) << "a step allocated its partials anew";
      const Outputs got_small = run(small);
      EXPECT_TRUE(experiments::compare_outputs(got_small, ref_small).ok());
      const Outputs got_none = run(none);
      EXPECT_EQ(planner.current().tiles.num_tiles, 0);
      for (float x : got_none.out.data) ASSERT_EQ(x, 0.f);
      for (float x : got_none.lse.data) ASSERT_TRUE(std::isinf(x) && x < 0) << x;
    }
  }
}

TEST(Views, HalideBackendsCopyNoKvPool) {
  // A pool of 64 MB per K and V of which a few pages are selected: no run allocates a buffer the
  // size of the pool (the CPU paths read K/V in place).
  experiments::register_all_backends();
  experiments::CaseSpec s = small_spec();
  s.extra_pages = 0;
  EngineArrays e = engine_case(s);
  const int64_t page_floats = e.view.k_pages.numel() / e.view.k_pages.dim(0);
  const int64_t pages = (int64_t{64} << 20) / static_cast<int64_t>(sizeof(float)) / page_floats;
  e.k.resize(static_cast<size_t>(pages * page_floats), 0.5f);
  e.v.resize(e.k.size(), 0.25f);
  e.view.k_pages = TensorView<const float>(e.k.data(), {pages, e.view.k_pages.dim(1), e.view.k_pages.dim(2), e.view.k_pages.dim(3)});
  e.view.v_pages = TensorView<const float>(e.v.data(), {pages, e.view.v_pages.dim(1), e.view.v_pages.dim(2), e.view.v_pages.dim(3)});
  for (const auto& [backend, schedule] : std::vector<std::pair<std::string, std::string>>{{"jit", "cpu_tiled"}, {"aot", "cpu_tiled"}}) {
    SCOPED_TRACE(backend);
    auto b = BackendRegistry::instance().make({backend, schedule, {}, ""});
    Planner planner(b->plan_options());
    const Plan& plan = planner.plan(e.view);
    b->run(plan, e.view);  // compiles (JIT), outside the measured run
    testing_alloc::largest = 0;
    b->run(plan, e.view);
    EXPECT_LT(testing_alloc::largest.load(), e.k.size() * sizeof(float) / 16);
  }
}

// An engine's 16-bit pools: the views point at its uint16 arrays, tagged with their dtype, and every
// CPU backend reads them in place.
TEST(Views, SixteenBitPoolsAreReadInPlace) {
  experiments::register_all_backends();
  for (Dtype t : {Dtype::kFloat16, Dtype::kBFloat16}) {
    experiments::CaseSpec spec = small_spec();
    spec.dtype = t;
    const Inputs in = experiments::make_case(spec);
    std::vector<uint16_t> q(in.q_bits.data.begin(), in.q_bits.data.end()), k(in.k_bits.data.begin(), in.k_bits.data.end()),
        v(in.v_bits.data.begin(), in.v_bits.data.end());
    InputsView view = in;
    const auto& qs = in.q.shape;
    const auto& ks = in.k_pages.shape;
    view.q = StorageView(q.data(), {qs[0], qs[1], qs[2]}, t);
    view.k_pages = StorageView(k.data(), {ks[0], ks[1], ks[2], ks[3]}, t);
    view.v_pages = StorageView(v.data(), {ks[0], ks[1], ks[2], ks[3]}, t);
    Inputs values = in;
    values.store_as(Dtype::kFloat32);
    const Outputs ref = reference::dense_attention<double>(values, validate(values));
    for (auto [backend, schedule] : {std::pair{"direct", ""}, {"dense", ""}, {"jit", "cpu_tiled"}, {"aot", "cpu_tiled"}}) {
      auto b = BackendRegistry::instance().make({backend, schedule, {}, ""});
      const Plan plan = make_plan(view, b->plan_options());
      Outputs got = outputs_for(plan.problem);
      b->run_into(plan, view, got);
      const auto err = experiments::compare_outputs(got, ref);
      EXPECT_TRUE(err.ok()) << backend << " in " << dtype_name(t) << ": " << err.max_out_err;
    }
  }
}

TEST(Views, BadViewsAreTypedErrorsNamingTheField) {
  const EngineArrays good = engine_case(small_spec());
  auto expect_error = [&](const char* field, auto mutate) {
    InputsView v = good.view;
    mutate(v);
    try {
      validate(v);
      ADD_FAILURE() << "no error for a bad " << field;
    } catch (const InputError& err) {
      EXPECT_EQ(std::string(err.what()).rfind(field, 0), 0u) << err.what();
    }
  };
  expect_error("q", [](InputsView& v) { v.q.rank = 2; });
  expect_error("k_pages", [](InputsView& v) { v.k_pages.data = nullptr; });
  expect_error("v_pages", [](InputsView& v) { v.v_pages.strides[3] = 2; });  // not contiguous
  expect_error("selected", [](InputsView& v) { v.selected.shape[0] = -1; });
  expect_error("block_tables", [](InputsView& v) { std::swap(v.block_tables.strides[0], v.block_tables.strides[1]); });
  expect_error("v_pages.shape", [](InputsView& v) { v.v_pages.shape[0] += 1; v.v_pages.set_row_major_strides(); });
  // Storage dtypes (SPEC section 1): one for the three, and one of the three.
  expect_error("k_pages dtype", [](InputsView& v) { v.k_pages.dtype = Dtype::kFloat16; });
  expect_error("v_pages dtype", [](InputsView& v) { v.v_pages.dtype = Dtype::kBFloat16; });
  expect_error("q dtype", [](InputsView& v) { v.q.dtype = static_cast<Dtype>(7); });
  // An owning Inputs that says float16 without its bits.
  try {
    Inputs in = experiments::make_case(small_spec());
    in.dtype = Dtype::kFloat16;
    InputsView v(in);
    ADD_FAILURE() << "no error for float16 inputs without bits";
  } catch (const InputError& err) {
    EXPECT_EQ(std::string(err.what()).rfind("q (float16 bits)", 0), 0u) << err.what();
  }

  // Outputs of the wrong shape or without memory.
  experiments::register_all_backends();
  auto b = BackendRegistry::instance().make({"jit", "cpu_tiled", {}, ""});
  const Plan plan = make_plan(good.view, b->plan_options());
  const Problem& p = plan.problem;
  std::vector<float> out(static_cast<size_t>(p.Tq * p.Hq * p.D)), lse(static_cast<size_t>(p.Tq * p.Hq));
  auto expect_out_error = [&](const char* field, OutputsView o) {
    try {
      b->run_into(plan, good.view, o);
      ADD_FAILURE() << "no error for a bad " << field;
    } catch (const InputError& err) {
      EXPECT_EQ(std::string(err.what()).rfind(field, 0), 0u) << err.what();
    }
  };
  expect_out_error("out", OutputsView(TensorView<float>(out.data(), {p.Tq, p.Hq, p.D + 1}), TensorView<float>(lse.data(), {p.Tq, p.Hq})));
  expect_out_error("lse", OutputsView(TensorView<float>(out.data(), {p.Tq, p.Hq, p.D}), TensorView<float>(nullptr, {p.Tq, p.Hq})));
}

}  // namespace
}  // namespace kvouter
