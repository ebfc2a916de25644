// The Vulkan schedules, run for real: on Mesa's lavapipe in CI (under the Khronos validation layer:
// ctest fails any test whose output holds "Validation Error") and on the H200 through the NVIDIA
// driver. Every Vulkan schedule against the float64 oracle on every case kind, through the JIT
// and through the AOT registry; odd sizes that need the 64-byte device-buffer padding.
#include <gtest/gtest.h>

#include <set>

#include "case_kinds.h"
#include "cli_util.h"
#include "dense_eigen.h"
#include "kvouter/aot.h"
#include "kvouter/errors.h"
#include "kvouter/tile_layout.h"
#include "kvouter/vulkan_probe.h"
#include "registry.h"
#include "schedules.h"

namespace kvouter {
namespace {

#define REQUIRE_VULKAN()                                                                   \
  do {                                                                                     \
    std::string why;                                                                       \
    if (vulkan_devices(&why).empty()) GTEST_SKIP() << "no Vulkan device: " << why;         \
  } while (0)

// The manual Vulkan schedules (every one must pass everything) and the autoscheduled GPU twins.
std::vector<std::string> vulkan_schedules(bool twins = false) {
  std::vector<std::string> names;
  for (const auto& s : pipeline::all_schedules()) {
    if (s.device == "vulkan" && s.autoscheduler.empty() != twins) names.push_back(s.name);
  }
  return names;
}

// Where Halide 21's GPU autoschedulers produce wrong kernels for this pipeline (measured on
// lavapipe under the validation layer; README "Vulkan").
const char* twin_known_failure(const std::string& twin, const std::string& kind) {
  static const std::set<std::string> anderson_invalid = {"gqa_causal_long_kv", "padding_duplicates", "negative_shared_pages",
                                                         "partial_block_topk_gt_blocks", "d72_block256_len232",
                                                         "custom_scale_large_logits", "blocks_beyond_len"};
  if (twin == "auto_anderson2021" && anderson_invalid.count(kind)) {
    return "Anderson2021 emits SPIR-V the validation layer rejects (UNASSIGNED-CoreValidation-Shader-InconsistentSpirv)";
  }
  if (twin == "auto_mullapudi2016_gpu" && (kind == "tiny" || kind == "d72_block256_len232")) {
    return "Mullapudi2016's experimental GPU schedule gives wrong outputs here (every LSE wrong)";
  }
  return nullptr;
}

void check(const std::string& backend_name, const std::string& schedule, const Inputs& in, const std::string& what,
           std::map<std::string, std::string> knobs = {}, int64_t batches = 1) {
  experiments::register_all_backends();
  auto backend = BackendRegistry::instance().make({backend_name, schedule, std::move(knobs), "host-vulkan"});
  PlanOptions opt = backend->plan_options();
  EXPECT_GT(opt.max_batch_partial_floats, 0) << "Vulkan backends plan within the device's buffer limit";
  if (batches > 1) {
    // Force query batches: each batch's partials at most 1/batches of the whole.
    const Plan whole = make_plan(in, opt);
    const Problem& p = whole.problem;
    opt.max_batch_partial_floats = whole.tiles.num_partials() * p.qhead * (p.D + layout::kPartialExtra) / batches;
  }
  const Plan plan = make_plan(in, opt);
  if (batches > 1) {
    EXPECT_GT(plan.tiles.batch_tile_begin.size(), 2u);
  }
  const Outputs got = backend->run(plan, in);
  const Outputs ref = reference::dense_attention<double>(in, plan.problem);
  const auto err = experiments::compare_outputs(got, ref);

  EXPECT_TRUE(err.ok()) << backend_name << " " << schedule << " on " << what << ": max|out err| " << err.max_out_err
                        << " max|lse err| " << err.max_lse_err;
}

using Param = std::tuple<std::string, std::pair<std::string, experiments::CaseSpec>>;
class VulkanJitTest : public ::testing::TestWithParam<Param> {};

TEST_P(VulkanJitTest, MatchesOracle) {
  REQUIRE_VULKAN();
  const auto& [schedule, kind] = GetParam();
  check("jit", schedule, experiments::make_case(kind.second), kind.first);
}

INSTANTIATE_TEST_SUITE_P(ScheduleXKind, VulkanJitTest,
                         ::testing::Combine(::testing::ValuesIn(vulkan_schedules()),
                                            ::testing::ValuesIn(testing::case_kinds())),
                         [](const auto& info) {
                           return std::get<0>(info.param) + "_" + std::get<1>(info.param).first;
                         });

class VulkanTwinTest : public ::testing::TestWithParam<Param> {};

TEST_P(VulkanTwinTest, MatchesOracle) {
  REQUIRE_VULKAN();
  const auto& [twin, kind] = GetParam();
  if (const char* why = twin_known_failure(twin, kind.first)) GTEST_SKIP() << "known Halide 21 failure: " << why;
  check("jit", twin, experiments::make_case(kind.second), kind.first);
}

INSTANTIATE_TEST_SUITE_P(TwinXKind, VulkanTwinTest,
                         ::testing::Combine(::testing::ValuesIn(vulkan_schedules(true)),
                                            ::testing::ValuesIn(testing::case_kinds())),
                         [](const auto& info) {
                           return std::get<0>(info.param) + "_" + std::get<1>(info.param).first;
                         });

TEST(Vulkan, OddSizesNeedingPadding) {
  REQUIRE_VULKAN();
  // Every array here has a byte size that is not a multiple of 64 (D 5, 3 query heads, 7 queries,
  // 13 pages): without the runtime's padding Halide 21's allocator corrupts or fails them.
  experiments::CaseSpec s;
  s.qo = {7};
  s.kv = {23};
  s.Hq = 3; s.Hkv = 1; s.D = 5; s.block_size = 4; s.page_size = 2; s.topk = 3;
  for (const auto& schedule : vulkan_schedules()) {
    check("jit", schedule, experiments::make_case(s), "odd sizes", {{"T", "3"}});
  }
}

TEST(Vulkan, QueryBatchesMatchTheOracle) {
  REQUIRE_VULKAN();
  // Batches are how plans larger than one device buffer run (gpu-prefill's partials are 17 GB):
  // every batch's forward and combine on its own tiles, partial_index rebased per batch.
  for (const auto& schedule : vulkan_schedules()) {
    check("jit", schedule, experiments::make_case(experiments::named_shape("tiny")), "tiny in 4 batches", {}, 4);
    experiments::CaseSpec s;
    s.qo = {5, 9, 3};
    s.kv = {40, 90, 17};
    s.Hq = 4; s.Hkv = 2; s.D = 16; s.block_size = 8; s.page_size = 4; s.topk = 5;
    check("jit", schedule, experiments::make_case(s), "varlen in 3 batches", {{"T", "2"}}, 3);
  }
}

TEST(Vulkan, KnobsChangeTheScheduleNotTheResult) {
  REQUIRE_VULKAN();
  Inputs in = experiments::make_case(experiments::named_shape("tiny"));
  check("jit", "vulkan_tiled", in, "tiny T=4 rows=2 unroll=1", {{"T", "4"}, {"rows", "2"}, {"unroll", "1"}});
  check("jit", "vulkan_rows", in, "tiny rows=8 unroll=8", {{"rows", "8"}, {"unroll", "8"}});
  // The GPU schedules process a block as one chunk: a smaller chunk is a clear compile error.
  EXPECT_THROW(check("jit", "vulkan_tiled", in, "tiny chunk=16", {{"chunk", "16"}}), BackendError);
}

TEST(Vulkan, AotVariantsOnTheirShape) {
  REQUIRE_VULKAN();
  experiments::CaseSpec s = experiments::named_shape("prefill");  // D 128, page 16, block 64, qhead 8
  s.qo = {96};
  s.kv = {512};
  const Inputs in = experiments::make_case(s);
  for (const auto& schedule : vulkan_schedules()) check("aot", schedule, in, "prefill-like");
  // The kernels measured on the H200, on small cases of their specialisation (there is no
  // generic Vulkan variant, so a run means the specialised one was chosen): gpu-prefill's
  // (D 128, page 64, block 128, qhead 16, T 16) and gpu-decode's (T 1).
  experiments::CaseSpec gp = experiments::named_shape("gpu-prefill");
  gp.qo = {64};
  gp.kv = {1024};
  const Inputs gpu_prefill_like = experiments::make_case(gp);
  for (const auto& schedule : vulkan_schedules()) check("aot", schedule, gpu_prefill_like, "gpu-prefill-like");
  experiments::CaseSpec gd = experiments::named_shape("gpu-decode");
  gd.qo = {1, 1, 1};
  gd.kv = {2048, 1500, 640};
  const Inputs gpu_decode_like = experiments::make_case(gd);
  for (const auto& schedule : vulkan_schedules()) check("aot", schedule, gpu_decode_like, "gpu-decode-like");
}

TEST(Vulkan, CpuScheduleOnVulkanTargetIsAClearError) {
  experiments::register_all_backends();
  EXPECT_THROW(BackendRegistry::instance().make({"jit", "cpu_tiled", {}, "host-vulkan"}), BackendError);
  EXPECT_THROW(BackendRegistry::instance().make({"jit", "vulkan_tiled", {}, "host"}), BackendError);
}

}  // namespace
}  // namespace kvouter
