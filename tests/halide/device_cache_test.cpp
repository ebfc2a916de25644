// The device-resident KV cache and its step runner (kvouter/device_cache.h) on every GPU target
// present: on Vulkan (lavapipe in CI, under the validation layer) and on CUDA where a device
// exists. An engine's decode loop writes its pages in place, appends one token per sequence per
// step and picks a new selection every step; each step is checked against the float64 oracle.
#include <gtest/gtest.h>

#include <numeric>
#include <random>
#include <thread>

#include "case_gen.h"
#include "case_kinds.h"
#include "cli_util.h"
#include "dense_eigen.h"
#include "kvouter/aot.h"
#include "kvouter/aot_kernels.h"
#include "kvouter/cuda_probe.h"
#include "kvouter/device_cache.h"
#include "kvouter/errors.h"
#include "kvouter/jit.h"
#include "kvouter/vulkan_probe.h"
#include "kvouter/vulkan_readback.h"
#include "vulkan_required.h"

namespace kvouter {
namespace {

using halide::DeviceCacheShape;
using halide::DeviceKvCache;
using halide::DeviceStepRunner;
using halide::StepInputs;

// "" when the target has a device here, else the reason it does not.
std::string missing_device(const std::string& target) {
  std::string why;
  if (is_vulkan_target(target)) return vulkan_devices(&why).empty() ? "no Vulkan device: " + why : "";
  return cuda_device_count(&why) == 0 ? "no CUDA device: " + why : "";
}

#define REQUIRE_DEVICE(target)                                          \
  do {                                                                  \
    halide::register_generated_aot_kernels();                           \
    const std::string why_missing = missing_device(target);             \
    if (why_missing.empty()) break;                                     \
    if (is_vulkan_target(target)) KVOUTER_NO_VULKAN(why_missing);       \
    GTEST_SKIP() << why_missing;                                        \
  } while (0)

// x rounded to the dtype, and its bits (16-bit dtypes).
float stored_as(Dtype dtype, float x, uint16_t* bits) {
  if (dtype == Dtype::kFloat16) return half_to_float(*bits = float_to_half(x));
  if (dtype == Dtype::kBFloat16) return bf16_to_float(*bits = float_to_bf16(x));
  return x;
}

// An engine with a host mirror of its pool (for the oracle) and the same pages on the device.
struct Engine {
  static constexpr int64_t B = 3, Hq = 4, Hkv = 2, D = 32, page = 4, block = 8, topk = 3, max_pages = 8;
  static constexpr int64_t pool_pages = B * max_pages + 5;
  Inputs host;  // values (and bits, 16-bit) of everything; K/V mirror the device pool
  std::vector<int32_t> lens = std::vector<int32_t>(B, 0);
  std::vector<int32_t> free_pages;
  // The table entries the last append() set: (sequence, entry, page).
  std::vector<int32_t> new_seq, new_entry, new_page;
  std::mt19937 rng;
  Dtype dtype;
  DeviceKvCache* cache;

  Engine(Dtype t, DeviceKvCache* c, uint32_t seed) : rng(seed), dtype(t), cache(c) {
    host.q = Tensor<float>({B, Hq, D});
    host.k_pages = Tensor<float>({pool_pages, Hkv, page, D});
    host.v_pages = Tensor<float>({pool_pages, Hkv, page, D});
    host.selected = Tensor<int32_t>({B, Hkv, topk});
    host.block_tables = Tensor<int32_t>({B, max_pages}, -1);
    host.cu_seqlens_q = Tensor<int64_t>({B + 1});
    for (int64_t b = 0; b <= B; ++b) host.cu_seqlens_q.data[static_cast<size_t>(b)] = b;
    host.used_kv_lens = Tensor<int32_t>({B});
    host.block_size = block;
    host.page_size = page;
    host.store_as(dtype);
    for (int32_t p = 0; p < pool_pages; ++p) free_pages.push_back(p);
    std::shuffle(free_pages.begin(), free_pages.end(), rng);  // blocks straddle segments
  }

  float uniform() { return std::uniform_real_distribution<float>(-1.f, 1.f)(rng); }
  float stored(float x, uint16_t* bits) const { return stored_as(dtype, x, bits); }

  // A prefill of n tokens per sequence: its pages written whole, in one call.
  void prefill(int n) {
    std::vector<int32_t> pages;
    for (int64_t b = 0; b < B; ++b) {
      for (int pos = 0; pos < n; pos += page) {
        const int32_t pg = free_pages.back();
        free_pages.pop_back();
        host.block_tables.data[static_cast<size_t>(b * max_pages + pos / page)] = pg;
        pages.push_back(pg);
      }
      lens[static_cast<size_t>(b)] = n;
    }
    const int64_t page_elems = Hkv * page * D;
    std::vector<float> k(pages.size() * page_elems), v(k.size());
    std::vector<uint16_t> k16(k.size()), v16(k.size());
    for (size_t i = 0; i < pages.size(); ++i) {
      for (int64_t e = 0; e < page_elems; ++e) {
        const size_t at = i * page_elems + e, to = static_cast<size_t>(pages[i] * page_elems + e);
        host.k_pages.data[to] = k[at] = stored(uniform(), &k16[at]);
        host.v_pages.data[to] = v[at] = stored(uniform(), &v16[at]);
        if (dtype != Dtype::kFloat32) {
          host.k_bits.data[to] = k16[at];
          host.v_bits.data[to] = v16[at];
        }
      }
    }
    const int64_t n_pages = static_cast<int64_t>(pages.size());
    const TensorView<const int32_t> ids(pages.data(), {n_pages});
    if (dtype == Dtype::kFloat32) {
      cache->write_pages(ids, StorageView(k.data(), {n_pages, Hkv, page, D}), StorageView(v.data(), {n_pages, Hkv, page, D}));
    } else {
      cache->write_pages(ids, StorageView(k16.data(), {n_pages, Hkv, page, D}, dtype),
                         StorageView(v16.data(), {n_pages, Hkv, page, D}, dtype));
    }
  }

  // One token per sequence, in place: a new page from the free list when the last is full.
  void append() {
    std::vector<int32_t> pages, slots;
    std::vector<float> k(B * Hkv * D), v(k.size());
    std::vector<uint16_t> k16(k.size()), v16(k.size());
    new_seq.clear();
    new_entry.clear();
    new_page.clear();
    for (int64_t b = 0; b < B; ++b) {
      const int32_t pos = lens[static_cast<size_t>(b)];
      int32_t& pg = host.block_tables.data[static_cast<size_t>(b * max_pages + pos / page)];
      if (pos % page == 0) {
        pg = free_pages.back();
        free_pages.pop_back();
        new_seq.push_back(static_cast<int32_t>(b));
        new_entry.push_back(pos / static_cast<int32_t>(page));
        new_page.push_back(pg);
      }
      pages.push_back(pg);
      slots.push_back(pos % page);
      for (int64_t h = 0; h < Hkv; ++h) {
        for (int64_t d = 0; d < D; ++d) {
          const size_t at = static_cast<size_t>((b * Hkv + h) * D + d);
          const size_t to = static_cast<size_t>(((int64_t{pg} * Hkv + h) * page + pos % page) * D + d);
          host.k_pages.data[to] = k[at] = stored(uniform(), &k16[at]);
          host.v_pages.data[to] = v[at] = stored(uniform(), &v16[at]);
          if (dtype != Dtype::kFloat32) {
            host.k_bits.data[to] = k16[at];
            host.v_bits.data[to] = v16[at];
          }
        }
      }
      ++lens[static_cast<size_t>(b)];
    }
    const TensorView<const int32_t> ids(pages.data(), {B}), at(slots.data(), {B});
    if (dtype == Dtype::kFloat32) {
      cache->write_tokens(ids, at, StorageView(k.data(), {B, Hkv, D}), StorageView(v.data(), {B, Hkv, D}));
    } else {
      cache->write_tokens(ids, at, StorageView(k16.data(), {B, Hkv, D}, dtype), StorageView(v16.data(), {B, Hkv, D}, dtype));
    }
  }

  // A new query and selection (with a repeat, padding and, with `empty`, every row empty).
  void new_step(bool empty = false, int64_t ranks = topk) {
    for (size_t i = 0; i < host.q.data.size(); ++i) {
      uint16_t bits = 0;
      host.q.data[i] = stored(uniform(), &bits);
      if (dtype != Dtype::kFloat32) host.q_bits.data[i] = bits;
    }
    for (int64_t b = 0; b < B; ++b) {
      const int32_t blocks = (lens[static_cast<size_t>(b)] + block - 1) / block;
      host.used_kv_lens->data[static_cast<size_t>(b)] = lens[static_cast<size_t>(b)];
      for (int64_t h = 0; h < Hkv; ++h) {
        for (int64_t r = 0; r < topk; ++r) {
          int32_t s = r == 0 ? blocks - 1 : static_cast<int32_t>(rng() % blocks);
          if (r == 2 && rng() % 4 == 0) s = -1;
          if (r >= ranks) s = -1;
          host.selected.data[static_cast<size_t>((b * Hkv + h) * topk + r)] = empty ? -1 : s;
        }
      }
    }
  }

  StepInputs step_inputs() const {
    StepInputs s;
    s.q = dtype == Dtype::kFloat32 ? StorageView(host.q.data.data(), {B, Hq, D})
                                   : StorageView(host.q_bits.data.data(), {B, Hq, D}, dtype);
    s.selected = TensorView<const int32_t>(host.selected.data.data(), {B, Hkv, topk});
    s.block_tables = TensorView<const int32_t>(host.block_tables.data.data(), {B, max_pages});
    s.cu_seqlens_q = TensorView<const int64_t>(host.cu_seqlens_q.data.data(), {B + 1});
    s.used_kv_lens = TensorView<const int32_t>(host.used_kv_lens->data.data(), {B});
    s.block_size = block;
    return s;
  }
};

struct Param {
  std::string target, schedule;
  Dtype dtype;
};

class DeviceCacheTest : public ::testing::TestWithParam<Param> {};

// How a decode loop passes its block tables: at every step (host), or written into the runner
// once and then entry by entry as appends take new pages (resident; a decode step's tiles are then
// built on the device, where the pool is one segment), or alternating between the two.
// kResidentOnHost: resident, with the decode steps planned on the host from the runner's copy
// (set_decode_plan_on_device(false)); the others build them on the device.
enum class Tables { kHost, kResident, kAlternating, kResidentOnHost };

// `steps` decode steps after a prefill of 5 tokens; every step against the oracle.
// With `jit`, the cache and the runner on those kernels' kit (their own writers and decode plan).
// in_place_q: q written into the runner's staging (q_staging()), as an engine would.
void decode_loop(const Param& p, int64_t segment_pages, int steps, uint32_t seed, int prefill = 5,
                 Tables tables = Tables::kHost, const halide::Kernels* jit = nullptr, bool in_place_q = false) {
  DeviceCacheShape shape{Engine::pool_pages, Engine::Hkv, Engine::page, Engine::D, p.dtype};
  std::unique_ptr<DeviceKvCache> cache_owner = jit ? std::make_unique<DeviceKvCache>(jit->kit, shape, segment_pages)
                                                   : std::make_unique<DeviceKvCache>(p.target, shape, segment_pages);
  DeviceKvCache& cache = *cache_owner;
  if (segment_pages > 0) {
    ASSERT_EQ(cache.segments(), (Engine::pool_pages + segment_pages - 1) / segment_pages);
  }
  Engine e(p.dtype, &cache, seed);
  e.prefill(prefill);
  std::unique_ptr<DeviceStepRunner> runner_owner =
      jit ? std::make_unique<DeviceStepRunner>(cache, [jit](const Plan&) -> const halide::Kernels& { return *jit; },
                                               PlanOptions{})
          : std::make_unique<DeviceStepRunner>(cache, p.schedule);
  DeviceStepRunner& runner = *runner_owner;
  runner.set_decode_plan_on_device(tables != Tables::kResidentOnHost);
  if (tables != Tables::kHost) {
    runner.write_block_tables(TensorView<const int32_t>(e.host.block_tables.data.data(), {Engine::B, Engine::max_pages}));
  }
  Outputs out;
  for (int step = 0; step < steps; ++step) {
    e.append();
    e.new_step(step == steps - 1);
    StepInputs s = e.step_inputs();
    if (tables != Tables::kHost) {
      const int64_t n = static_cast<int64_t>(e.new_seq.size());
      runner.write_block_table_entries(TensorView<const int32_t>(e.new_seq.data(), {n}),
                                       TensorView<const int32_t>(e.new_entry.data(), {n}),
                                       TensorView<const int32_t>(e.new_page.data(), {n}));
      const TensorView<const int32_t> held = runner.block_tables();
      ASSERT_EQ(held.numel(), e.host.block_tables.numel());
      ASSERT_EQ(std::memcmp(held.data, e.host.block_tables.data.data(), e.host.block_tables.data.size() * sizeof(int32_t)), 0);
    }
    const bool resident = tables == Tables::kResident || tables == Tables::kResidentOnHost ||
                          (tables == Tables::kAlternating && step % 2 == 0);
    if (resident) {
      s.block_tables = TensorView<const int32_t>();
      s.resident_tables = true;
    }
    if (in_place_q) {
      void* staged = runner.q_staging(Engine::B, Engine::Hq);
      ASSERT_NE(staged, nullptr);
      std::memcpy(staged, s.q.data, static_cast<size_t>(s.q.numel() * s.q.element_bytes()));
      s.q.data = staged;
    }
    runner.step(s);
    EXPECT_EQ(runner.plan().tiles_on_device, resident && tables != Tables::kResidentOnHost && cache.segments() == 1)
        << "step " << step;
    out = outputs_for(runner.plan().problem);
    runner.read_outputs(out);
    const Inputs values = testing::values_only(e.host);
    const auto err = experiments::compare_outputs(out, reference::dense_attention<double>(values, validate(values)));
    EXPECT_TRUE(err.ok()) << p.target << " " << p.schedule << " " << dtype_name(p.dtype) << " step " << step
                          << " (segments " << cache.segments() << "): max|out err| " << err.max_out_err
                          << " max|lse err| " << err.max_lse_err;
    EXPECT_GE(runner.timing().forward_ms, 0.0);
  }
  // The last step selected nothing: zeros and -inf, never NaN.
  for (float x : out.out.data) ASSERT_EQ(x, 0.f);
  for (float x : out.lse.data) ASSERT_TRUE(std::isinf(x) && x < 0);
}

TEST_P(DeviceCacheTest, DecodeLoopMatchesTheOracleEveryStep) {
  REQUIRE_DEVICE(GetParam().target);
  decode_loop(GetParam(), 0, 8, 11);
}

// The same loops on the runner's resident tables, written entry by entry as appends take pages:
// one segment (the tiles built on the device), segments of 3 pages (planned on the host from
// the runner's tables), steps to the tables' end, and steps alternating with host tables.
TEST_P(DeviceCacheTest, ResidentTablesMatchTheOracleEveryStep) {
  REQUIRE_DEVICE(GetParam().target);
  decode_loop(GetParam(), 0, 8, 31, 5, Tables::kResident);
  decode_loop(GetParam(), 3, 5, 32, 5, Tables::kResident);
  decode_loop(GetParam(), 0, 4, 33, Engine::max_pages * Engine::page - 4, Tables::kResident);
  decode_loop(GetParam(), 0, 6, 34, 3, Tables::kAlternating);
  decode_loop(GetParam(), 0, 4, 36, 5, Tables::kResidentOnHost);
}

// The JIT's kernels on their own kit: its decode plan, compiled beside its writers, builds the
// tiles of the resident tables' steps.
TEST(DeviceCache, JitKitBuildsTheDecodePlan) {
  REQUIRE_DEVICE("host-vulkan");
  halide::JitRequest req;
  req.schedule = "vulkan_onepass";
  req.target = "host-vulkan";
  req.spec.D = Engine::D;
  req.spec.page_size = Engine::page;
  req.spec.block_size = Engine::block;
  req.spec.qhead = Engine::Hq / Engine::Hkv;
  req.spec.T = 1;
  const auto compiled = halide::jit_compile(req);
  ASSERT_TRUE(compiled->kernels.kit && compiled->kernels.kit->decode_plan);
  decode_loop({"host-vulkan", "vulkan_onepass", Dtype::kFloat32}, 0, 4, 35, 5, Tables::kResident, &compiled->kernels);
}

// Pools in segments of 3 pages (blocks of 2 pages straddle them): each segment's forward over its
// pages, the partials merged by the combine.
TEST_P(DeviceCacheTest, SegmentedPoolMatchesTheOracleEveryStep) {
  REQUIRE_DEVICE(GetParam().target);
  decode_loop(GetParam(), 3, 6, 12);
}

// Steps whose plans grow (one more rank selected each step), so that the runner's device arrays
// outgrow their allocations while the others live.
TEST_P(DeviceCacheTest, GrowingStepsMatchTheOracle) {
  REQUIRE_DEVICE(GetParam().target);
  const Param& p = GetParam();
  DeviceKvCache cache(p.target, {Engine::pool_pages, Engine::Hkv, Engine::page, Engine::D, p.dtype}, 4);
  Engine e(p.dtype, &cache, 17);
  e.prefill(20);
  DeviceStepRunner runner(cache, p.schedule);
  for (int64_t ranks = 1; ranks <= Engine::topk; ++ranks) {
    for (int rep = 0; rep < 2; ++rep) {
      e.append();
      e.new_step(false, ranks);
      runner.step(e.step_inputs());
      Outputs out = outputs_for(runner.plan().problem);
      runner.read_outputs(out);
      const Inputs values = testing::values_only(e.host);
      const auto err = experiments::compare_outputs(out, reference::dense_attention<double>(values, validate(values)));
      EXPECT_TRUE(err.ok()) << "ranks " << ranks << ": max|out err| " << err.max_out_err << " max|lse err| " << err.max_lse_err;
    }
  }
}

// Sequences grown to the last position their block tables hold.
TEST_P(DeviceCacheTest, SequencesFilledToTheirTablesEnd) {
  REQUIRE_DEVICE(GetParam().target);
  decode_loop(GetParam(), 3, 4, 15, Engine::max_pages * Engine::page - 4);
  decode_loop(GetParam(), 0, 4, 16, Engine::max_pages * Engine::page - 4);
}

TEST_P(DeviceCacheTest, PagesAreWrittenInPlace) {
  REQUIRE_DEVICE(GetParam().target);
  const Param& p = GetParam();
  DeviceCacheShape shape{Engine::pool_pages, Engine::Hkv, Engine::page, Engine::D, p.dtype};
  DeviceKvCache cache(p.target, shape, 4);
  Engine e(p.dtype, &cache, 13);
  e.prefill(9);
  e.append();
  e.append();
  std::vector<int32_t> all(Engine::pool_pages);
  for (int32_t i = 0; i < Engine::pool_pages; ++i) all[static_cast<size_t>(i)] = i;
  const int64_t eb = dtype_bytes(p.dtype), n = static_cast<int64_t>(e.host.k_pages.data.size());
  std::vector<uint8_t> k(static_cast<size_t>(n * eb)), v(k.size());
  cache.read_pages(TensorView<const int32_t>(all.data(), {Engine::pool_pages}), k.data(), v.data());
  // Every page, written or not (zeros), as the host mirror holds it.
  const void* want_k = p.dtype == Dtype::kFloat32 ? static_cast<const void*>(e.host.k_pages.data.data()) : e.host.k_bits.data.data();
  const void* want_v = p.dtype == Dtype::kFloat32 ? static_cast<const void*>(e.host.v_pages.data.data()) : e.host.v_bits.data.data();
  EXPECT_EQ(std::memcmp(k.data(), want_k, k.size()), 0);
  EXPECT_EQ(std::memcmp(v.data(), want_v, v.size()), 0);
}

// An engine that writes q into the runner's staging and reads out/lse where the runner read them
// back (no host copy in the step): the same outputs, bit for bit, as through its own arrays, and
// the oracle's, every step; a segmented pool (the partials merged across segments) and a query
// batch per step (one runner per path, on the same cache).
TEST_P(DeviceCacheTest, InPlaceStagingMatchesTheCopyPath) {
  REQUIRE_DEVICE(GetParam().target);
  const Param& p = GetParam();
  DeviceKvCache cache(p.target, {Engine::pool_pages, Engine::Hkv, Engine::page, Engine::D, p.dtype}, 5);
  Engine e(p.dtype, &cache, 21);
  e.prefill(7);
  DeviceStepRunner copying(cache, p.schedule), in_place(cache, p.schedule);
  // The copying runner's outputs are read back from device memory; on Vulkan the in-place one's
  // are written by its combine into host memory (set_outputs_in_place, its default there).
  copying.set_outputs_in_place(false);
  const bool vulkan = is_vulkan_target(p.target);
  for (int step = 0; step < 4; ++step) {
    e.append();
    e.new_step(step == 3);
    copying.step(e.step_inputs());
    Outputs want = outputs_for(copying.plan().problem);
    copying.read_outputs(want);

    StepInputs s = e.step_inputs();
    void* staged = in_place.q_staging(Engine::B, Engine::Hq);
    ASSERT_NE(staged, nullptr);
    std::memcpy(staged, s.q.data, static_cast<size_t>(s.q.numel() * s.q.element_bytes()));
    s.q.data = staged;
    if (step == 1) {
      // A step that its plan refuses (a block past the sequence), with q already on its way from
      // the staging: the error names the selection, and the next step is as before.
      std::vector<int32_t> bad(s.selected.ptr(), s.selected.ptr() + s.selected.numel());
      bad[0] = 1 << 20;
      StepInputs refused = s;
      refused.selected = TensorView<const int32_t>(bad.data(), {Engine::B, Engine::Hkv, Engine::topk});
      try {
        in_place.step(refused);
        ADD_FAILURE() << "a selection past the sequence was taken";
      } catch (const InputError& err) {
        EXPECT_NE(std::string(err.what()).find("selected"), std::string::npos) << err.what();
      }
      // The refused plan was written over the last step's: its outputs and kernels are gone too.
      EXPECT_THROW(in_place.read_outputs(), BackendError);
      EXPECT_THROW(in_place.launch(), BackendError);
    }
    in_place.step(s);
    EXPECT_EQ(in_place.timing().outputs_in_place, vulkan);
    EXPECT_FALSE(copying.timing().outputs_in_place);
    const OutputsView got = in_place.read_outputs();
    ASSERT_EQ(got.out.numel(), want.out.numel());
    ASSERT_EQ(got.lse.numel(), want.lse.numel());
    EXPECT_EQ(std::memcmp(got.out.ptr(), want.out.ptr(), want.out.data.size() * sizeof(float)), 0) << "step " << step;
    EXPECT_EQ(std::memcmp(got.lse.ptr(), want.lse.ptr(), want.lse.data.size() * sizeof(float)), 0) << "step " << step;
    const Inputs values = testing::values_only(e.host);
    const auto err = experiments::compare_outputs(want, reference::dense_attention<double>(values, validate(values)));
    EXPECT_TRUE(err.ok()) << "step " << step << ": max|out err| " << err.max_out_err << " max|lse err| " << err.max_lse_err;
  }
  // The last step selected nothing: zeros and -inf in the runner's arrays too.
  const OutputsView last = in_place.read_outputs();
  for (int64_t i = 0; i < last.out.numel(); ++i) ASSERT_EQ(last.out.ptr()[i], 0.f);
  for (int64_t i = 0; i < last.lse.numel(); ++i) ASSERT_TRUE(std::isinf(last.lse.ptr()[i]) && last.lse.ptr()[i] < 0);
  // A q that is not the plan's shape is refused, naming q (here a view of the staging past it).
  StorageView big = e.step_inputs().q;
  big.data = in_place.q_staging(1, Engine::Hq);
  big.shape[0] = 4096;
  try {
    in_place.prepare(in_place.plan(), big);
    FAIL() << "a q of another shape than the plan's was taken";
  } catch (const InputError& err) {
    EXPECT_NE(std::string(err.what()).find("q"), std::string::npos) << err.what();
  }
  // The refused preparation changed nothing: the last step's outputs are still there. A step that
  // is prepared but not launched has no outputs to read, until its launch.
  const OutputsView still = in_place.read_outputs();
  for (int64_t i = 0; i < still.out.numel(); ++i) ASSERT_EQ(still.out.ptr()[i], 0.f);
  {
    StepInputs s = e.step_inputs();
    void* staged = in_place.q_staging(Engine::B, Engine::Hq);
    std::memcpy(staged, s.q.data, static_cast<size_t>(s.q.numel() * s.q.element_bytes()));
    s.q.data = staged;
    in_place.prepare(in_place.plan(), s.q);
    EXPECT_THROW(in_place.read_outputs(), BackendError);
    in_place.launch();
    const OutputsView relaunched = in_place.read_outputs();
    for (int64_t i = 0; i < relaunched.out.numel(); ++i) ASSERT_EQ(relaunched.out.ptr()[i], 0.f);
  }
  EXPECT_THROW(in_place.q_staging(1, Engine::Hq + 1), InputError);
  if (p.dtype != Dtype::kFloat32) {
    // A float32 view of a 16-bit runner's staging (twice its bytes): refused naming q before
    // anything goes up, and the staging's next use as before.
    StepInputs s = e.step_inputs();
    void* staged = in_place.q_staging(Engine::B, Engine::Hq);
    s.q = StorageView(static_cast<const float*>(staged), {Engine::B, Engine::Hq, Engine::D});
    try {
      in_place.step(s);
      ADD_FAILURE() << "a float32 q was taken by a " << dtype_name(p.dtype) << " cache";
    } catch (const InputError& err) {
      EXPECT_EQ(err.field(), "q") << err.what();
    }
    s = e.step_inputs();
    staged = in_place.q_staging(Engine::B, Engine::Hq);
    std::memcpy(staged, s.q.data, static_cast<size_t>(s.q.numel() * s.q.element_bytes()));
    s.q.data = staged;
    in_place.step(s);
    copying.step(e.step_inputs());
    EXPECT_EQ(std::memcmp(in_place.read_outputs().out.ptr(), copying.read_outputs().out.ptr(),
                          static_cast<size_t>(Engine::B * Engine::Hq * Engine::D) * sizeof(float)),
              0);
  }
}

// B sequences of qo queries each (lengths qo + (b * 37) % 90) over 2 KV heads of 4 query heads,
// D 32, blocks of 8 positions in pages of 4, top-3 with padding and repeated ranks.
experiments::CaseSpec small_steps(int64_t B, int64_t qo, Dtype dtype) {
  experiments::CaseSpec spec;
  spec.qo.assign(static_cast<size_t>(B), qo);
  for (int64_t b = 0; b < B; ++b) spec.kv.push_back(qo + (b * 37) % 90);
  spec.Hq = 4;
  spec.Hkv = 2;
  spec.D = 32;
  spec.block_size = 8;
  spec.page_size = 4;
  spec.topk = 3;
  spec.pad_prob = 0.2;
  spec.dup_prob = 0.1;
  spec.dtype = dtype;
  spec.seed = static_cast<uint64_t>(B);
  return spec;
}

// A cache shaped as the case's whole pool, and that pool written into it page for page.
DeviceCacheShape pool_shape(const Inputs& in, Dtype dtype) {
  return DeviceCacheShape{in.k_pages.shape[0], in.k_pages.shape[1], in.k_pages.shape[2], in.k_pages.shape[3], dtype};
}
void write_whole_pool(DeviceKvCache& cache, const InputsView& view) {
  const int64_t P = view.k_pages.shape[0];
  std::vector<int32_t> all(static_cast<size_t>(P));
  std::iota(all.begin(), all.end(), 0);
  cache.write_pool_pages(TensorView<const int32_t>(all.data(), {P}), view.k_pages, view.v_pages);
}

// step_and_read: on CUDA, a decode step in parts of its queries, their copies and kernels on
// streams of their own; elsewhere (and where a step cannot run in parts) step() then
// read_outputs(). Whatever the parts, every output equals the phase-by-phase step's bit for bit
// and the oracle's: 40 sequences (parts of whole 16 queries: 16 and 24 in two parts, 16, 16 and
// 8 in three or more), 20 (too few to split), host and resident tables (the tiles built on the
// host or the device), a q outside the staging (not split), and a step that selects nothing.
// Every step has a new q and a new order of each selection row (new tiles and partial index), so
// that a part that read stale rows, or was read back before its kernels ended, differs.
void overlapped_steps(const Param& p, const std::vector<int64_t>& batches) {
  const bool cuda = is_cuda_target(p.target);
  // (Vulkan never runs in parts: two settings show that it still reads its outputs.)
  const std::vector<int> part_counts = cuda ? std::vector<int>{1, 2, 3, 4, 8} : std::vector<int>{1, 3};
  for (const int64_t B : batches) {
    const experiments::CaseSpec spec = small_steps(B, 1, p.dtype);
    Inputs in = experiments::make_case(spec);
    DeviceKvCache cache(p.target, pool_shape(in, p.dtype));
    const InputsView view(in);
    write_whole_pool(cache, view);
    DeviceStepRunner runner(cache, p.schedule);
    const int64_t max_pages = in.block_tables.shape[1];
    runner.write_block_tables(TensorView<const int32_t>(in.block_tables.data.data(), {B, max_pages}));
    std::mt19937 rng(static_cast<uint32_t>(B));
    for (const int parts : part_counts) {
      for (const bool resident : {false, true}) {
        for (const bool staged : {true, false}) {
          SCOPED_TRACE("B " + std::to_string(B) + " parts " + std::to_string(parts) + (resident ? " resident" : " host tables") +
                       (staged ? " q staged" : " q outside the staging"));
          // A new q (rounded to the dtype) and each selection row rotated by one rank.
          for (size_t i = 0; i < in.q.data.size(); ++i) {
            uint16_t bits = 0;
            in.q.data[i] = stored_as(p.dtype, std::uniform_real_distribution<float>(-1.f, 1.f)(rng), &bits);
            if (p.dtype != Dtype::kFloat32) in.q_bits.data[i] = bits;
          }
          for (size_t r = 0; r < in.selected.data.size(); r += static_cast<size_t>(spec.topk)) {
            std::rotate(in.selected.data.begin() + static_cast<std::ptrdiff_t>(r), in.selected.data.begin() + static_cast<std::ptrdiff_t>(r) + 1,
                        in.selected.data.begin() + static_cast<std::ptrdiff_t>(r + static_cast<size_t>(spec.topk)));
          }
          const Inputs values = testing::values_only(in);
          const Outputs oracle = reference::dense_attention<double>(values, validate(values));
          runner.set_overlap_parts(parts);
          StepInputs s(view);
          if (resident) {
            s.block_tables = TensorView<const int32_t>();
            s.resident_tables = true;
          }
          const size_t q_bytes = static_cast<size_t>(s.q.numel() * s.q.element_bytes());
          std::vector<uint8_t> q_copy(static_cast<const uint8_t*>(s.q.data), static_cast<const uint8_t*>(s.q.data) + q_bytes);
          if (staged) {
            std::memcpy(runner.q_staging(B, spec.Hq), q_copy.data(), q_bytes);
            s.q.data = runner.q_staging(B, spec.Hq);
          }
          const OutputsView got = runner.step_and_read(s);
          const int want_parts = cuda && staged && parts > 1 && B >= 32 ? static_cast<int>(std::min<int64_t>(parts, (B + 15) / 16)) : 0;
          EXPECT_EQ(runner.timing().overlap_parts, want_parts);
          EXPECT_EQ(runner.timing().overlapped_ms > 0, want_parts > 0);
          EXPECT_EQ(runner.timing().outputs_in_place, !cuda);  // Vulkan: written by the combine
          Outputs mine = outputs_for(runner.plan().problem);
          std::copy(got.out.ptr(), got.out.ptr() + got.out.numel(), mine.out.data.begin());
          std::copy(got.lse.ptr(), got.lse.ptr() + got.lse.numel(), mine.lse.data.begin());
          const auto err = experiments::compare_outputs(mine, oracle);
          EXPECT_TRUE(err.ok()) << "max|out err| " << err.max_out_err << " max|lse err| " << err.max_lse_err;
          if (staged) std::memcpy(runner.q_staging(B, spec.Hq), q_copy.data(), q_bytes);
          // (On Vulkan the phase-by-phase step reads its outputs back from device memory: the
          // in-place outputs above are compared with the read-back path.)
          runner.set_outputs_in_place(false);
          runner.step(s);
          Outputs want = outputs_for(runner.plan().problem);
          runner.read_outputs(want);
          EXPECT_EQ(std::memcmp(mine.out.data.data(), want.out.data.data(), want.out.data.size() * sizeof(float)), 0);
          EXPECT_EQ(std::memcmp(mine.lse.data.data(), want.lse.data.data(), want.lse.data.size() * sizeof(float)), 0);
          runner.set_outputs_in_place(DeviceStepRunner::default_outputs_in_place(p.target));
        }
      }
    }
    // A step that its plan refuses (a block past the sequence): the error names the selection,
    // and the next step is as before.
    {
      std::vector<int32_t> bad(in.selected.data.begin(), in.selected.data.end());
      bad[0] = 1 << 20;
      StepInputs refused(view);
      refused.selected = TensorView<const int32_t>(bad.data(), {B, spec.Hkv, spec.topk});
      std::memcpy(runner.q_staging(B, spec.Hq), refused.q.data, static_cast<size_t>(refused.q.numel() * refused.q.element_bytes()));
      refused.q.data = runner.q_staging(B, spec.Hq);
      runner.set_overlap_parts(2);
      try {
        runner.step_and_read(refused);
        ADD_FAILURE() << "a selection past the sequence was taken";
      } catch (const InputError& err) {
        EXPECT_EQ(err.field().rfind("selected", 0), 0u) << err.what();
      }
    }
    // A step that selects nothing, in parts: zeros and -inf.
    std::vector<int32_t> none(in.selected.data.size(), -1);
    StepInputs s(view);
    s.selected = TensorView<const int32_t>(none.data(), {B, spec.Hkv, spec.topk});
    std::memcpy(runner.q_staging(B, spec.Hq), s.q.data, static_cast<size_t>(s.q.numel() * s.q.element_bytes()));
    s.q.data = runner.q_staging(B, spec.Hq);
    runner.set_overlap_parts(3);
    const OutputsView empty = runner.step_and_read(s);
    for (int64_t i = 0; i < empty.out.numel(); ++i) ASSERT_EQ(empty.out.ptr()[i], 0.f);
    for (int64_t i = 0; i < empty.lse.numel(); ++i) ASSERT_TRUE(std::isinf(empty.lse.ptr()[i]) && empty.lse.ptr()[i] < 0);
    EXPECT_EQ(runner.timing().overlap_parts, cuda && B >= 32 ? 3 : 0);
    EXPECT_THROW(runner.set_overlap_parts(0), InputError);
  }
}

TEST_P(DeviceCacheTest, OverlappedStepEqualsThePhaseByPhaseStep) {
  REQUIRE_DEVICE(GetParam().target);
  overlapped_steps(GetParam(), {40, 20});
}


// The host plan in any number of tasks (set_plan_tasks: the calling thread alone, tasks on
// Halide's pool, one per hardware thread) gives the same step bit for bit, and the oracle's: 48
// decode sequences (the decode layout in 2 or 3 query ranges) and 5 sequences of 6 queries (the
// indexed plan, each KV head's sequences in up to 2 chunks).
TEST_P(DeviceCacheTest, PlanTasksGiveTheSameStep) {
  const Param& p = GetParam();
  REQUIRE_DEVICE(p.target);
  for (const int64_t qo : {1, 6}) {
    const Inputs in = experiments::make_case(small_steps(qo == 1 ? 48 : 5, qo, p.dtype));
    DeviceKvCache cache(p.target, pool_shape(in, p.dtype));
    const InputsView view(in);
    write_whole_pool(cache, view);
    const Inputs values = testing::values_only(in);
    const Outputs oracle = reference::dense_attention<double>(values, validate(values));
    DeviceStepRunner runner(cache, p.schedule);
    EXPECT_EQ(runner.plan_tasks(), DeviceStepRunner::default_plan_tasks(p.target));
    Outputs first;
    for (const int tasks : {1, 2, 3, 0}) {
      SCOPED_TRACE("queries per sequence " + std::to_string(qo) + ", plan tasks " + std::to_string(tasks));
      runner.set_plan_tasks(tasks);
      EXPECT_EQ(runner.plan_tasks(), tasks);
      EXPECT_EQ(runner.plan_options().parallel_heads, tasks != 1);
      EXPECT_EQ(runner.plan_options().sequence_chunks, tasks);
      runner.step(StepInputs(view));
      Outputs got = outputs_for(runner.plan().problem);
      runner.read_outputs(got);
      const auto err = experiments::compare_outputs(got, oracle);
      EXPECT_TRUE(err.ok()) << "max|out err| " << err.max_out_err << " max|lse err| " << err.max_lse_err;
      if (tasks == 1) {
        first = std::move(got);
        continue;
      }
      EXPECT_EQ(std::memcmp(got.out.data.data(), first.out.data.data(), first.out.data.size() * sizeof(float)), 0);
      EXPECT_EQ(std::memcmp(got.lse.data.data(), first.lse.data.data(), first.lse.data.size() * sizeof(float)), 0);
    }
    EXPECT_THROW(runner.set_plan_tasks(-1), InputError);
    EXPECT_EQ(runner.plan_tasks(), 0);
    // The host plan alone (host_plan): the step's plan, nothing launched; the last step's outputs
    // are no longer readable, nor can its kernels run again, until the next step.
    const Plan& alone = runner.host_plan(StepInputs(view));
    EXPECT_EQ(alone.attended_pairs, make_plan(view, {}).attended_pairs);
    EXPECT_THROW(runner.read_outputs(), BackendError);
    EXPECT_THROW(runner.launch(), BackendError);
    EXPECT_THROW(runner.plan(), BackendError);
    runner.step(StepInputs(view));
    Outputs again = outputs_for(runner.plan().problem);
    runner.read_outputs(again);
    EXPECT_EQ(std::memcmp(again.out.data.data(), first.out.data.data(), first.out.data.size() * sizeof(float)), 0);
    EXPECT_EQ(std::memcmp(again.lse.data.data(), first.lse.data.data(), first.lse.data.size() * sizeof(float)), 0);
  }
  {
    // A runner made with its own PlanOptions plans as they say until set_plan_tasks.
    PlanOptions o;
    o.parallel_heads = true;
    o.sequence_chunks = 5;
    DeviceKvCache cache(p.target, DeviceCacheShape{8, 2, 4, 32, p.dtype});
    DeviceStepRunner runner(cache, [](const Plan&) -> const halide::Kernels& { throw BackendError("not run"); }, o);
    EXPECT_EQ(runner.plan_tasks(), 5);
    EXPECT_TRUE(runner.plan_options().parallel_heads);
    EXPECT_EQ(runner.plan_options().sequence_chunks, 5);
    runner.set_plan_tasks(1);
    EXPECT_FALSE(runner.plan_options().parallel_heads);
    EXPECT_EQ(runner.plan_tasks(), 1);
  }
}


std::vector<Param> params() {
  std::vector<Param> ps;
  for (const char* target : {"host-vulkan", "host-cuda"}) {
    for (Dtype t : {Dtype::kFloat32, Dtype::kFloat16, Dtype::kBFloat16}) {
      ps.push_back({target, std::string(target) == "host-vulkan" ? "vulkan_onepass" : "vulkan_onepass", t});
    }
  }
  ps.push_back({"host-vulkan", "vulkan_tiled", Dtype::kFloat32});
  return ps;
}

INSTANTIATE_TEST_SUITE_P(Targets, DeviceCacheTest, ::testing::ValuesIn(params()), [](const auto& info) {
  std::string n = info.param.target + "_" + info.param.schedule + "_" + dtype_name(info.param.dtype);
  for (char& c : n) c = std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
  return n;
});

// The outputs read back through vulkan_read_device equal those through Halide's copy_to_host.
TEST(DeviceCache, BatchedWritesLandWhereTheySay) {
  // Two arrays written in one submission (the second with a zero tail), read back through the
  // same staging: the batched path itself runs here (it returns false where it cannot).
  REQUIRE_DEVICE("host-vulkan");
  DeviceKvCache cache("host-vulkan", {Engine::pool_pages, Engine::Hkv, Engine::page, Engine::D, Dtype::kFloat32});
  halide::DeviceArray a(halide_type_t(halide_type_int, 32), cache.array_spec());
  halide::DeviceArray b(halide_type_t(halide_type_int, 32), cache.array_spec());
  halide_buffer_t* va = a.view({1000});
  halide_buffer_t* vb = b.view({5000});
  std::vector<int32_t> sa(1000), sb(3001);
  std::iota(sa.begin(), sa.end(), 7);
  std::iota(sb.begin(), sb.end(), -1000);
  std::vector<int32_t> back_b(5000, 123);
  ASSERT_TRUE(halide::vulkan_read_device(vb, 5000 * 4, back_b.data()));  // dirty contents first
  ASSERT_TRUE(halide::vulkan_write_device({{va, sa.data(), 1000 * 4, 1000 * 4}, {vb, sb.data(), 3001 * 4, 5000 * 4}}));
  std::vector<int32_t> back_a(1000, -1);
  ASSERT_TRUE(halide::vulkan_read_device(va, 1000 * 4, back_a.data()));
  ASSERT_TRUE(halide::vulkan_read_device(vb, 5000 * 4, back_b.data()));
  EXPECT_EQ(back_a, sa);
  for (int i = 0; i < 5000; ++i) ASSERT_EQ(back_b[static_cast<size_t>(i)], i < 3001 ? sb[static_cast<size_t>(i)] : 0) << i;
}

TEST(DeviceCache, TransferPathsAgree) {
  // Our staging (batched uploads, read-backs) against Halide's copy_to_device / copy_to_host: the
  // same steps, bit for bit, on the same cache.
  REQUIRE_DEVICE("host-vulkan");
  DeviceKvCache cache("host-vulkan", {Engine::pool_pages, Engine::Hkv, Engine::page, Engine::D, Dtype::kFloat32});
  Engine e(Dtype::kFloat32, &cache, 18);
  e.prefill(12);
  e.new_step();
  DeviceStepRunner runner(cache, "vulkan_onepass");
  runner.step(e.step_inputs());
  Outputs fast = outputs_for(runner.plan().problem), slow = fast, slow_in = fast;
  runner.read_outputs(fast);
  halide::DeviceArray::set_fast_transfers(false);
  runner.read_outputs(slow);
  runner.step(e.step_inputs());  // uploaded through Halide's copies
  runner.read_outputs(slow_in);
  halide::DeviceArray::set_fast_transfers(true);
  EXPECT_EQ(fast.out.data, slow.out.data);
  EXPECT_EQ(fast.lse.data, slow.lse.data);
  EXPECT_EQ(fast.out.data, slow_in.out.data);
  EXPECT_EQ(fast.lse.data, slow_in.lse.data);
  double sum = 0;
  for (float x : fast.out.data) sum += std::fabs(x);
  EXPECT_GT(sum, 0.0);
}

template <class F>
std::string input_error_field(F&& f) {
  try {
    f();
  } catch (const InputError& e) {
    return e.field();
  }
  return "(no InputError)";
}

TEST(DeviceCache, BadWritesAreTypedErrorsNamingTheField) {
  REQUIRE_DEVICE("host-vulkan");
  DeviceKvCache cache("host-vulkan", {8, 2, 4, 32, Dtype::kFloat32});
  std::vector<float> k(2 * 2 * 4 * 32), v(k.size());
  std::vector<uint16_t> k16(k.size());
  std::vector<int32_t> pages = {1, 8}, ok_pages = {1, 2}, twice = {3, 3}, slots = {0, 4}, same_slot = {1, 1};
  const StorageView kv(k.data(), {2, 2, 4, 32}), vv(v.data(), {2, 2, 4, 32});
  const TensorView<const int32_t> two(ok_pages.data(), {2});
  EXPECT_EQ(input_error_field([&] { cache.write_pages(TensorView<const int32_t>(pages.data(), {2}), kv, vv); }), "pages[1]");
  EXPECT_EQ(input_error_field([&] { cache.write_pages(TensorView<const int32_t>(twice.data(), {2}), kv, vv); }), "pages[1]");
  EXPECT_EQ(input_error_field([&] { cache.write_pages(two, StorageView(k16.data(), {2, 2, 4, 32}, Dtype::kBFloat16), vv); }), "k");
  EXPECT_EQ(input_error_field([&] { cache.write_pages(two, kv, StorageView(v.data(), {2, 2, 2, 64})); }), "v");
  const StorageView kt(k.data(), {2, 2, 32}), vt(v.data(), {2, 2, 32});
  EXPECT_EQ(input_error_field([&] { cache.write_tokens(two, TensorView<const int32_t>(slots.data(), {2}), kt, vt); }), "slots[1]");
  EXPECT_EQ(input_error_field([&] { cache.write_tokens(TensorView<const int32_t>(twice.data(), {2}), TensorView<const int32_t>(same_slot.data(), {2}), kt, vt); }),
            "slots[1]");
  EXPECT_EQ(input_error_field([&] { cache.write_tokens(two, TensorView<const int32_t>(slots.data(), {1}), kt, vt); }), "slots");
  EXPECT_EQ(input_error_field([&] { DeviceKvCache("host-vulkan", {0, 2, 4, 32, Dtype::kFloat32}); }), "num_pages");
  EXPECT_EQ(input_error_field([&] { DeviceKvCache("host-vulkan", {8, 2, 4, 32, Dtype::kFloat32}, int64_t{1} << 40); }), "segment_pages");
  EXPECT_THROW(DeviceKvCache("host", {8, 2, 4, 32, Dtype::kFloat32}), BackendError);
}

// Pages of one position: write_pages takes [n, Hkv, 1, D] (whole pages), write_tokens [n, Hkv, D]
// (one token each); each refuses the other's shape, naming k. (The pages' shape was once chosen by
// page_size > 1, so a pool of one-position pages refused its own pages.)
TEST(DeviceCache, OnePositionPagesTakeBothShapes) {
  REQUIRE_DEVICE("host-vulkan");
  DeviceKvCache cache("host-vulkan", {8, 2, 1, 32, Dtype::kFloat32});
  std::vector<float> k(3 * 2 * 32), v(k.size()), k2(k.size()), v2(k.size());
  std::iota(k.begin(), k.end(), 1.f);
  std::iota(v.begin(), v.end(), -500.f);
  std::iota(k2.begin(), k2.end(), 1000.f);
  std::iota(v2.begin(), v2.end(), 2000.f);
  std::vector<int32_t> pages = {5, 0, 7}, slots = {0, 0, 0}, tokens = {0, 7}, token_slots = {0, 0};
  const TensorView<const int32_t> three(pages.data(), {3}), zero_slots(slots.data(), {3});
  const StorageView kp(k.data(), {3, 2, 1, 32}), vp(v.data(), {3, 2, 1, 32});
  const StorageView kt(k.data(), {3, 2, 32}), vt(v.data(), {3, 2, 32});
  ASSERT_NO_THROW(cache.write_pages(three, kp, vp));
  std::vector<float> k_back(k.size(), 0.f), v_back(k.size(), 0.f);
  cache.read_pages(three, k_back.data(), v_back.data());
  EXPECT_EQ(k_back, k);
  EXPECT_EQ(v_back, v);
  // Two of them overwritten a token at a time (pages 0 and 7, their one slot).
  ASSERT_NO_THROW(cache.write_tokens(TensorView<const int32_t>(tokens.data(), {2}), TensorView<const int32_t>(token_slots.data(), {2}),
                                     StorageView(k2.data(), {2, 2, 32}), StorageView(v2.data(), {2, 2, 32})));
  cache.read_pages(three, k_back.data(), v_back.data());
  for (size_t i = 0; i < k.size(); ++i) {
    const size_t page = i / 64, at = i % 64;  // pages 5, 0, 7; the tokens went to 0 and 7
    ASSERT_EQ(k_back[i], page == 0 ? k[i] : k2[(page - 1) * 64 + at]) << i;
    ASSERT_EQ(v_back[i], page == 0 ? v[i] : v2[(page - 1) * 64 + at]) << i;
  }
  EXPECT_EQ(input_error_field([&] { cache.write_pages(three, kt, vt); }), "k");
  EXPECT_EQ(input_error_field([&] { cache.write_tokens(three, zero_slots, kp, vp); }), "k");
}

TEST(DeviceCache, StepsNamingPagesBeyondThePoolOrAnotherDtypeAreRefused) {
  REQUIRE_DEVICE("host-vulkan");
  DeviceKvCache cache("host-vulkan", {Engine::pool_pages, Engine::Hkv, Engine::page, Engine::D, Dtype::kFloat32});
  Engine e(Dtype::kFloat32, &cache, 14);
  e.prefill(8);
  e.new_step();
  DeviceStepRunner runner(cache, "vulkan_onepass");
  e.host.block_tables.data[1] = Engine::pool_pages;  // sequence 0's second page: beyond the pool
  EXPECT_EQ(input_error_field([&] { runner.step(e.step_inputs()); }), "block_tables[0, 1]");
  e.host.block_tables.data[1] = 0;
  e.host.store_as(Dtype::kBFloat16);
  e.dtype = Dtype::kBFloat16;
  // The caller's q is what disagrees with the cache (the pool's dtype is the cache's own).
  EXPECT_EQ(input_error_field([&] { runner.step(e.step_inputs()); }), "q");
}

// The resident tables: every bad write is refused where it is written, naming the field, and
// leaves the tables as they were; a step asks for them only once written, with no tables of its own.
TEST(DeviceCache, ResidentTablesAreCheckedWhereWritten) {
  REQUIRE_DEVICE("host-vulkan");
  DeviceKvCache cache("host-vulkan", {Engine::pool_pages, Engine::Hkv, Engine::page, Engine::D, Dtype::kFloat32});
  Engine e(Dtype::kFloat32, &cache, 19);
  e.prefill(8);
  e.new_step();
  DeviceStepRunner runner(cache, "vulkan_onepass");
  runner.set_decode_plan_on_device(true);
  StepInputs s = e.step_inputs();
  s.resident_tables = true;
  EXPECT_EQ(input_error_field([&] { runner.step(s); }), "block_tables");  // none written yet
  std::vector<int32_t> tables(e.host.block_tables.data.begin(), e.host.block_tables.data.end());
  const TensorView<const int32_t> view(tables.data(), {Engine::B, Engine::max_pages});
  tables[Engine::max_pages + 2] = Engine::pool_pages;  // sequence 1, entry 2: beyond the pool
  EXPECT_EQ(input_error_field([&] { runner.write_block_tables(view); }), "block_tables[1, 2]");
  EXPECT_EQ(runner.block_tables().numel(), 0);
  tables[Engine::max_pages + 2] = -1;
  runner.write_block_tables(view);
  EXPECT_EQ(input_error_field([&] { runner.step(s); }), "block_tables");  // its own tables too
  s.block_tables = TensorView<const int32_t>();
  runner.step(s);
  EXPECT_TRUE(runner.plan().tiles_on_device);
  std::vector<int32_t> seq = {0, 2}, entry = {5, 7}, page = {3, Engine::pool_pages}, twice = {5, 5}, zero = {0, 0};
  auto entries = [&](std::vector<int32_t>& a, std::vector<int32_t>& b, std::vector<int32_t>& c, int64_t nb = 2) {
    runner.write_block_table_entries(TensorView<const int32_t>(a.data(), {2}), TensorView<const int32_t>(b.data(), {nb}),
                                     TensorView<const int32_t>(c.data(), {2}));
  };
  EXPECT_EQ(input_error_field([&] { entries(seq, entry, page); }), "pages[1]");
  std::vector<int32_t> bad_seq = {0, Engine::B}, bad_entry = {-1, 0}, fine = {3, 4};
  EXPECT_EQ(input_error_field([&] { entries(bad_seq, entry, fine); }), "seqs[1]");
  EXPECT_EQ(input_error_field([&] { entries(seq, bad_entry, fine); }), "entries[0]");
  EXPECT_EQ(input_error_field([&] { entries(zero, twice, fine); }), "entries[1]");
  EXPECT_EQ(input_error_field([&] { entries(seq, entry, fine, 1); }), "entries");
  const TensorView<const int32_t> held = runner.block_tables();
  EXPECT_EQ(std::vector<int32_t>(held.data, held.data + held.numel()), tables);  // nothing written
  entries(seq, entry, fine);
  EXPECT_EQ(runner.block_tables().data[5], 3);
  EXPECT_EQ(runner.block_tables().data[2 * Engine::max_pages + 7], 4);
}

// Caches and runners on separate threads, each its own engine: every step right. Two of them
// write q into their runner's staging (its copy then goes up while the host plans, one such copy
// in flight at a time for the process).
TEST(DeviceCache, ConcurrentCachesAndRunners) {
  REQUIRE_DEVICE("host-vulkan");
  std::vector<std::thread> threads;
  for (uint32_t i = 0; i < 4; ++i) {
    threads.emplace_back([i] {
      decode_loop({"host-vulkan", "vulkan_onepass", i == 1 ? Dtype::kBFloat16 : Dtype::kFloat32}, i == 2 ? 5 : 0, 4, 20 + i, 5,
                  i == 0 ? Tables::kResident : Tables::kHost, nullptr, i >= 2);
    });
  }
  for (auto& t : threads) t.join();
}

}  // namespace
}  // namespace kvouter
