// The tuner: the keep() predicate, the search space, a short real tuning run with its log and
// database, resuming, and the database look-up the CLI's default choice uses.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <regex>
#include <set>
#include <string>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "case_gen.h"
#include "schedules.h"
#include "tuner.h"
#include "registry.h"
#include "kvouter/jit.h"

namespace kvouter::experiments {
namespace {

ShapeClass prefill_class() { return ShapeClass::of(make_case(named_shape("prefill"))); }

TEST(Tuner, ShapeClassNamesTheSpecialisation) {
  EXPECT_EQ(prefill_class().name, "D128_b64_p16_q8_prefill");
  EXPECT_EQ(ShapeClass::of(make_case(named_shape("decode"))).name, "D128_b64_p16_q8_decode");
}

TEST(Tuner, KeepFiltersTheSpace) {
  const ShapeClass s = prefill_class();
  auto c = [](std::string sched, std::string T, std::string chunk, std::string rows, std::string unroll) {
    return Candidate{sched, {{"T", T}, {"chunk", chunk}, {"rows", rows}, {"unroll", unroll}}};
  };
  EXPECT_TRUE(keep(c("cpu_tiled", "16", "64", "2", "4"), s, "host"));
  EXPECT_FALSE(keep(c("cpu_tiled", "16", "128", "2", "4"), s, "host"));  // chunk past the block
  // Accumulators: at most three quarters of the target's vector registers (32 with AVX-512,
  // 16 with AVX2).
  const std::string avx512 = "x86-64-linux-avx-avx2-avx512-f16c-fma-sse41", avx2 = "x86-64-linux-avx-avx2-f16c-fma-sse41";
  EXPECT_TRUE(keep(c("cpu_tiled", "16", "64", "6", "4"), s, avx512));   // 24 of 32
  EXPECT_FALSE(keep(c("cpu_tiled", "16", "64", "8", "4"), s, avx512));  // 32 of 32
  EXPECT_TRUE(keep(c("cpu_tiled", "16", "64", "6", "2"), s, avx2));     // 12 of 16
  EXPECT_FALSE(keep(c("cpu_tiled", "16", "64", "4", "4"), s, avx2));    // 16 of 16
  EXPECT_TRUE(keep(c("cpu_tiled", "16", "64", "4", "4"), s, "arm-64-linux"));  // 16 of NEON's 32
  // Schedules that pin the knobs they do not read keep their pinned point on every target, and
  // cpu_rowstream's unrolled row blocks take at most a quarter of the registers.
  EXPECT_TRUE(keep(c("cpu_simple", "16", "64", "4", "4"), s, avx2));
  EXPECT_TRUE(keep(c("cpu_rowstream", "16", "64", "4", "4"), s, avx2));
  EXPECT_FALSE(keep(c("cpu_rowstream", "16", "64", "6", "4"), s, avx2));
  EXPECT_TRUE(keep(c("cpu_rowstream", "16", "64", "8", "4"), s, avx512));
  EXPECT_FALSE(keep(c("cpu_simple", "16", "64", "2", "4"), s, "host"));  // knob it ignores
  EXPECT_FALSE(keep(c("cpu_tiled", "2", "64", "4", "4"), s, "host"));    // tiny tiles on prefill
  EXPECT_TRUE(keep(Candidate{"auto_li2018", {}}, s, "host"));
  const auto space = tuning_space(s, "host");
  std::set<std::string> keys;
  for (const auto& cand : space) {
    EXPECT_TRUE(keys.insert(cand.key()).second) << "duplicate " << cand.key();
    EXPECT_TRUE(keep(cand, s, "host"));
  }
  EXPECT_TRUE(keys.count("auto_adams2019"));
  EXPECT_TRUE(keys.count("cpu_tiled,T=16,chunk=64,rows=2,unroll=4"));
  EXPECT_GT(space.size(), 20u);
}

// Every generated Vulkan kernel whose .stmt name matches `name`: `check(file, match, floats)`
// with the shared memory (in floats) its launch asks for. Returns how many matched.
int for_each_generated_kernel(const std::regex& name,
                              const std::function<void(const std::string&, const std::smatch&, long)>& check) {
  int checked = 0;
  for (const auto& entry : std::filesystem::directory_iterator(KVOUTER_GENERATED_DIR)) {
    const std::string file = entry.path().filename().string();
    std::smatch m;
    if (!std::regex_match(file, m, name)) continue;
    std::ifstream in(entry.path(), std::ios::binary);
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const size_t run = text.find("halide_vulkan_run(");
    const size_t size = run == std::string::npos ? run : text.find(", 0 + (", run);
    if (size == std::string::npos) {
      ADD_FAILURE() << file << ": no launch with shared memory";
      continue;
    }
    check(file, m, std::stol(text.substr(size + 7)));
    ++checked;
  }
  return checked;
}

// Every generated vulkan_onepass kernel: the shared memory its launch asks for (in its .stmt,
// beside it) against the estimate keep() prunes with.
TEST(Tuner, OnepassSharedMemoryIsWhatHalideAllocates) {
  const std::regex name(
      R"(kvouter_vulkan_onepass_d(\d+)_p\d+_b(\d+)_q(\d+)_t(\d+)_host_vulkan_chunk_\d+_rows_(\d+)(?:_unroll_\d+)?(?:_vec_\d+)?(?:_slice_(\d+))?_fwd\.stmt)");
  const int checked = for_each_generated_kernel(name, [](const std::string& file, const std::smatch& m, long floats) {
    const int D = std::stoi(m[1]), block = std::stoi(m[2]), rows = std::min(std::stoi(m[5]), std::stoi(m[3]) * std::stoi(m[4]));
    const int slice = m[6].matched ? std::stoi(m[6]) : 0;
    EXPECT_EQ(pipeline::vulkan_onepass_shared_bytes(rows, D, block, slice), 4 * floats) << file;
  });
  EXPECT_GE(checked, 6) << "the generated vulkan_onepass kernels in " << KVOUTER_GENERATED_DIR;
}

// Every generated vulkan_slices kernel at the automatic slice: likewise.
TEST(Tuner, SlicesSharedMemoryIsWhatHalideAllocates) {
  const std::regex name(
      R"(kvouter_vulkan_slices_d(\d+)_p\d+_b(\d+)_q(\d+)_t(\d+)_host_vulkan_chunk_\d+_rows_(\d+)(?:_unroll_(\d+))?(?:_vec_\d+)?(?:_storage_\w+)?_fwd\.stmt)");
  const int checked = for_each_generated_kernel(name, [](const std::string& file, const std::smatch& m, long floats) {
    const int D = std::stoi(m[1]), block = std::stoi(m[2]), rows = std::min(std::stoi(m[5]), std::stoi(m[3]) * std::stoi(m[4]));
    const int unroll = m[6].matched ? std::stoi(m[6]) : 4;  // the GPU default (resolve_knobs)
    EXPECT_EQ(pipeline::vulkan_slices_shared_bytes(rows, unroll, D, block), 4 * floats) << file;
  });
  EXPECT_GE(checked, 4) << "the generated vulkan_slices kernels in " << KVOUTER_GENERATED_DIR;
  // At the GPU shapes (D 128, block 128, rows 16) it stays within the H200's 48 KiB.
  EXPECT_EQ(pipeline::vulkan_slices_shared_bytes(16, 4, 128, 128), 4 * 10448);
  EXPECT_EQ(pipeline::vulkan_slices_shared_bytes(8, 4, 128, 64), 4 * 4712);
  EXPECT_EQ(pipeline::vulkan_slices_key_slice(128, 128), 16);
  EXPECT_EQ(pipeline::vulkan_slices_value_slice(128, 128, 16), 16);
}

TEST(Tuner, VulkanTargetsTuneTheVulkanSchedules) {
  const ShapeClass s = prefill_class();
  auto c = [](std::string sched, std::string chunk, std::string rows, std::string unroll) {
    return Candidate{sched, {{"T", "0"}, {"chunk", chunk}, {"rows", rows}, {"unroll", unroll}}};
  };
  EXPECT_TRUE(keep(c("vulkan_tiled", "0", "4", "4"), s, "host-vulkan"));
  EXPECT_FALSE(keep(c("vulkan_tiled", "0", "4", "4"), s, "host"));     // a GPU schedule on the CPU
  EXPECT_FALSE(keep(c("cpu_tiled", "64", "4", "4"), s, "host-vulkan"));   // a CPU schedule on Vulkan
  EXPECT_FALSE(keep(c("vulkan_tiled", "64", "4", "4"), s, "host-vulkan"));  // the block must be one chunk
  ShapeClass big = s;  // chunk 0 is the whole block at any block size; no fixed chunk covers every block
  big.block_size = 8192;
  EXPECT_TRUE(keep(c("vulkan_tiled", "0", "4", "4"), big, "host-vulkan"));
  EXPECT_FALSE(keep(c("vulkan_tiled", "4096", "4", "4"), big, "host-vulkan"));
  EXPECT_FALSE(keep(c("vulkan_rows", "0", "8", "8"), s, "host-vulkan"));  // 64 accumulators
  // vulkan_fused's shared memory at D 128: chunk 8, rows 8 is 24 KiB; rows 16 is 40 KiB, which
  // fits the H200's 48 KiB but not lavapipe's 32 KiB.
  EXPECT_TRUE(keep(c("vulkan_fused", "8", "8", "4"), s, "host-vulkan"));
  EXPECT_FALSE(keep(c("vulkan_fused", "8", "16", "4"), s, "host-vulkan"));
  EXPECT_TRUE(keep(c("vulkan_fused", "8", "16", "4"), s, "host-vulkan", 48 * 1024));
  EXPECT_FALSE(keep(c("vulkan_fused", "8", "8", "2"), s, "host-vulkan"));  // a knob it ignores
  EXPECT_EQ(pipeline::vulkan_fused_shared_bytes(8, 128, 16), 32800);  // as Halide allocated it (lavapipe)
  EXPECT_FALSE(keep(c("vulkan_fused", "16", "8", "4"), s, "host-vulkan"));  // 32 bytes over lavapipe's
  // vulkan_onepass's at D 128, block 64 (schedules/vulkan_onepass.cpp): rows 16 is 28.8 KiB,
  // rows 32 is 49.1 KiB (fits neither); at block 128, rows 16 is 40.8 KiB (the H200 only).
  EXPECT_EQ(pipeline::vulkan_onepass_shared_bytes(16, 128, 128), 4 * 10448);  // as Halide allocated it
  EXPECT_EQ(pipeline::vulkan_onepass_shared_bytes(16, 128, 128, 8), 4 * 7344);  // 8-channel slices (generated)
  EXPECT_EQ(pipeline::vulkan_onepass_shared_bytes(12, 128, 128, 16), 4 * 6780);
  EXPECT_EQ(pipeline::vulkan_onepass_slice(12, 24, 5), 4);  // lowered to a divisor of D
  EXPECT_TRUE(keep(c("vulkan_onepass", "0", "16", "8"), s, "host-vulkan"));
  EXPECT_FALSE(keep(c("vulkan_onepass", "0", "32", "4"), s, "host-vulkan", 48 * 1024));
  EXPECT_FALSE(keep(c("vulkan_onepass", "64", "8", "4"), s, "host-vulkan"));  // the block must be one chunk
  ShapeClass g = s;
  g.block_size = 128;
  EXPECT_FALSE(keep(c("vulkan_onepass", "0", "16", "4"), g, "host-vulkan"));
  EXPECT_TRUE(keep(c("vulkan_onepass", "0", "16", "4"), g, "host-vulkan", 48 * 1024));
  // Rows past the tile's (T x qhead = 8) rows would be the same program.
  ShapeClass dec = s;
  dec.decode = true;
  auto decode_rows = [](const char* rows) {
    return Candidate{"vulkan_onepass", {{"T", "1"}, {"chunk", "0"}, {"rows", rows}, {"unroll", "4"}}};
  };
  ASSERT_EQ(dec.qhead, 8);
  EXPECT_TRUE(keep(decode_rows("8"), dec, "host-vulkan"));
  EXPECT_FALSE(keep(decode_rows("16"), dec, "host-vulkan"));
  // vulkan_onepass's vector width: the per-target default and the scalar kernel are both tried.
  EXPECT_TRUE(keep(Candidate{"vulkan_onepass", {{"T", "0"}, {"chunk", "0"}, {"rows", "8"}, {"unroll", "4"}, {"vec", "1"}}},
                   s, "host-vulkan"));
  std::set<std::string> keys, schedules;
  int scalar_onepass = 0;
  for (const auto& cand : tuning_space(s, "host-vulkan")) {
    if (cand.schedule == "vulkan_onepass" && cand.knobs.count("vec")) ++scalar_onepass;
    EXPECT_TRUE(keys.insert(cand.key()).second) << "duplicate " << cand.key();
    schedules.insert(cand.schedule);
  }
  EXPECT_EQ(schedules, (std::set<std::string>{"vulkan_tiled", "vulkan_rows", "vulkan_fused", "vulkan_onepass",
                                              "vulkan_slices", "auto_anderson2021", "auto_mullapudi2016_gpu"}));
  EXPECT_TRUE(keys.count("vulkan_tiled,T=0,chunk=0,rows=4,unroll=4"));
  EXPECT_TRUE(keys.count("vulkan_fused,T=16,chunk=8,rows=8,unroll=4"));
  EXPECT_GT(scalar_onepass, 0);
  EXPECT_TRUE(keys.count("vulkan_onepass,T=0,chunk=0,rows=8,unroll=4,vec=1")) << "key format";
}

TEST(Tuner, UntunedDefaultIsTheShapeClassDefaultAndInTheSpace) {
  // The point a sampled tune always measures is what `kvouter run` runs without the database:
  // cpu_decode with its registry defaults for a decode step, cpu_tiled for anything else.
  const std::string host = halide::resolve_target("host");
  const pipeline::Knobs def = pipeline::resolve_knobs({}, Halide::Target(host));
  CaseSpec step;
  step.qo = {1, 1, 1};
  step.kv = {40, 17, 64};
  step.Hq = 8;
  step.block_size = 16;
  const Inputs decode = make_case(step);
  const ShapeClass dc = ShapeClass::of(decode);
  ASSERT_TRUE(dc.decode);
  const Candidate d = untuned_default(decode, dc, "host");
  EXPECT_EQ(d.key(), "cpu_decode,T=0,ahead=1,chunk=16,rows=4,unroll=2");
  const Inputs prefill = make_case(named_shape("tiny"));
  const ShapeClass pc = ShapeClass::of(prefill);
  const Candidate p = untuned_default(prefill, pc, "host");
  EXPECT_EQ(p.key(), Candidate({"cpu_tiled", {{"T", "0"}, {"chunk", "32"}, {"rows", std::to_string(def.rows)},
                                               {"unroll", std::to_string(def.unroll)}}})
                         .key());
  for (const auto& [c, shape] : {std::pair{d, dc}, std::pair{p, pc}}) {
    bool found = false;
    for (const auto& cand : tuning_space(shape, "host")) found = found || cand.key() == c.key();
    EXPECT_TRUE(found) << c.key() << " is not in the tuning space";
  }
}

TEST(Tuner, ShortRunWritesLogAndDatabaseAndResumes) {
  const auto dir = std::filesystem::temp_directory_path() / ("kvouter_tune_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  TuneOptions opt;
  opt.shape = "tiny";
  opt.db = (dir / "db.json").string();
  opt.log = (dir / "log.jsonl").string();
  opt.repeats = 2;
  opt.max_candidates = 3;
  ASSERT_EQ(run_tune(opt), 0);
  {
    // A sample of the space holds the untuned default's own point: a sampled winner is never
    // slower than the default it replaces.
    // (tiny's block is 32 positions: the default chunk of 64 is the whole block, 32.)
    const pipeline::Knobs def = pipeline::resolve_knobs({}, Halide::Target(halide::resolve_target("host")));
    const std::string want = Candidate{default_cpu_schedule(), {{"T", "0"}, {"chunk", "32"},
                                                                {"rows", std::to_string(def.rows)},
                                                                {"unroll", std::to_string(def.unroll)}}}.key();
    std::ifstream f(opt.log);
    std::string seen;
    for (std::string l; std::getline(f, l);) {
      if (!l.empty()) seen += nlohmann::json::parse(l).value("candidate", "") + "; ";
    }
    EXPECT_NE(seen.find(want + ";"), std::string::npos) << want << " not among the sampled candidates: " << seen;
  }
  auto lines = [&] {
    std::ifstream f(opt.log);
    int n = 0;
    for (std::string l; std::getline(f, l);) n += !l.empty();
    return n;
  };
  EXPECT_EQ(lines(), 3);
  ASSERT_EQ(run_tune(opt), 0);  // everything is in the log: nothing runs again
  EXPECT_EQ(lines(), 3);
  {
    // The same log as if carried from another machine: its trials count for nothing here, and
    // all three run again.
    std::ifstream in(opt.log);
    std::vector<std::string> carried;
    for (std::string l; std::getline(in, l);) {
      if (l.empty()) continue;
      auto r = nlohmann::json::parse(l);
      r["machine"] = "another machine";
      carried.push_back(r.dump());
    }
    in.close();
    std::ofstream out(opt.log, std::ios::trunc);
    for (const auto& l : carried) out << l << "\n";
  }
  ASSERT_EQ(run_tune(opt), 0);
  EXPECT_EQ(lines(), 6);
  const auto choice = lookup_tuned(make_case(named_shape("tiny")), "host", opt.db);
  ASSERT_TRUE(choice.has_value());
  EXPECT_FALSE(choice->schedule.empty());
  EXPECT_GT(choice->median_ms, 0);
  EXPECT_FALSE(lookup_tuned(make_case(named_shape("decode")), "host", opt.db).has_value());
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace kvouter::experiments

namespace kvouter::experiments {
namespace {

// The committed database's GPU entries: one per GPU shape class on the device it was measured on,
// each naming a registered Vulkan schedule and the committed result file it was taken from.
TEST(Tuner, CommittedDatabaseHoldsTheH200DefaultsWithTheirSources) {
  const std::string root = KVOUTER_TEST_SOURCE_DIR;
  std::ifstream f(root + "/experiments/results/tuning_db.json");
  ASSERT_TRUE(f);
  const auto db = nlohmann::json::parse(f);
  for (const char* shape : {"gpu-decode", "gpu-prefill"}) {
    CaseSpec s = named_shape(shape);  // a small case of the same class (D, block, page, qhead, decode)
    s.qo = std::string(shape) == "gpu-decode" ? std::vector<int64_t>{1, 1} : std::vector<int64_t>{600};
    s.kv = {700, 700};
    if (s.qo.size() == 1) s.kv = {700};
    const std::string key = ShapeClass::of(make_case(s)).name + "|host-vulkan|NVIDIA H200|halide-21.0.0";
    ASSERT_TRUE(db["entries"].contains(key)) << key;
    const auto& e = db["entries"][key];
    const pipeline::ScheduleInfo* info = pipeline::find_schedule(e["schedule"].get<std::string>());
    ASSERT_NE(info, nullptr);
    EXPECT_EQ(info->device, "vulkan");
    const std::string source = e["source"].get<std::string>();
    const std::string file = source.substr(0, source.find(' '));
    EXPECT_TRUE(std::filesystem::exists(root + "/" + file)) << file;
  }
}

}  // namespace
}  // namespace kvouter::experiments
