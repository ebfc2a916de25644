// The same pipelines through the AOT registry (kernels generated at build time): every generated
// manual schedule against the float64 oracle on every case kind (generic variants serve shapes no
// specialisation matches), the autoscheduled twins on the shape they were generated for, variant
// selection, and agreement with the JIT.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <set>
#include <sstream>

#include "case_kinds.h"
#include "cli_util.h"
#include "dense_eigen.h"
#include "kvouter/aot.h"
#include "kvouter/errors.h"
#include "kvouter/jit.h"
#include "registry.h"
#include "scratch_reuse.h"
#include "storage_check.h"
#include "schedule_registry.h"

namespace kvouter {
namespace {

std::unique_ptr<Backend> make(const std::string& backend, const std::string& schedule) {
  experiments::register_all_backends();
  return BackendRegistry::instance().make({backend, schedule, {}, ""});
}

std::vector<std::string> manual_aot_schedules() {
  experiments::register_all_backends();
  std::vector<std::string> names;
  for (const auto& v : halide::aot_variants()) {
    if (v.target == "host" && v.schedule.rfind("auto_", 0) != 0 && std::find(names.begin(), names.end(), v.schedule) == names.end()) {
      names.push_back(v.schedule);
    }
  }
  return names;
}

using Param = std::tuple<std::string, std::pair<std::string, experiments::CaseSpec>>;
class AotScheduleTest : public ::testing::TestWithParam<Param> {};

TEST_P(AotScheduleTest, MatchesOracle) {
  const auto& [schedule, kind] = GetParam();
  auto backend = make("aot", schedule);
  Inputs in = experiments::make_case(kind.second);
  const Plan plan = make_plan(in, backend->plan_options());
  const auto err = experiments::compare_outputs(backend->run(plan, in),
                                                reference::dense_attention<double>(in, plan.problem));
  EXPECT_TRUE(err.ok()) << schedule << " on " << kind.first << " (variant " << backend->params().at("variant")
                        << "): max|out err| " << err.max_out_err << " max|lse err| " << err.max_lse_err;
}

INSTANTIATE_TEST_SUITE_P(ScheduleXKind, AotScheduleTest,
                         ::testing::Combine(::testing::ValuesIn(manual_aot_schedules()),
                                            ::testing::ValuesIn(testing::case_kinds())),
                         testing::ScheduleKindName());

// 16-bit storage: every generated manual CPU schedule's variants in each 16-bit dtype on every case kind
// (the SPEC shapes' specialised variants on tiny's neighbours, the generic ones elsewhere).
using testing::StorageParam;
class AotStorageTest : public ::testing::TestWithParam<StorageParam> {};

TEST_P(AotStorageTest, MatchesOracle) {
  const auto& [schedule, kind, dtype] = GetParam();
  auto backend = make("aot", schedule);
  testing::expect_storage_matches_oracle(*backend, kind, dtype, "aot " + schedule);
  const std::string variant = backend->params().at("variant");
  EXPECT_NE(variant.find(dtype_name(dtype)), std::string::npos) << variant;
}

INSTANTIATE_TEST_SUITE_P(ScheduleXKindXDtype, AotStorageTest,
                         ::testing::Combine(::testing::ValuesIn(manual_aot_schedules()),
                                            ::testing::ValuesIn(testing::case_kinds()),
                                            ::testing::ValuesIn(testing::dtypes16())),
                         testing::ScheduleKindDtypeName());

// The SPEC decode and prefill shapes in 16 bits run their specialised variants; a schedule with no
// variant in a dtype says so.
TEST(Aot, SixteenBitShapesPickTheirVariants) {
  for (const char* shape : {"decode", "prefill"}) {
    experiments::CaseSpec s = experiments::named_shape(shape);
    s.qo.resize(std::min<size_t>(s.qo.size(), 2));  // two sequences: the same specialisation, smaller
    s.kv.resize(s.qo.size());
    for (auto& L : s.kv) L = std::min<int64_t>(L, 1024);
    for (auto& q : s.qo) q = std::min<int64_t>(q, 64);
    for (Dtype t : testing::dtypes16()) {
      s.dtype = t;
      const Inputs in = experiments::make_case(s);
      auto backend = make("aot", "cpu_tiled");
      const Plan plan = make_plan(in, backend->plan_options());
      const Inputs values = testing::values_only(in);
      const auto err = experiments::compare_outputs(backend->run(plan, in),
                                                    reference::dense_attention<double>(values, validate(values)));
      // The prefill variants take the 6 x 4 tile where the CPU they were generated for is x86 with
      // AVX-512 (pipeline::prefill_wide_tile; PrefillTileFollowsTheTargetsRegisters).
      const bool wide_tile = plan.tiles.T != 1 && std::any_of(halide::aot_variants().begin(), halide::aot_variants().end(),
                                                               [](const auto& v) {
                                                                 return v.schedule == "cpu_tiled" &&
                                                                        pipeline::prefill_wide_tile(Halide::Target(v.halide_target));
                                                               });
      const std::string want = std::string("kvouter_cpu_tiled_d128_p16_b64_q8_t") + (plan.tiles.T == 1 ? "1" : "16") +
                               (wide_tile ? "_rows_6_unroll_4" : "") + "_storage_" + dtype_name(t);
      EXPECT_EQ(backend->params().at("variant"), want) << shape;
      EXPECT_TRUE(err.ok()) << shape << " " << dtype_name(t) << ": " << err.max_out_err;
      try {
        auto twin = make("aot", "auto_li2018");
        twin->run(make_plan(in, twin->plan_options()), in);
        ADD_FAILURE() << "auto_li2018 has no " << dtype_name(t) << " variant, yet ran";
      } catch (const BackendError& e) {
        EXPECT_NE(std::string(e.what()).find("storage=" + dtype_name(t)), std::string::npos) << e.what();
      }
    }
  }
}

// CMake names every configuration as halide::variant_name does (kvouter export uses the latter).
TEST(Aot, VariantNamesFollowOneRule) {
  experiments::register_all_backends();
  ASSERT_FALSE(halide::aot_variants().empty());
  for (const auto& v : halide::aot_variants()) {
    std::vector<std::pair<std::string, std::string>> knobs;
    std::string rest = v.knobs;
    while (!rest.empty()) {
      const auto comma = rest.find(',');
      const std::string kv = rest.substr(0, comma);
      const auto eq = kv.find('=');
      ASSERT_NE(eq, std::string::npos) << v.name << ": " << v.knobs;
      knobs.emplace_back(kv.substr(0, eq), kv.substr(eq + 1));
      rest = comma == std::string::npos ? "" : rest.substr(comma + 1);
    }
    EXPECT_EQ(halide::variant_name(v.schedule, v.target, v.spec, knobs), v.name);
  }
}

// The block-as-one-chunk choice is stated once per schedule (its registry entry's one_chunk):
// CMake's list of one-chunk schedules gives exactly those specialised variants chunk kWholeBlock.
TEST(Aot, OneChunkSchedulesGetTheOneChunk) {
  experiments::register_all_backends();
  int one_chunk = 0;
  for (const auto& v : halide::aot_variants()) {
    const pipeline::ScheduleInfo* info = pipeline::find_schedule(v.schedule);
    ASSERT_NE(info, nullptr) << v.name;
    const bool has = ("," + v.knobs + ",").find(",chunk=" + std::to_string(pipeline::kWholeBlock) + ",") != std::string::npos;
    if (info->one_chunk && v.spec.D != 0) {
      EXPECT_TRUE(has) << v.name << ": " << v.knobs;
      ++one_chunk;
    } else {
      EXPECT_FALSE(has) << v.name << ": " << v.knobs;
    }
  }
  EXPECT_GT(one_chunk, 0);
}

// The CPU twins were generated with the autoscheduler parameters the JIT and export use.
TEST(Aot, TwinsWereGeneratedWithTheJitsAutoschedulerParameters) {
  experiments::register_all_backends();
  int twins = 0;
  for (const auto& v : halide::aot_variants()) {
    const pipeline::ScheduleInfo* info = pipeline::find_schedule(v.schedule);
    ASSERT_NE(info, nullptr) << v.name;
    if (info->autoscheduler.empty()) {
      EXPECT_EQ(v.autoscheduler_params, "") << v.name;
      continue;
    }
    ++twins;
    std::string want;
    for (const auto& [k, val] : halide::autoscheduler_params(info->autoscheduler, v.target != "host")) {
      want += (want.empty() ? "" : ",") + k + "=" + val;
    }
    // CMake lists them in its own order: compare as sets of k=v.
    auto parts = [](const std::string& s) {
      std::set<std::string> out;
      size_t at = 0;
      while (at < s.size()) {
        const size_t comma = s.find(',', at);
        out.insert(s.substr(at, comma == std::string::npos ? std::string::npos : comma - at));
        at = comma == std::string::npos ? s.size() : comma + 1;
      }
      return out;
    };
    EXPECT_EQ(parts(v.autoscheduler_params), parts(want)) << v.name;
  }
  EXPECT_GT(twins, 0);
}

// The JIT, `kvouter export` and CMake's AOT variants give the generators the same parameters
// (halide::generator_params): a parameter CMake leaves out must be the generator's default. The
// knob defaults come from kvouter/knobs.h on both sides, so a left-out knob passes by
// construction; what this catches is a parameter CMake gives differently or not at all (the
// shape, T, storage, the combine's vec/grain). The autoscheduler estimates are not compared: AOT
// variants carry no extents (v.spec.tq == 0), so CMake's twins take the generators' default
// estimates (SPEC prefill), where the JIT gives the plan's extents.
TEST(Aot, VariantsWereGeneratedWithTheJitsGeneratorParams) {
  auto to_map = [](const std::string& s) {
    std::map<std::string, std::string> out;
    size_t at = 0;
    while (at < s.size()) {
      const size_t comma = s.find(',', at);
      const std::string kv = s.substr(at, comma == std::string::npos ? std::string::npos : comma - at);
      const size_t eq = kv.find('=');
      if (eq != std::string::npos) out[kv.substr(0, eq)] = kv.substr(eq + 1);
      at = comma == std::string::npos ? s.size() : comma + 1;
    }
    return out;
  };
  std::map<std::string, std::string> defaults = halide::checked_knobs({});
  defaults["storage"] = "float32";
  auto same = [&](const std::map<std::string, std::string>& want, const std::map<std::string, std::string>& got,
                  const std::string& what) {
    for (const auto& [k, v] : got) {
      EXPECT_TRUE(want.count(k) && want.at(k) == v) << what << ": generated with " << k << "=" << v
                                                    << (want.count(k) ? ", the rule gives " + want.at(k) : ", not in the rule");
    }
    for (const auto& [k, v] : want) {
      if (got.count(k)) continue;
      EXPECT_TRUE(defaults.count(k) && defaults.at(k) == v)
          << what << ": the rule gives " << k << "=" << v << ", generated with the generator's default";
    }
  };
  int checked = 0;
  for (const auto& v : halide::aot_variants()) {
    ASSERT_FALSE(v.forward_params.empty()) << v.name;
    ASSERT_FALSE(v.combine_params.empty()) << v.name;
    const halide::GeneratorParams want =
        halide::generator_params(v.schedule, halide::checked_knobs(to_map(v.knobs)), v.spec);
    same(want.forward, to_map(v.forward_params), v.name + " forward");
    same(want.combine, to_map(v.combine_params), v.name + " combine");
    ++checked;
  }
  EXPECT_GT(checked, 50);
}

// CMake's AOT targets carry the features halide::storage_target adds for the variant's dtype (the
// JIT's and export's rule), and no 16-bit feature a float32 variant does not need.
TEST(Aot, VariantTargetsCarryTheStorageFeatures) {
  int checked = 0;
  for (const auto& v : halide::aot_variants()) {
    ASSERT_FALSE(v.halide_target.empty()) << v.name;
    const std::string added = halide::storage_target(v.target, v.spec.dtype).substr(v.target.size());
    const std::string& t = v.halide_target;
    EXPECT_TRUE(t.size() >= added.size() && t.compare(t.size() - added.size(), added.size(), added) == 0)
        << v.name << ": generated for " << t << ", the rule adds '" << added << "'";
    if (added.empty()) {
      EXPECT_EQ(t.find("vk_float16"), std::string::npos) << v.name << ": " << t;
      EXPECT_EQ(t.find("vk_int16"), std::string::npos) << v.name << ": " << t;
    }
    checked += !added.empty();
  }
  EXPECT_GT(checked, 4);  // the 16-bit Vulkan variants
}

// The SPEC prefill variants of cpu_tiled (each dtype) take the 6 x 4 register tile exactly where the CPU it was
// generated for is x86 with AVX-512 (pipeline::prefill_wide_tile, which generators/CMakeLists.txt asks
// about the AOT target through cmake/prefill_tile_probe.cpp). A variant that
// KVOUTER_AOT_EXTRA_CONFIGS adds with knobs of its own (say chunk=32) is not one of them.
TEST(Aot, PrefillTileFollowsTheTargetsRegisters) {
  // Knobs as registered: "k=v,..." (the storage dtype is in spec, not here).
  auto own_knobs = [](const std::string& knobs) {
    std::istringstream in(knobs);
    for (std::string kv; std::getline(in, kv, ',');) {
      if (kv.rfind("rows=", 0) != 0 && kv.rfind("unroll=", 0) != 0) return true;
    }
    return false;
  };
  std::set<Dtype> dtypes;
  for (const auto& v : halide::aot_variants()) {
    const halide::Specialization& s = v.spec;
    if (v.schedule != "cpu_tiled" || s.D != 128 || s.page_size != 16 || s.block_size != 64 || s.qhead != 8 ||
        s.T != 16 || own_knobs(v.knobs)) {
      continue;
    }
    const bool wide = pipeline::prefill_wide_tile(Halide::Target(v.halide_target));
    EXPECT_EQ(v.knobs.find("rows=6") != std::string::npos && v.knobs.find("unroll=4") != std::string::npos, wide)
        << v.name << " generated for " << v.halide_target << " with knobs '" << v.knobs << "'";
    dtypes.insert(s.dtype);
  }
  // Every dtype has its SPEC prefill variant (more than one each where KVOUTER_AOT_EXTRA_CONFIGS adds some).
  EXPECT_EQ(dtypes, (std::set<Dtype>{Dtype::kFloat32, Dtype::kFloat16, Dtype::kBFloat16}));
}

TEST(Aot, SpecialisedVariantChosenWhereItMatches) {
  auto backend = make("aot", "cpu_tiled");
  Inputs in = experiments::make_case(experiments::named_shape("tiny"));
  backend->run(make_plan(in, backend->plan_options()), in);
  EXPECT_EQ(backend->params().at("variant"), "kvouter_cpu_tiled_d128_p16_b32_q2_t16");
  in = experiments::make_case(testing::case_kinds()[0].second);
  backend->run(make_plan(in, backend->plan_options()), in);
  EXPECT_EQ(backend->params().at("variant"), "kvouter_cpu_tiled_generic");
}

TEST(Aot, AutoscheduledTwinsOnTheirShape) {
  // The twins are generated for the prefill specialisation (D 128, page 16, block 64, qhead 8, T 16).
  Inputs in = experiments::make_case(experiments::named_shape("prefill"));
  const Outputs ref = reference::dense_attention<double>(in, validate(in));
  for (const char* twin : {"auto_mullapudi2016", "auto_li2018", "auto_adams2019"}) {
    auto backend = make("aot", twin);
    const Plan plan = make_plan(in, backend->plan_options());
    const auto err = experiments::compare_outputs(backend->run(plan, in), ref);
    EXPECT_TRUE(err.ok()) << twin << ": " << err.max_out_err;
  }
  // Elsewhere there is no variant, and the error says so.
  auto backend = make("aot", "auto_li2018");
  Inputs small = experiments::make_case(testing::case_kinds()[0].second);
  EXPECT_THROW(backend->run(make_plan(small, backend->plan_options()), small), BackendError);
}

TEST(Aot, AgreesWithJit) {
  Inputs in = experiments::make_case(experiments::named_shape("tiny"));
  auto aot = make("aot", "cpu_tiled"), jit = make("jit", "cpu_tiled");
  const Plan plan = make_plan(in, aot->plan_options());
  const auto err = experiments::compare_outputs(aot->run(plan, in), jit->run(plan, in));
  EXPECT_TRUE(err.ok()) << err.max_out_err;
}

TEST(Aot, KernelScratchIsReusedAcrossTilesAndRuns) {
  auto aot = make("aot", "cpu_tiled");
  testing_scratch::expect_scratch_reused(*aot);
}

TEST(Aot, UnknownScheduleOrKnobIsAClearError) {
  EXPECT_THROW(make("aot", "cpu_nonexistent"), BackendError);
  experiments::register_all_backends();
  EXPECT_THROW(BackendRegistry::instance().make({"aot", "cpu_tiled", {{"chunk", "32"}}, ""}), BackendError);
}

TEST(Aot, VariantByName) {
  experiments::register_all_backends();
  auto& reg = BackendRegistry::instance();
  Inputs in = experiments::make_case(experiments::named_shape("tiny"));
  const Outputs ref = reference::dense_attention<double>(in, validate(in));
  // The generic variant, by name, where the specialised one would otherwise be chosen.
  auto generic = reg.make({"aot", "cpu_tiled", {{"variant", "kvouter_cpu_tiled_generic"}}, ""});
  const Plan plan = make_plan(in, generic->plan_options());
  EXPECT_EQ(halide::aot_fitting("cpu_tiled", "host", plan).front(), "kvouter_cpu_tiled_d128_p16_b32_q2_t16");
  EXPECT_TRUE(experiments::compare_outputs(generic->run(plan, in), ref).ok());
  EXPECT_EQ(generic->params().at("variant"), "kvouter_cpu_tiled_generic");
  // Unknown, another schedule's, or not fitting the plan: clear errors.
  EXPECT_THROW(reg.make({"aot", "cpu_tiled", {{"variant", "kvouter_nonexistent"}}, ""}), BackendError);
  EXPECT_THROW(reg.make({"aot", "cpu_tiled", {{"variant", "kvouter_cpu_simple_generic"}}, ""}), BackendError);
  auto decode = reg.make({"aot", "cpu_tiled", {{"variant", "kvouter_cpu_tiled_d128_p16_b64_q8_t1"}}, ""});
  EXPECT_THROW(decode->run(make_plan(in, decode->plan_options()), in), BackendError);
}

TEST(Aot, KernelTimingRepeatsTheKernelsOnTheSameBuffers) {
  experiments::register_all_backends();
  Inputs in = experiments::make_case(experiments::named_shape("tiny"));
  const Outputs ref = reference::dense_attention<double>(in, validate(in));
  auto be = BackendRegistry::instance().make({"aot", "cpu_tiled", {}, ""});
  const Plan plan = make_plan(in, be->plan_options());
  const Outputs once = be->run(plan, in);
  ASSERT_EQ(be->last_timing().forward_all.size(), 1u);
  be->set_kernel_timing({5, 20.0});
  const auto t0 = std::chrono::steady_clock::now();
  const Outputs again = be->run(plan, in);
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  const RunTiming& t = be->last_timing();
  ASSERT_EQ(t.forward_all.size(), 5u);
  ASSERT_EQ(t.combine_all.size(), 5u);
  EXPECT_GE(ms, 20.0) << "the warm-up runs the kernels for at least warmup_ms";
  std::vector<double> f = t.forward_all;
  std::sort(f.begin(), f.end());
  EXPECT_EQ(t.forward_ms, f[2]) << "forward_ms is the median repetition";
  EXPECT_TRUE(experiments::compare_outputs(again, ref).ok());
  EXPECT_EQ(again.out.data, once.out.data) << "repeating the kernels on the same buffers changes nothing";
  EXPECT_EQ(again.lse.data, once.lse.data);
}

}  // namespace
}  // namespace kvouter
