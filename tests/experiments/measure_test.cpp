// The measurement core (experiments/measure.h) that every tool times through: repetitions inside one
// call for the Halide backends and one call each for the baselines, the check before timing, the
// tuner's cut-off, alternating rounds, and the one record schema.
#include <gtest/gtest.h>

#include <cmath>

#include "../../reference/dense_eigen.h"
#include "case_gen.h"
#include "kvouter/backend.h"
#include "kvouter/stats.h"
#include "measure.h"
#include "registry.h"

namespace kvouter::experiments {
namespace {

struct Case {
  Inputs in = make_case(named_shape("tiny"));
  Outputs ref = reference::dense_attention<double>(in, validate(in));
};

std::unique_ptr<Backend> backend(const std::string& name, const std::string& schedule = "") {
  register_all_backends();
  return BackendRegistry::instance().make({name, schedule, {}, ""});
}

// `repeats` repetitions of `be` on the tiny case, checked against its oracle.
Measurement checked(Backend& be, const Case& c, int repeats, const Plan& plan) {
  MeasureOptions o;
  o.repeats = repeats;
  o.reference = &c.ref;
  return measure(be, plan, c.in, o);
}

TEST(Measure, HalideBackendRepeatsItsKernelsInOneCall) {
  Case c;
  auto be = backend("jit", "cpu_tiled");
  const Plan plan = make_plan(c.in, be->plan_options());
  const Measurement m = checked(*be, c, 4, plan);
  ASSERT_TRUE(m.checked);
  EXPECT_TRUE(m.ok());
  ASSERT_EQ(m.ms.size(), 4u);
  ASSERT_EQ(m.forward_ms.size(), 4u);
  ASSERT_EQ(m.combine_ms.size(), 4u);
  for (size_t i = 0; i < m.ms.size(); ++i) {
    EXPECT_GT(m.forward_ms[i], 0.0);
    EXPECT_DOUBLE_EQ(m.ms[i], m.forward_ms[i] + m.combine_ms[i]);
  }
  // The last call repeated its kernels four times (KernelTiming): one call, not four.
  EXPECT_EQ(be->last_timing().forward_all.size(), 4u);
  EXPECT_GT(m.compile_ms, 0.0);  // the JIT's, in the warm call, outside the times
  EXPECT_GT(m.first_call_ms, 0.0);
  EXPECT_DOUBLE_EQ(m.median(), median(m.ms));
  EXPECT_TRUE(compare_outputs(m.out, c.ref).ok());
}

TEST(Measure, BaselinesRunOneCallPerRepetition) {
  Case c;
  for (const char* name : {"direct", "dense"}) {
    auto be = backend(name);
    const Plan plan = make_plan(c.in, be->plan_options());
    const Measurement m = checked(*be, c, 3, plan);
    EXPECT_TRUE(m.ok()) << name;
    ASSERT_EQ(m.ms.size(), 3u) << name;
    for (double ms : m.ms) EXPECT_GT(ms, 0.0) << name;
    EXPECT_TRUE(be->last_timing().forward_all.empty()) << name;
  }
}

TEST(Measure, AWrongResultIsNeverTimed) {
  Case c;
  Outputs wrong = c.ref;
  wrong.out.data[3] += 1.0f;
  auto be = backend("direct");
  const Plan plan = make_plan(c.in, be->plan_options());
  MeasureOptions o;
  o.reference = &wrong;
  const Measurement m = measure(*be, plan, c.in, o);
  EXPECT_FALSE(m.ok());
  EXPECT_NEAR(m.err.max_out_err, 1.0, 1e-3);
  EXPECT_TRUE(m.ms.empty());
  const nlohmann::json r = measurement_record(m, plan);
  EXPECT_FALSE(r["ok"].get<bool>());
}

TEST(Measure, WithoutAWarmCallTheFirstCallIsTimedAndCheckedAfter) {
  Case c;
  Outputs wrong = c.ref;
  wrong.lse.data[0] += 1.0f;
  auto be = backend("direct");
  const Plan plan = make_plan(c.in, be->plan_options());
  MeasureOptions o;
  o.repeats = 2;
  o.warm_call = false;
  o.reference = &wrong;
  const Measurement m = measure(*be, plan, c.in, o);
  EXPECT_EQ(m.ms.size(), 2u);
  EXPECT_EQ(m.first_call_ms, 0.0);
  EXPECT_FALSE(m.ok());
  EXPECT_NEAR(m.err.max_lse_err, 1.0, 1e-3);
}

TEST(Measure, CutOffStopsASlowCandidateAfterOneRepetition) {
  Case c;
  auto be = backend("dense");
  const Plan plan = make_plan(c.in, be->plan_options());
  MeasureOptions o;
  o.repeats = 5;
  o.stop_after_first_ms = 1e-9;  // every run is slower
  const Measurement slow = measure(*be, plan, c.in, o);
  EXPECT_EQ(slow.ms.size(), 1u);
  o.stop_after_first_ms = 1e9;
  const Measurement fast = measure(*be, plan, c.in, o);
  EXPECT_EQ(fast.ms.size(), 5u);
}

TEST(Measure, MinTotalAddsRepetitionsUpToTheCap) {
  Case c;
  auto be = backend("direct");
  const Plan plan = make_plan(c.in, be->plan_options());
  MeasureOptions o;
  o.repeats = 2;
  o.min_total_ms = 1e9;
  o.max_repeats = 6;
  EXPECT_EQ(measure(*be, plan, c.in, o).ms.size(), 6u);
}

TEST(Measure, AppendJoinsRoundsAndKeepsTheWorstError) {
  Measurement a, b;
  a.ms = {1, 2};
  a.forward_ms = {1, 2};
  a.combine_ms = {0, 0};
  a.checked = true;
  a.err.tol_ratio = 0.5;
  b.ms = {3};
  b.forward_ms = {3};
  b.combine_ms = {0};
  b.checked = true;
  b.err.tol_ratio = 2;
  a.append(b);
  EXPECT_EQ(a.ms, (std::vector<double>{1, 2, 3}));
  EXPECT_DOUBLE_EQ(a.median(), 2.0);
  EXPECT_FALSE(a.ok());
}

TEST(Measure, RecordHasTheOneSchema) {
  Case c;
  auto be = backend("jit", "cpu_tiled");
  const Plan plan = make_plan(c.in, be->plan_options());
  const Measurement m = checked(*be, c, 5, plan);
  const nlohmann::json r = measurement_record(m, plan);
  const auto& t = r["time_ms"];
  EXPECT_DOUBLE_EQ(t["median"].get<double>(), m.median());
  EXPECT_EQ(t["n"].get<size_t>(), 5u);
  EXPECT_EQ(t["all"].size(), 5u);
  EXPECT_LE(t["min"].get<double>(), t["p10"].get<double>());
  EXPECT_LE(t["p10"].get<double>(), t["median"].get<double>());
  EXPECT_LE(t["median"].get<double>(), t["p90"].get<double>());
  EXPECT_LE(t["p90"].get<double>(), t["max"].get<double>());
  for (const char* k : {"forward_ms", "combine_ms", "compile_ms", "first_call_ms", "transfer_ms", "plan_ms", "T",
                        "flops", "kv_bytes", "gflops", "kv_gbps", "ok", "max_out_err", "max_lse_err"}) {
    EXPECT_TRUE(r.contains(k)) << k;
  }
  EXPECT_NEAR(r["gflops"].get<double>(), plan.flops() / (m.median() * 1e6), 1e-9 * r["gflops"].get<double>());
  EXPECT_DOUBLE_EQ(record_median_ms(r), m.median());
  EXPECT_DOUBLE_EQ(record_median_ms({{"median_ms", 3.5}}), 3.5);  // a tuner log line of before
  EXPECT_DOUBLE_EQ(record_median_ms({{"kernel_ms", 0.8}}), 0.8);  // a GPU benchmark file of before
  EXPECT_TRUE(std::isnan(record_median_ms({{"status", "rejected"}})));
}

// The GPU benchmark's ratios are to the datasheet of the device that ran: the H200's and the
// H100's by their drivers' names, the more specific name first; none for another device.
TEST(Measure, GpuRatiosAreToTheDevicesOwnDatasheet) {
  const GpuDatasheet* h200 = gpu_datasheet("NVIDIA H200");
  const GpuDatasheet* h100 = gpu_datasheet("NVIDIA H100 80GB HBM3");
  ASSERT_TRUE(h200 && h100);
  EXPECT_EQ(h200->hbm_tbps, 4.8);
  EXPECT_EQ(h100->hbm_tbps, 3.35);
  EXPECT_EQ(h200->fp32_tflops, 67.0);
  EXPECT_EQ(gpu_datasheet("NVIDIA H100 PCIe")->hbm_tbps, 2.0);
  EXPECT_EQ(gpu_datasheet("NVIDIA H200 NVL")->fp32_tflops, 60.0);
  EXPECT_EQ(gpu_datasheet("llvmpipe (LLVM 15.0.6, 256 bits)"), nullptr);
  EXPECT_DOUBLE_EQ(pct_of_datasheet(h100, 1.675, &GpuDatasheet::hbm_tbps).get<double>(), 50.0);
  EXPECT_TRUE(pct_of_datasheet(nullptr, 1.0, &GpuDatasheet::hbm_tbps).is_null());
}

}  // namespace
}  // namespace kvouter::experiments
