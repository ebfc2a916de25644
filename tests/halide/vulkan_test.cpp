// The Vulkan schedules, run for real: on Mesa's lavapipe in CI (under the Khronos validation layer:
// ctest fails any test whose output holds "Validation Error") and on the H200 through the NVIDIA
// driver. Every Vulkan schedule against the float64 oracle on every case kind, through the JIT
// and through the AOT registry; odd sizes that need the 64-byte device-buffer padding.
#include <gtest/gtest.h>
#include <dlfcn.h>
#include <unistd.h>
#include <vulkan/vulkan.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <sstream>

#include "case_kinds.h"
#include "cli_util.h"
#include "dense_eigen.h"
#include "kvouter/aot.h"
#include "kvouter/aot_kernels.h"
#include "kvouter/cuda_probe.h"
#include "kvouter/errors.h"
#include "kvouter/jit.h"
#include "kvouter/spirv_stage.h"
#include "kvouter/tile_layout.h"
#include "kvouter/vulkan_probe.h"
#include "registry.h"
#include "schedule_registry.h"
#include "storage_check.h"
#include "tuner.h"
#include "vulkan_required.h"

namespace kvouter {
namespace {

#define REQUIRE_VULKAN()                                                                   \
  do {                                                                                     \
    std::string why;                                                                       \
    if (vulkan_devices(&why).empty()) KVOUTER_NO_VULKAN("no Vulkan device: " << why);     \
  } while (0)

// ctest fails a gpu test whose output holds "Validation Error". That check means something only
// if the layers HL_VK_LAYERS names are really there: this test fails (a failure, which ctest does
// not read as a skip) when one is missing, and, where Vulkan is required, when none is named.
TEST(Vulkan, RequestedLayersArePresent) {
  REQUIRE_VULKAN();
  const char* requested = std::getenv("HL_VK_LAYERS");
  if (!requested || !*requested) {
    if (testing_vulkan::required()) FAIL() << "KVOUTER_REQUIRE_VULKAN=1 without HL_VK_LAYERS: nothing would validate";
    GTEST_SKIP() << "HL_VK_LAYERS names no layer (ctest sets it)";
  }
  const auto available = vulkan_instance_layers();
  std::string list = requested;
  for (size_t start = 0; start <= list.size();) {
    const size_t end = std::min(list.find(':', start), list.size());
    const std::string layer = list.substr(start, end - start);
    EXPECT_TRUE(layer.empty() || std::find(available.begin(), available.end(), layer) != available.end())
        << "HL_VK_LAYERS names " << layer << ", which the Vulkan loader cannot load: the "
        << "\"Validation Error\" check would pass without validating anything";
    start = end + 1;
  }
}

// The positive control of that check: with the layers HL_VK_LAYERS names enabled, an invalid call
// (a buffer of size 0, VUID-VkBufferCreateInfo-size-00912) is reported as a "Validation Error".
// If the layer were not running, the check above it would be vacuous and this test fails.
TEST(Vulkan, TheValidationLayerReportsAnInvalidCall) {
  REQUIRE_VULKAN();
  const char* requested = std::getenv("HL_VK_LAYERS");
  if (!requested || std::string(requested).find("VK_LAYER_KHRONOS_validation") == std::string::npos) {
    if (testing_vulkan::required()) FAIL() << "KVOUTER_REQUIRE_VULKAN=1, but HL_VK_LAYERS does not name VK_LAYER_KHRONOS_validation";
    GTEST_SKIP() << "HL_VK_LAYERS does not name VK_LAYER_KHRONOS_validation (ctest sets it)";
  }
  void* lib = dlopen("libvulkan.so.1", RTLD_NOW | RTLD_LOCAL);
  ASSERT_NE(lib, nullptr);
  auto gipa = reinterpret_cast<PFN_vkGetInstanceProcAddr>(dlsym(lib, "vkGetInstanceProcAddr"));
  ASSERT_NE(gipa, nullptr);
  const char* layer = "VK_LAYER_KHRONOS_validation";
  VkApplicationInfo app{};
  app.sType = VK_STRUCTURE_TYPE_APPLICATION_INFO;
  app.apiVersion = VK_API_VERSION_1_1;
  VkInstanceCreateInfo ici{};
  ici.sType = VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO;
  ici.pApplicationInfo = &app;
  ici.enabledLayerCount = 1;
  ici.ppEnabledLayerNames = &layer;
  VkInstance inst = VK_NULL_HANDLE;
  ASSERT_EQ(reinterpret_cast<PFN_vkCreateInstance>(gipa(nullptr, "vkCreateInstance"))(&ici, nullptr, &inst), VK_SUCCESS);
  auto fn = [&](const char* name) { return gipa(inst, name); };
  uint32_t n = 1;
  VkPhysicalDevice phys = VK_NULL_HANDLE;
  reinterpret_cast<PFN_vkEnumeratePhysicalDevices>(fn("vkEnumeratePhysicalDevices"))(inst, &n, &phys);
  ASSERT_NE(phys, VK_NULL_HANDLE);
  const float priority = 1.f;
  VkDeviceQueueCreateInfo qci{};
  qci.sType = VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO;
  qci.queueFamilyIndex = 0;
  qci.queueCount = 1;
  qci.pQueuePriorities = &priority;
  VkDeviceCreateInfo dci{};
  dci.sType = VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO;
  dci.queueCreateInfoCount = 1;
  dci.pQueueCreateInfos = &qci;
  VkDevice dev = VK_NULL_HANDLE;
  ASSERT_EQ(reinterpret_cast<PFN_vkCreateDevice>(fn("vkCreateDevice"))(phys, &dci, nullptr, &dev), VK_SUCCESS);
  auto gdpa = reinterpret_cast<PFN_vkGetDeviceProcAddr>(fn("vkGetDeviceProcAddr"));
  VkBufferCreateInfo bci{};
  bci.sType = VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO;
  bci.size = 0;  // invalid: must be greater than 0
  bci.usage = VK_BUFFER_USAGE_STORAGE_BUFFER_BIT;
  VkBuffer buf = VK_NULL_HANDLE;
  ::testing::internal::CaptureStdout();
  ::testing::internal::CaptureStderr();
  reinterpret_cast<PFN_vkCreateBuffer>(gdpa(dev, "vkCreateBuffer"))(dev, &bci, nullptr, &buf);
  const std::string printed = ::testing::internal::GetCapturedStdout() + ::testing::internal::GetCapturedStderr();
  if (buf != VK_NULL_HANDLE) reinterpret_cast<PFN_vkDestroyBuffer>(gdpa(dev, "vkDestroyBuffer"))(dev, buf, nullptr);
  reinterpret_cast<PFN_vkDestroyDevice>(gdpa(dev, "vkDestroyDevice"))(dev, nullptr);
  reinterpret_cast<PFN_vkDestroyInstance>(fn("vkDestroyInstance"))(inst, nullptr);
  // Not printed again: ctest fails any output holding the phrase.
  EXPECT_NE(printed.find("Validation Error"), std::string::npos) << "the validation layer reported nothing";
  EXPECT_NE(printed.find("00912"), std::string::npos) << "not the expected report";
}

// The manual Vulkan schedules (every one must pass everything) and the autoscheduled GPU twins.
std::vector<std::string> vulkan_schedules(bool twins = false) {
  std::vector<std::string> names;
  for (const auto& s : pipeline::all_schedules()) {
    if (s.device == "vulkan" && s.autoscheduler.empty() != twins) names.push_back(s.name);
  }
  return names;
}

// Where Halide 21's GPU autoschedulers produce wrong kernels for this pipeline (measured on
// lavapipe under the validation layer, and on the H200's host; docs/vulkan.md). Each entry runs as
// an expected failure (expect_known_failure) of the kind it names: it fails the test the day it
// passes, or the day it fails another way.
enum FailureKind : unsigned {
  kRejectedByValidation = 1,  // the validation layer printed a "Validation Error"
  kWrongOutputs = 2,          // the outputs are off the float64 oracle
  kHalideError = 4,           // Halide refused the schedule (the error must contain `error_text`)
  kDriverRefused = 8,         // the Vulkan driver refused to build the kernel's pipeline
};

struct KnownFailure {
  const char* why;
  unsigned kinds;
  const char* error_text = "";
};

std::optional<KnownFailure> twin_known_failure(const std::string& twin, const std::string& kind) {
  static const std::set<std::string> anderson_invalid = {"gqa_causal_long_kv", "padding_duplicates", "negative_shared_pages",
                                                         "partial_block_topk_gt_blocks", "d72_block256_len232",
                                                         "custom_scale_large_logits", "blocks_beyond_len"};
  if (twin == "auto_anderson2021" && anderson_invalid.count(kind)) {
    return KnownFailure{"Anderson2021 emits SPIR-V the validation layer rejects "
                        "(UNASSIGNED-CoreValidation-Shader-InconsistentSpirv)", kRejectedByValidation};
  }
  if (twin == "auto_mullapudi2016_gpu" && kind == "tiny") {
    return KnownFailure{"Mullapudi2016's experimental GPU schedule gives wrong outputs here (every LSE wrong; lavapipe), "
                        "or a pipeline the driver refuses to build (the H200's NVIDIA driver)", kWrongOutputs | kDriverRefused};
  }
  if (twin == "auto_mullapudi2016_gpu" && kind == "d72_block256_len232") {
    return KnownFailure{"Mullapudi2016's experimental GPU schedule: wrong outputs, or on an AVX-512 host a schedule Halide "
                        "rejects (could not find var ... to reorder)", kWrongOutputs | kHalideError, "could not find var"};
  }
  // Mullapudi2016's GPU schedule at parallelism 16 (schedules/autoscheduler_params.txt): Halide
  // rejects it for these kinds, on every host (experiments/results/gpu/2026-12-05/mullapudi_gpu_parallelism.md).
  static const std::set<std::string> mullapudi_invalid = {"varlen_empty_seq_short_kv", "no_used_kv_lens_ragged_table",
                                                          "empty_rows", "blocks_beyond_len"};
  if (twin == "auto_mullapudi2016_gpu" && mullapudi_invalid.count(kind)) {
    return KnownFailure{"Mullapudi2016 emits a GPU schedule Halide rejects (could not find var ... to reorder)",
                        kHalideError, "could not find var"};
  }
  return std::nullopt;
}

void check(const std::string& backend_name, const std::string& schedule, const Inputs& in, const std::string& what,
           std::map<std::string, std::string> knobs = {}, int64_t batches = 1,
           const std::string& target = "host-vulkan") {
  experiments::register_all_backends();
  auto backend = BackendRegistry::instance().make({backend_name, schedule, std::move(knobs), target});
  PlanOptions opt = backend->plan_options();
  EXPECT_GT(opt.max_batch_partial_floats, 0) << "GPU backends plan within the device's buffer limit";
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
                         testing::ScheduleKindName());

std::vector<std::string> fitting_variants(const std::string& schedule, const std::string& target, const Inputs& in);

// The name of a schedule's generic Vulkan AOT variant in a storage dtype (exactly one is generated
// per schedule and dtype).
std::string generic_variant(const std::string& schedule, Dtype dtype = Dtype::kFloat32) {
  halide::register_generated_aot_kernels();
  std::string name;
  for (const auto& v : halide::aot_variants()) {
    if (v.schedule == schedule && v.target == "host-vulkan" && v.spec.dtype == dtype &&
        halide::aot_variant_is_generic(v.name)) {
      EXPECT_TRUE(name.empty()) << "two generic variants of " << schedule;
      name = v.name;
    }
  }
  EXPECT_FALSE(name.empty()) << "no generic Vulkan variant of " << schedule;
  return name;
}

// Lavapipe ends a shader's loops after 65535 iterations in all: a shape whose generic kernel
// loops longer is refused there with the reason, never run to a wrong result. Shapes near the
// limit (D 128, block 1024: about 4 x 10^4 iterations per thread; D 256, block 512) run and match.
TEST(Vulkan, GenericVariantOnLargeBlocks) {
  REQUIRE_VULKAN();
  for (auto [D, block, page] : std::vector<std::tuple<int, int, int>>{{128, 1024, 64}, {256, 512, 64}, {512, 4096, 256}}) {
    experiments::CaseSpec s;
    s.qo = {1};
    s.kv = {block + 88};
    s.causal = false;
    s.Hq = 2; s.Hkv = 1; s.D = D; s.block_size = block; s.page_size = page; s.topk = 2;
    const std::string what = "D " + std::to_string(D) + ", block " + std::to_string(block);
    const std::map<std::string, std::string> generic = {{"variant", generic_variant("vulkan_tiled")}};
    if (vulkan_devices().front().type == "cpu" && D == 512) {
      try {
        check("aot", "vulkan_tiled", experiments::make_case(s), what, generic);
        ADD_FAILURE() << what << " ran on a CPU Vulkan device past its loop limit";
      } catch (const BackendError& e) {
        EXPECT_NE(std::string(e.what()).find("65535"), std::string::npos) << e.what();
      }
      continue;
    }
    check("aot", "vulkan_tiled", experiments::make_case(s), what, generic);
  }
}

// The generic AOT variant of every Vulkan schedule (no shape specialised), by name, on every case
// kind: any valid input runs through `--backend aot --target host-vulkan`.
class VulkanAotGenericTest : public ::testing::TestWithParam<Param> {};

TEST_P(VulkanAotGenericTest, MatchesOracle) {
  REQUIRE_VULKAN();
  const auto& [schedule, kind] = GetParam();
  check("aot", schedule, experiments::make_case(kind.second), kind.first, {{"variant", generic_variant(schedule)}});
}

INSTANTIATE_TEST_SUITE_P(ScheduleXKind, VulkanAotGenericTest,
                         ::testing::Combine(::testing::ValuesIn(vulkan_schedules()),
                                            ::testing::ValuesIn(testing::case_kinds())),
                         testing::ScheduleKindName());

// 16-bit storage on Vulkan (float16 through vk_float16, bfloat16 as uint16 bits through vk_int16):
// every manual schedule through the JIT on every case kind in each 16-bit dtype, against the
// float64 oracle computed from the values.
void check_storage(const std::string& backend_name, const std::string& schedule, const std::pair<std::string, experiments::CaseSpec>& kind,
                   Dtype dtype, std::map<std::string, std::string> knobs = {}) {
  experiments::register_all_backends();
  auto backend = BackendRegistry::instance().make({backend_name, schedule, std::move(knobs), "host-vulkan"});
  testing::expect_storage_matches_oracle(*backend, kind, dtype, backend_name + " " + schedule);
}

using testing::StorageParam;
class VulkanStorageTest : public ::testing::TestWithParam<StorageParam> {};

TEST_P(VulkanStorageTest, JitMatchesOracle) {
  REQUIRE_VULKAN();
  const auto& [schedule, kind, dtype] = GetParam();
  check_storage("jit", schedule, kind, dtype);
}

INSTANTIATE_TEST_SUITE_P(ScheduleXKindXDtype, VulkanStorageTest,
                         ::testing::Combine(::testing::ValuesIn(vulkan_schedules()),
                                            ::testing::ValuesIn(testing::case_kinds()),
                                            ::testing::ValuesIn(testing::dtypes16())),
                         testing::ScheduleKindDtypeName());

// The generic 16-bit AOT variants (generated for vulkan_tiled and vulkan_onepass), by name.
TEST(Vulkan, SixteenBitGenericAotVariants) {
  REQUIRE_VULKAN();
  for (const auto& kind : testing::case_kinds()) {
    if (kind.first != "gqa_causal_long_kv" && kind.first != "empty_rows" && kind.first != "d72_block256_len232") continue;
    for (const char* schedule : {"vulkan_tiled", "vulkan_onepass"}) {
      for (Dtype t : testing::dtypes16()) check_storage("aot", schedule, kind, t, {{"variant", generic_variant(schedule, t)}});
    }
  }
}

// Without naming a variant, the most specific one that fits is chosen: the generic one for shapes
// no specialised variant covers (D 72, block 256 here).
TEST(Vulkan, AotPicksTheGenericVariantForAnUnspecialisedShape) {
  REQUIRE_VULKAN();
  experiments::register_all_backends();
  for (const auto& [name, spec] : testing::case_kinds()) {
    if (name != "d72_block256_len232") continue;
    const Inputs in = experiments::make_case(spec);
    for (const auto& schedule : vulkan_schedules()) {
      const auto fit = fitting_variants(schedule, "host-vulkan", in);
      ASSERT_FALSE(fit.empty()) << schedule;
      EXPECT_EQ(fit.front(), generic_variant(schedule));
      check("aot", schedule, in, name);
    }
  }
}

class VulkanTwinTest : public ::testing::TestWithParam<Param> {};

// A known failure runs like every other case, with the process's output captured: it must still
// fail, and in the way its entry names (a validation error, an error from Halide with its text, or
// outputs off the oracle). The day it passes, or fails another way, the test fails and asks for the
// entry to change.
void expect_known_failure(const std::string& twin, const std::pair<std::string, experiments::CaseSpec>& kind,
                          const KnownFailure& known) {
  // A failure that is the validation layer's rejection can only be seen with the layer on (ctest
  // turns it on; a run on a GPU machine may not have it).
  const char* layers = std::getenv("HL_VK_LAYERS");
  if (known.kinds == kRejectedByValidation &&
      (!layers || std::string(layers).find("VK_LAYER_KHRONOS_validation") == std::string::npos)) {
    GTEST_SKIP() << "known failure seen only by the validation layer, which HL_VK_LAYERS does not enable: " << known.why;
  }
  experiments::register_all_backends();
  const Inputs in = experiments::make_case(kind.second);
  std::string failure;
  unsigned seen = 0;
  ::testing::internal::CaptureStdout();
  ::testing::internal::CaptureStderr();
  try {
    auto backend = BackendRegistry::instance().make({"jit", twin, {}, "host-vulkan", true});  // compared below
    const Plan plan = make_plan(in, backend->plan_options());
    const auto err = experiments::compare_outputs(backend->run(plan, in), reference::dense_attention<double>(in, plan.problem));
    if (!err.ok()) {
      failure = "outputs off the oracle (max|out err| " + std::to_string(err.max_out_err) + ")";
      seen |= kWrongOutputs;
    }
  } catch (const BackendError& e) {
    failure = std::string("error: ") + e.what();
    if (failure.find(known.error_text) != std::string::npos) seen |= kHalideError;
    if (failure.find("Failed to create compute pipeline") != std::string::npos) seen |= kDriverRefused;
  }
  const std::string printed = ::testing::internal::GetCapturedStdout() + ::testing::internal::GetCapturedStderr();
  if (printed.find("Validation Error") != std::string::npos) {
    failure = "rejected by the validation layer";
    seen |= kRejectedByValidation;
  }
  EXPECT_FALSE(failure.empty()) << twin << " on " << kind.first << " now passes: remove it from twin_known_failure ("
                                << known.why << ")";
  if (!failure.empty()) {
    EXPECT_TRUE(seen & known.kinds) << twin << " on " << kind.first << " fails, but not as twin_known_failure says ("
                                    << known.why << "): " << failure.substr(0, 200) << " ... "
                                    << failure.substr(failure.size() > 200 ? failure.size() - 200 : 0);
    ::testing::Test::RecordProperty("expected_failure", failure.substr(0, 200));
    std::printf("expected failure (%s): %s\n", known.why, failure.substr(0, 200).c_str());
  }
}

TEST_P(VulkanTwinTest, MatchesOracle) {
  REQUIRE_VULKAN();
  const auto& [twin, kind] = GetParam();
  if (const auto known = twin_known_failure(twin, kind.first)) return expect_known_failure(twin, kind, *known);
  check("jit", twin, experiments::make_case(kind.second), kind.first);
}

// Through the registry (as `kvouter run` makes them), a GPU twin never returns a wrong result: its
// known wrong case is an error naming the defect, and an input too large for the oracle is refused
// before anything runs.
TEST(Vulkan, GpuTwinsNeverReturnAWrongResultSilently) {
  REQUIRE_VULKAN();
  experiments::register_all_backends();
  const auto kinds = testing::case_kinds();
  const auto tiny = std::find_if(kinds.begin(), kinds.end(), [](const auto& k) { return k.first == "tiny"; });
  ASSERT_NE(tiny, kinds.end());
  {
    const Inputs in = experiments::make_case(tiny->second);
    auto backend = BackendRegistry::instance().make({"jit", "auto_mullapudi2016_gpu", {}, "host-vulkan"});
    const Plan plan = make_plan(in, backend->plan_options());
    try {
      backend->run(plan, in);
      ADD_FAILURE() << "a wrong result was returned";
    } catch (const BackendError& e) {
      // Refused by the oracle check (lavapipe: the kernels run and are wrong), or by the driver
      // (the NVIDIA driver cannot build the pipeline: "failed to validate local memory"); an
      // error either way, never a result.
      const std::string what = e.what();
      EXPECT_TRUE(what.find("off the float64 oracle") != std::string::npos ||
                  what.find("Failed to create compute pipeline") != std::string::npos)
          << what;
    }
  }
  experiments::CaseSpec big;
  big.qo = {4096};
  big.kv = {32768};
  big.D = 16;
  big.benchmark_selection = true;
  const Inputs in = experiments::make_case(big);
  for (const char* twin : {"auto_mullapudi2016_gpu", "auto_anderson2021"}) {
    auto backend = BackendRegistry::instance().make({"jit", twin, {}, "host-vulkan"});
    const Plan plan = make_plan(in, backend->plan_options());
    try {
      backend->run(plan, in);
      ADD_FAILURE() << twin << " ran unchecked";
    } catch (const BackendError& e) {
      EXPECT_NE(std::string(e.what()).find("too large to check"), std::string::npos) << e.what();
    }
    EXPECT_EQ(backend->last_timing().compile_ms, 0.0) << "refused before compiling";
  }
}

INSTANTIATE_TEST_SUITE_P(TwinXKind, VulkanTwinTest,
                         ::testing::Combine(::testing::ValuesIn(vulkan_schedules(true)),
                                            ::testing::ValuesIn(testing::case_kinds())),
                         testing::ScheduleKindName());

// The SPIR-V stage sits in front of the driver for JIT and AOT kernels alike: every module they
// create passes through it (rewritten, or counted as kept), and the outputs still match the oracle
// under the validation layer. With KVOUTER_SPIRV_STAGE=off (ctest vulkan_spirv_stage_off) nothing
// passes through it and the outputs match as well. JIT and AOT are separate tests: a process that
// ran both Vulkan runtimes crashes at exit inside the validation layer (Halide's AOT runtime
// releasing its device; with or without the stage), which would fail the test after it passed.
// Whether the SPIR-V stage gives this device's modules DenormPreserve 32.
bool asks_denorm_preserve(const VulkanDevice& d) {
  return spirv::asks_denorm_preserve(d.api_version >= VK_API_VERSION_1_2, d.denorm_preserve_float32);
}

void expect_stage_rewrites(const std::string& backend) {
  experiments::CaseSpec s = experiments::named_shape("tiny");
  const Inputs in = experiments::make_case(s);
  const spirv::StageStats before = spirv::stage_stats();
  check(backend, "vulkan_onepass", in, "tiny through " + backend);
  const spirv::StageStats after = spirv::stage_stats();
  EXPECT_EQ(after.errors, before.errors);
  // This process's first Vulkan run created the device: without robustBufferAccess when that
  // switch is off (KVOUTER_VK_ROBUST_ACCESS), else with it.
  if (spirv::robust_access()) {
    EXPECT_EQ(after.devices_without_robust_access, 0);
  } else {
    EXPECT_GT(after.devices_without_robust_access, 0);
  }
  if (!spirv::stage_enabled()) {
    EXPECT_EQ(after.modules, before.modules) << "the stage is off";
    return;
  }
  // Forward and combine: at least two new modules (a first run compiles them), all rewritten.
  EXPECT_GE(after.modules - before.modules, 2);
  EXPECT_EQ(after.rewritten - before.rewritten, after.modules - before.modules);
  EXPECT_GE(after.non_writable - before.non_writable, 2 * (after.modules - before.modules));
  EXPECT_EQ(after.fences_kept, before.fences_kept);
  EXPECT_GT(after.barriers_removed - before.barriers_removed, 0) << "vulkan_onepass's forward has barriers";
  // DenormPreserve 32 on every module exactly when the device allows it and the switch
  // (KVOUTER_SPIRV_DENORMS) leaves it on.
  EXPECT_GT(after.devices_created, 0) << "the device was created through the stage's vkCreateDevice";
  bool allows = false;
  for (const auto& d : vulkan_devices()) allows = allows || asks_denorm_preserve(d);
  if (allows) {
    EXPECT_GT(after.devices_preserving_denorms, 0);
    EXPECT_EQ(after.denorm_preserve - before.denorm_preserve, after.modules - before.modules);
  } else {
    EXPECT_EQ(after.devices_preserving_denorms, 0);
    EXPECT_EQ(after.denorm_preserve, before.denorm_preserve);
  }
}

TEST(Vulkan, SpirvStageRewritesEveryJitModule) {
  REQUIRE_VULKAN();
  expect_stage_rewrites("jit");
}

TEST(Vulkan, SpirvStageRewritesEveryAotModule) {
  REQUIRE_VULKAN();
  expect_stage_rewrites("aot");
}

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

TEST(Vulkan, BackendsRunThroughTheDeviceCacheOnVariedShapes) {
  REQUIRE_VULKAN();
  // Every GPU run goes through the device cache and step runner (halide_kernels.cpp), the JIT's
  // with kernels and writers of libHalide's own runtime. Shapes in a row, in one process: Halide
  // 21's Vulkan allocator once handed a new array a freed region's smaller buffer object, and the
  // JIT's results on the later shapes came out empty (docs/vulkan.md limit 15).
  for (int D : {16, 32}) {
    for (int page : {4, 8}) {
      for (const char* T : {"1", "2"}) {
        for (int seqs : {1, 3}) {
          experiments::CaseSpec s;
          s.qo = seqs == 3 ? std::vector<int64_t>{5, 9, 3} : std::vector<int64_t>{5};
          s.kv = seqs == 3 ? std::vector<int64_t>{40, 90, 17} : std::vector<int64_t>{40};
          s.Hq = 4; s.Hkv = 2; s.D = D; s.block_size = 8; s.page_size = page; s.topk = 5;
          const std::string what = "D " + std::to_string(D) + ", page " + std::to_string(page) + ", T " + T + ", " +
                                   std::to_string(seqs) + " sequences";
          for (const char* backend : {"aot", "jit"}) check(backend, "vulkan_rows", experiments::make_case(s), what, {{"T", T}});
        }
      }
    }
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
    check("jit", schedule, experiments::make_case(s), "varlen in one batch", {{"T", "2"}}, 1);
    check("jit", schedule, experiments::make_case(s), "varlen in 3 batches", {{"T", "2"}}, 3);
  }
}

TEST(Vulkan, AotQueryBatchesMatchTheOracle) {
  REQUIRE_VULKAN();
  // The same batches through the generated kernels (the step runner's batches on the device).
  for (const auto& schedule : vulkan_schedules()) {
    experiments::CaseSpec s;
    s.qo = {5, 9, 3};
    s.kv = {40, 90, 17};
    s.Hq = 4; s.Hkv = 2; s.D = 16; s.block_size = 8; s.page_size = 4; s.topk = 5;
    check("aot", schedule, experiments::make_case(s), "varlen in 3 batches", {{"T", "2"}}, 3);
  }
}

TEST(Vulkan, KernelTimingRepeatsEveryBatchOnTheDevice) {
  REQUIRE_VULKAN();
  // The GPU benchmark's timing (uploads once, a warm-up, then repetitions back to back), over a
  // plan in query batches: every repetition re-runs each batch's kernels on its device buffers.
  // The backend is made as the benchmark makes it, not through the registry: made that way it
  // once skipped the Vulkan set-up Halide 21's allocator needs (all-zero outputs on lavapipe).
  halide::register_generated_aot_kernels();
  Inputs in = experiments::make_case(experiments::named_shape("tiny"));
  auto be = halide::make_aot_backend({"aot", "vulkan_tiled", {}, "host-vulkan"});
  PlanOptions opt = be->plan_options();
  const Plan whole = make_plan(in, opt);
  opt.max_batch_partial_floats = whole.tiles.num_partials() * whole.problem.qhead * (whole.problem.D + layout::kPartialExtra) / 3;
  const Plan plan = make_plan(in, opt);
  ASSERT_GT(plan.tiles.batch_tile_begin.size(), 2u);
  be->set_kernel_timing({3, 5.0});
  const Outputs got = be->run(plan, in);
  const RunTiming& t = be->last_timing();
  ASSERT_EQ(t.forward_all.size(), 3u);
  for (double ms : t.forward_all) EXPECT_GT(ms, 0.0);
  const auto err = experiments::compare_outputs(got, reference::dense_attention<double>(in, plan.problem));
  EXPECT_TRUE(err.ok()) << "max|out err| " << err.max_out_err << " max|lse err| " << err.max_lse_err;
}

TEST(Vulkan, TuneOnAVulkanTargetPicksAVulkanSchedule) {
  REQUIRE_VULKAN();
  // `kvouter tune --target host-vulkan`: Vulkan candidates only, each checked against the oracle
  // (the twins' known failures are rejected, not chosen), warmed, timed; the winner lands in the
  // database under the Vulkan target, where `kvouter run --target host-vulkan` looks it up.
  const auto dir = std::filesystem::temp_directory_path() / ("kvouter_vktune_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  experiments::TuneOptions opt;
  opt.shape = "tiny";
  opt.target = "host-vulkan";
  opt.db = (dir / "db.json").string();
  opt.log = (dir / "log.jsonl").string();
  opt.repeats = 2;
  opt.max_candidates = 4;
  opt.warmup_ms = 10;
  ASSERT_EQ(experiments::run_tune(opt), 0);
  std::ifstream log(opt.log);
  int trials = 0;
  for (std::string line; std::getline(log, line);) {
    if (line.empty()) continue;
    ++trials;
    const auto rec = nlohmann::json::parse(line);
    const pipeline::ScheduleInfo* info = pipeline::find_schedule(rec["schedule"].get<std::string>());
    ASSERT_NE(info, nullptr);
    EXPECT_EQ(info->device, "vulkan") << line;
  }
  EXPECT_EQ(trials, 4);
  const auto choice = experiments::lookup_tuned(experiments::make_case(experiments::named_shape("tiny")), "host-vulkan", opt.db);
  ASSERT_TRUE(choice.has_value());
  EXPECT_EQ(pipeline::find_schedule(choice->schedule)->device, "vulkan");
  EXPECT_FALSE(experiments::lookup_tuned(experiments::make_case(experiments::named_shape("tiny")), "host", opt.db).has_value());
  std::filesystem::remove_all(dir);
}

TEST(Vulkan, KnobsChangeTheScheduleNotTheResult) {
  REQUIRE_VULKAN();
  Inputs in = experiments::make_case(experiments::named_shape("tiny"));
  check("jit", "vulkan_tiled", in, "tiny T=4 rows=2 unroll=1", {{"T", "4"}, {"rows", "2"}, {"unroll", "1"}});
  check("jit", "vulkan_rows", in, "tiny rows=8 unroll=8", {{"rows", "8"}, {"unroll", "8"}});
  // vulkan_fused: chunks narrower than a warp, wider than one, not dividing the block (32), and
  // row groups not dividing the tile's rows.
  check("jit", "vulkan_fused", in, "tiny chunk=4 rows=3", {{"chunk", "4"}, {"rows", "3"}});
  check("jit", "vulkan_fused", in, "tiny chunk=12 rows=5 T=3", {{"chunk", "12"}, {"rows", "5"}, {"T", "3"}});
  experiments::CaseSpec narrow;  // D 16: room for chunks of a warp's width and more
  narrow.qo = {9, 4};
  narrow.kv = {150, 70};
  narrow.Hq = 4; narrow.Hkv = 2; narrow.D = 16; narrow.block_size = 64; narrow.page_size = 16; narrow.topk = 3;
  const Inputs d16 = experiments::make_case(narrow);
  check("jit", "vulkan_fused", d16, "D16 chunk=32 rows=2", {{"chunk", "32"}, {"rows", "2"}});
  check("jit", "vulkan_fused", d16, "D16 chunk=48 rows=4", {{"chunk", "48"}, {"rows", "4"}});
  // vulkan_onepass and vulkan_slices (the same kernel with V staged in slices and the statistics
  // reduced by several threads per row): row groups not dividing the tile's rows (the last group
  // shifted inwards), and register tiles of 1 and 8.
  for (const char* sched : {"vulkan_onepass", "vulkan_slices"}) {
    check("jit", sched, in, std::string(sched) + " tiny rows=5 unroll=2", {{"rows", "5"}, {"unroll", "2"}});
    check("jit", sched, in, std::string(sched) + " tiny rows=12 unroll=8", {{"rows", "12"}, {"unroll", "8"}});
    check("jit", sched, d16, std::string(sched) + " D16 rows=3 unroll=1", {{"rows", "3"}, {"unroll", "1"}});
    // vec: the scalar kernel, 2- and 4-wide tiles (also where the tile does not cover D 12 or the
    // block: scalar then), and K slices of 4, 8 and 16 channels (one not dividing D 12: lowered).
    check("jit", sched, in, std::string(sched) + " tiny vec=1 unroll=4", {{"vec", "1"}, {"unroll", "4"}});
    check("jit", sched, in, std::string(sched) + " tiny vec=2 unroll=4 slice=8", {{"vec", "2"}, {"unroll", "4"}, {"slice", "8"}});
    check("jit", sched, in, std::string(sched) + " tiny vec=4 unroll=8 slice=16",
          {{"vec", "4"}, {"unroll", "8"}, {"slice", "16"}});
    check("jit", sched, d16, std::string(sched) + " D16 rows=5 vec=4 unroll=4 slice=4",
          {{"rows", "5"}, {"vec", "4"}, {"unroll", "4"}, {"slice", "4"}});
    {
      experiments::CaseSpec odd = narrow;  // D 12, block 24: tiles of 8 cover neither
      odd.D = 12;
      odd.block_size = 24;
      odd.page_size = 8;
      const Inputs d12 = experiments::make_case(odd);
      check("jit", sched, d12, std::string(sched) + " D12 vec=4 unroll=8 slice=5", {{"vec", "4"}, {"unroll", "8"}, {"slice", "5"}});
      check("jit", sched, d12, std::string(sched) + " D12 vec=4 unroll=4", {{"vec", "4"}, {"unroll", "4"}});
    }
  }
  // A workgroup past 1024 threads is a compile error, not a lost device (measured on the H200:
  // VK_ERROR_DEVICE_LOST): D 128 with unroll 1 is 128 threads per row of 16.
  EXPECT_THROW(check("jit", "vulkan_onepass", in, "tiny rows=16 unroll=1", {{"rows", "16"}, {"unroll", "1"}}),
               BackendError);
  // The GEMM-stage schedules process a block as one chunk: a smaller chunk is a clear compile error.
  EXPECT_THROW(check("jit", "vulkan_tiled", in, "tiny chunk=16", {{"chunk", "16"}}), BackendError);
}

TEST(Vulkan, AotVariantsOnTheirShape) {
  REQUIRE_VULKAN();
  experiments::CaseSpec s = experiments::named_shape("prefill");  // D 128, page 16, block 64, qhead 8
  s.qo = {96};
  s.kv = {512};
  const Inputs in = experiments::make_case(s);
  for (const auto& schedule : vulkan_schedules()) check("aot", schedule, in, "prefill-like");
}

// A small case of a GPU shape's specialisation (D 128, page 64, block 128, qhead 16; the planner
// gives gpu-prefill T 16 and gpu-decode T 1), so that its AOT variants fit.
Inputs gpu_shape_like(const std::string& shape) {
  experiments::CaseSpec s = experiments::named_shape(shape);
  s.qo = shape == "gpu-prefill" ? std::vector<int64_t>{40} : std::vector<int64_t>{1, 1};
  s.kv = shape == "gpu-prefill" ? std::vector<int64_t>{700} : std::vector<int64_t>{1300, 700};
  return experiments::make_case(s);
}

// The generated variants of (schedule, target) that fit the case, by name.
std::vector<std::string> fitting_variants(const std::string& schedule, const std::string& target, const Inputs& in) {
  auto be = BackendRegistry::instance().make({"aot", schedule, {}, target});
  return halide::aot_fitting(schedule, target, make_plan(in, be->plan_options()));
}

// The shared memory one workgroup of an AOT variant allocates: its schedule's formula (the one
// the schedule allocates by and the tuner keeps candidates by), at the variant's knobs; 0 for a
// schedule without one (vulkan_tiled and vulkan_rows stage less than 32 KiB at every generated
// point, so the test below requires all of theirs to run everywhere).
int64_t variant_shared_bytes(const std::string& variant) {
  for (const auto& v : halide::aot_variants()) {
    if (v.name != variant) continue;
    const pipeline::ScheduleInfo* info = pipeline::find_schedule(v.schedule);
    if (!info || !info->shared_bytes) return 0;
    std::map<std::string, std::string> given;
    std::stringstream ss(v.knobs);
    for (std::string kv; std::getline(ss, kv, ',');) {
      if (const size_t eq = kv.find('='); eq != std::string::npos) given[kv.substr(0, eq)] = kv.substr(eq + 1);
    }
    pipeline::Knobs k;
    const auto knobs = halide::checked_knobs(given);
    k.chunk = std::stoi(knobs.at("chunk"));
    k.vec = std::stoi(knobs.at("vec"));
    k.rows = std::stoi(knobs.at("rows"));
    k.unroll = std::stoi(knobs.at("unroll"));
    k.slice = std::stoi(knobs.at("slice"));
    k = pipeline::resolve_knobs(k, Halide::Target("host-vulkan"));
    pipeline::KnobValues kv = {{"T", v.spec.T},
                               {"chunk", k.chunk == pipeline::kWholeBlock ? v.spec.block_size : k.chunk},
                               {"rows", k.rows},
                               {"unroll", k.unroll},
                               {"slice", k.slice}};
    if (given.count("vec")) kv["vec"] = k.vec;
    const pipeline::TuneShape ts{v.spec.D, v.spec.block_size, v.spec.page_size, v.spec.qhead, v.spec.T <= 1, 0};
    return info->shared_bytes(kv, ts);
  }
  ADD_FAILURE() << "no AOT variant " << variant;
  return 0;
}

// The kernels measured on the H200, on small cases of their specialisation (D 128, page 64,
// block 128, qhead 16; T 16 for gpu-prefill, T 1 for gpu-decode): every generated knob point
// (kvouter_gpu_bench --all-variants measures them there), each by name. A variant whose workgroup
// needs more shared memory than this device has (lavapipe allows 32 KiB, the H200 48 KiB) cannot
// run here: by its schedule's formula, it must then fail with a clear error naming shared memory,
// and every other variant must pass.
TEST(Vulkan, EveryAotVariantOfTheGpuShapes) {
  REQUIRE_VULKAN();
  experiments::register_all_backends();
  const int64_t shared = static_cast<int64_t>(vulkan_devices().front().max_shared_bytes);
  std::vector<std::string> too_big;
  for (const char* shape : {"gpu-prefill", "gpu-decode"}) {
    const Inputs in = gpu_shape_like(shape);
    for (const auto& schedule : vulkan_schedules()) {
      for (const auto& variant : fitting_variants(schedule, "host-vulkan", in)) {
        // The generic variants: every case kind in VulkanAotGenericTest (here minutes on lavapipe).
        if (halide::aot_variant_is_generic(variant)) continue;
        const std::string what = std::string(shape) + "-like " + variant;
        const int64_t need = variant_shared_bytes(variant);
        if (need <= shared) {
          check("aot", schedule, in, what, {{"variant", variant}});
          continue;
        }
        try {
          check("aot", schedule, in, what, {{"variant", variant}});
          ADD_FAILURE() << what << " needs " << need << " bytes of shared memory by its schedule's formula, more than this "
                        << "device's " << shared << ", yet it ran: the formula is wrong";
        } catch (const BackendError& e) {
          EXPECT_NE(std::string(e.what()).find("shared memory"), std::string::npos) << what << ": " << e.what();
          too_big.push_back(variant + " (" + std::to_string(need) + " bytes)");
        }
      }
    }
  }
  if (!too_big.empty()) {
    std::string names;
    for (const auto& n : too_big) names += " " + n;
    GTEST_SKIP() << "these need more than this device's " << shared / 1024
                 << " KiB of shared memory per workgroup and failed with a clear error (they run on the H200, 48 KiB):"
                 << names;
  }
}

// The same AOT kernels on Halide's CUDA target (PTX), where a CUDA device exists: on the GPU
// machine, not in CI (lavapipe is a Vulkan device only).
TEST(Cuda, AotVariantsOfTheGpuShapes) {
  std::string why;
  if (cuda_device_count(&why) == 0) GTEST_SKIP() << "no CUDA device: " << why;
  experiments::register_all_backends();
  for (const char* shape : {"gpu-prefill", "gpu-decode"}) {
    const Inputs in = gpu_shape_like(shape);
    for (const char* schedule : {"vulkan_fused", "vulkan_tiled", "vulkan_onepass", "vulkan_slices"}) {
      const auto names = fitting_variants(schedule, "host-cuda", in);
      EXPECT_FALSE(names.empty()) << schedule << " has a CUDA variant for " << shape;
      for (const auto& variant : names) {
        check("aot", schedule, in, std::string(shape) + "-like " + variant, {{"variant", variant}}, 1, "host-cuda");
      }
    }
  }
}

// K made of subnormals (case_kinds.h's with_subnormal_keys): a device that flushes subnormal
// inputs to zero gets uniform weights and is off the oracle. Every manual Vulkan schedule through
// the JIT, and on a CUDA device every schedule's fitting AOT kernels, in float32 and bfloat16.
Inputs subnormal_keys_case(Dtype dtype) {
  return testing::with_subnormal_keys(experiments::make_case(testing::case_kinds().front().second), dtype);
}

// Whether the outputs of (backend, schedule) on `in` match the float64 oracle.
bool matches_oracle(const std::string& backend_name, const std::string& schedule, const Inputs& in,
                    std::map<std::string, std::string> knobs, const std::string& target) {
  experiments::register_all_backends();
  auto backend = BackendRegistry::instance().make({backend_name, schedule, std::move(knobs), target});
  const Plan plan = make_plan(in, backend->plan_options());
  return experiments::compare_outputs(backend->run(plan, in), reference::dense_attention<double>(in, plan.problem)).ok();
}

// A known failure: the NVIDIA Vulkan driver flushes subnormal float32 values to zero in these
// kernels unless a module asks it to keep them (on an H100, 2026-12-05: every manual schedule, out
// off by 0.021; its CUDA kernels and lavapipe keep them;
// experiments/results/gpu/2026-12-05/gpu_tests_subnormal_h100.log). The SPIR-V stage asks
// (DenormPreserve 32) where the device allows it, unless KVOUTER_SPIRV_DENORMS=driver or the stage
// is off; that driver (580.159.04) does not allow it (shaderDenormPreserveFloat32 false,
// experiments/results/gpu/2026-12-06/gpu_tests_float_controls_h100.log). An expected failure
// there, which alarms when it starts to match.
bool driver_flushes_subnormals() {
  for (const auto& d : vulkan_devices()) {
    if (d.name.find("NVIDIA") != std::string::npos && !asks_denorm_preserve(d)) return true;
  }
  return false;
}

TEST(Vulkan, SubnormalKeysMatchTheOracle) {
  REQUIRE_VULKAN();
  const bool flushes = driver_flushes_subnormals();
  for (const auto& d : vulkan_devices()) {
    std::printf("%s: shaderDenormPreserveFloat32 %d, shaderDenormFlushToZeroFloat32 %d; DenormPreserve 32 %s\n",
                d.name.c_str(), d.denorm_preserve_float32, d.denorm_flush_float32,
                asks_denorm_preserve(d) ? "asked" : "not asked");
  }
  for (Dtype dtype : {Dtype::kFloat32, Dtype::kBFloat16}) {
    const Inputs in = subnormal_keys_case(dtype);
    for (const auto& schedule : vulkan_schedules()) {
      const bool ok = matches_oracle("jit", schedule, in, {}, "host-vulkan");
      if (flushes) {
        EXPECT_FALSE(ok) << schedule << " now keeps subnormals on this driver (" << dtype_name(dtype)
                         << "): remove driver_flushes_subnormals";
      } else {
        EXPECT_TRUE(ok) << schedule << " on subnormal K, " << dtype_name(dtype);
      }
    }
  }
}

TEST(Cuda, SubnormalKeysMatchTheOracle) {
  std::string why;
  if (cuda_device_count(&why) == 0) GTEST_SKIP() << "no CUDA device: " << why;
  experiments::register_all_backends();
  for (Dtype dtype : {Dtype::kFloat32, Dtype::kBFloat16}) {
    const Inputs in = subnormal_keys_case(dtype);
    size_t ran = 0;
    // Only the generic CUDA variants fit this shape (vulkan_onepass's and vulkan_slices').
    for (const char* schedule : {"vulkan_fused", "vulkan_tiled", "vulkan_onepass", "vulkan_slices"}) {
      for (const auto& variant : fitting_variants(schedule, "host-cuda", in)) {
        check("aot", schedule, in, std::string("subnormal K, ") + variant, {{"variant", variant}}, 1, "host-cuda");
        ++ran;
      }
    }
    EXPECT_GT(ran, 0u) << "no CUDA variant fits the subnormal case in " << dtype_name(dtype);
  }
}

TEST(Cuda, NoDeviceIsAClearError) {
  std::string why;
  if (cuda_device_count(&why) > 0) GTEST_SKIP() << "a CUDA device is present";
  experiments::register_all_backends();
  try {
    BackendRegistry::instance().make({"aot", "vulkan_fused", {}, "host-cuda"});
    FAIL() << "expected a BackendError";
  } catch (const BackendError& e) {
    EXPECT_NE(std::string(e.what()).find("no usable CUDA device"), std::string::npos) << e.what();
  }
  try {
    const std::string name = cuda_device_name();
    FAIL() << "a device name without a device: " << name;
  } catch (const BackendError& e) {
    EXPECT_NE(std::string(e.what()).find("no usable CUDA device"), std::string::npos) << e.what();
  }
}

// The device the benchmark's ratios are to: the driver's name of device 0, with a CUDA device.
TEST(Cuda, DeviceNameIsTheDrivers) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device (the GPU machine runs this)";
  EXPECT_NE(cuda_device_name().find("NVIDIA"), std::string::npos) << cuda_device_name();
}

TEST(Vulkan, CpuScheduleOnVulkanTargetIsAClearError) {
  experiments::register_all_backends();
  EXPECT_THROW(BackendRegistry::instance().make({"jit", "cpu_tiled", {}, "host-vulkan"}), BackendError);
  EXPECT_THROW(BackendRegistry::instance().make({"jit", "vulkan_tiled", {}, "host"}), BackendError);
}

}  // namespace
}  // namespace kvouter
