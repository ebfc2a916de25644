// Uses the installed package only (no compiler inside): a closed-form check, then a decode loop as
// an inference engine runs it. The engine owns its KV pool, block tables and lengths; each step it
// appends one token per sequence in place, picks a new selection, plans with a reused Planner and
// has the AOT kernels write into its own output buffers, through views (nothing copied). The loop
// runs on the CPU with a float32 pool and with a bfloat16 pool, and on Vulkan where a device is
// present (lavapipe in CI). Every step is checked against a naive softmax over the selected
// positions. Prints "N passed, M failed".
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "kvouter/aot.h"
#include "kvouter/aot_kernels.h"
#include "kvouter/device_cache.h"
#include "kvouter/plan.h"
#include "kvouter/vulkan_probe.h"

namespace {

using namespace kvouter;

bool closed_form(Backend& backend) {
  // One sequence, one query, one head, D 2, one block of 2 positions on physical page 1.
  Inputs in;
  in.q = Tensor<float>({1, 1, 2});
  in.q.data = {1.f, 0.f};
  in.k_pages = Tensor<float>({2, 1, 2, 2});
  in.v_pages = Tensor<float>({2, 1, 2, 2});
  in.k_pages.data = {9, 9, 9, 9, 1, 0, 0, 1};
  in.v_pages.data = {9, 9, 9, 9, 1, 2, 3, 4};
  in.selected = Tensor<int32_t>({1, 1, 1});
  in.block_tables = Tensor<int32_t>({1, 1});
  in.block_tables.data = {1};
  in.cu_seqlens_q = Tensor<int64_t>({2});
  in.cu_seqlens_q.data = {0, 1};
  in.block_size = 2;
  in.page_size = 2;
  const Plan plan = make_plan(in, backend.plan_options());
  const Outputs out = backend.run(plan, in);
  const double w0 = std::exp(1 / std::sqrt(2.0)), w1 = 1.0;
  const bool ok = std::fabs(out.out.data[0] - (w0 + 3 * w1) / (w0 + w1)) < 1e-5 &&
                  std::fabs(out.out.data[1] - (2 * w0 + 4 * w1) / (w0 + w1)) < 1e-5 &&
                  std::fabs(out.lse.data[0] - std::log(w0 + w1)) < 1e-5;
  std::printf("closed form: out = (%f, %f) lse = %f\n", out.out.data[0], out.out.data[1], out.lse.data[0]);
  return ok;
}

// The engine's state: a paged pool with a free list, per-sequence tables and lengths.
struct Engine {
  static constexpr int64_t B = 3, Hq = 4, Hkv = 2, D = 32, page = 4, block = 8, topk = 3, max_pages = 16;
  static constexpr int64_t pool_pages = B * max_pages;
  std::vector<float> k = std::vector<float>(pool_pages * Hkv * page * D), v = k;
  // A bfloat16 pool: the bits the kernels read; k and v then hold their values, widened.
  Dtype dtype = Dtype::kFloat32;
  std::vector<uint16_t> k16 = std::vector<uint16_t>(k.size()), v16 = k16;
  std::vector<int32_t> tables = std::vector<int32_t>(B * max_pages, -1), lens = std::vector<int32_t>(B, 0);
  std::vector<int64_t> cu = {0, 1, 2, 3};
  std::vector<float> q = std::vector<float>(B * Hq * D);
  std::vector<int32_t> selected = std::vector<int32_t>(B * Hkv * topk);
  std::vector<float> out = std::vector<float>(B * Hq * D), lse = std::vector<float>(B * Hq);
  int32_t next_free = 0;
  std::mt19937 rng{7};

  float uniform() { return std::uniform_real_distribution<float>(-1.f, 1.f)(rng); }

  // One token per sequence written in place: a new page from the free list when the last is full.
  void append() {
    for (int64_t b = 0; b < B; ++b) {
      const int32_t pos = lens[b];
      int32_t& pg = tables[b * max_pages + pos / page];
      if (pos % page == 0) pg = next_free++;
      for (int64_t h = 0; h < Hkv; ++h) {
        for (int64_t d = 0; d < D; ++d) {
          const int64_t at = ((int64_t{pg} * Hkv + h) * page + pos % page) * D + d;
          k[at] = uniform();
          v[at] = uniform();
          if (dtype == Dtype::kBFloat16) {
            k16[at] = float_to_bf16(k[at]);
            v16[at] = float_to_bf16(v[at]);
            k[at] = bf16_to_float(k16[at]);
            v[at] = bf16_to_float(v16[at]);
          }
        }
      }
      ++lens[b];
    }
  }

  std::vector<uint16_t> q16 = std::vector<uint16_t>(B * Hq * D);

  void new_query_and_selection() {
    for (size_t i = 0; i < q.size(); ++i) {
      q[i] = uniform();
      if (dtype == Dtype::kBFloat16) {
        q16[i] = float_to_bf16(q[i]);
        q[i] = bf16_to_float(q16[i]);
      }
    }
    for (int64_t b = 0; b < B; ++b) {
      const int32_t blocks = (lens[b] + block - 1) / block;
      for (int64_t h = 0; h < Hkv; ++h) {
        for (int64_t r = 0; r < topk; ++r) {
          selected[(b * Hkv + h) * topk + r] = r == 0 ? blocks - 1 : static_cast<int32_t>(rng() % blocks);
        }
      }
    }
  }

  InputsView view() const {
    InputsView in;
    in.q = TensorView<const float>(q.data(), {B, Hq, D});
    in.k_pages = TensorView<const float>(k.data(), {pool_pages, Hkv, page, D});
    in.v_pages = TensorView<const float>(v.data(), {pool_pages, Hkv, page, D});
    if (dtype == Dtype::kBFloat16) {  // the query too: one storage dtype for q, K and V
      in.q = StorageView(q16.data(), {B, Hq, D}, dtype);
      in.k_pages = StorageView(k16.data(), {pool_pages, Hkv, page, D}, dtype);
      in.v_pages = StorageView(v16.data(), {pool_pages, Hkv, page, D}, dtype);
    }
    in.selected = TensorView<const int32_t>(selected.data(), {B, Hkv, topk});
    in.block_tables = TensorView<const int32_t>(tables.data(), {B, max_pages});
    in.cu_seqlens_q = TensorView<const int64_t>(cu.data(), {B + 1});
    in.used_kv_lens = TensorView<const int32_t>(lens.data(), {B});
    in.block_size = block;
    in.page_size = page;
    return in;
  }

  // Naive attention over the selected blocks (each block once), for query head j of sequence b.
  double max_error() const {
    double worst = 0;
    const double scale = 1 / std::sqrt(static_cast<double>(D));
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t j = 0; j < Hq; ++j) {
        const int64_t h = j / (Hq / Hkv);
        std::vector<bool> chosen(max_pages * page / block, false);
        for (int64_t r = 0; r < topk; ++r) chosen[selected[(b * Hkv + h) * topk + r]] = true;
        double m = -1e300, l = 0;
        std::vector<double> acc(D, 0.0), s;
        std::vector<int64_t> at;
        for (int64_t pos = 0; pos < lens[b]; ++pos) {
          if (!chosen[pos / block]) continue;
          const int64_t base = ((int64_t{tables[b * max_pages + pos / page]} * Hkv + h) * page + pos % page) * D;
          double dot = 0;
          for (int64_t d = 0; d < D; ++d) dot += double{q[(b * Hq + j) * D + d]} * k[base + d];
          s.push_back(dot * scale);
          at.push_back(base);
          m = std::max(m, dot * scale);
        }
        for (size_t i = 0; i < s.size(); ++i) {
          const double w = std::exp(s[i] - m);
          l += w;
          for (int64_t d = 0; d < D; ++d) acc[d] += w * v[at[i] + d];
        }
        for (int64_t d = 0; d < D; ++d) worst = std::max(worst, std::fabs(acc[d] / l - out[(b * Hq + j) * D + d]));
        worst = std::max(worst, std::fabs(m + std::log(l) - lse[b * Hq + j]));
      }
    }
    return worst;
  }
};

// The engine's decode loop through one backend: a prefill of 5 tokens, then `steps` steps.
void decode_loop(Backend& backend, Dtype dtype, int steps, const char* what, int* passed, int* failed) {
  Engine e;
  e.dtype = dtype;
  for (int i = 0; i < 5; ++i) e.append();  // a prefill of 5 tokens per sequence
  Planner planner(backend.plan_options());
  int bad = 0;
  for (int step = 0; step < steps; ++step) {
    e.append();
    e.new_query_and_selection();
    const InputsView in = e.view();
    const Plan& plan = planner.plan_checked_tables(in);  // the engine wrote its tables itself
    backend.run_into(plan, in, OutputsView(TensorView<float>(e.out.data(), {Engine::B, Engine::Hq, Engine::D}),
                                           TensorView<float>(e.lse.data(), {Engine::B, Engine::Hq})));
    const double err = e.max_error();
    (err < 1e-4 ? *passed : *failed)++;
    if (err >= 1e-4) {
      std::printf("%s, decode step %d: max error %g\n", what, step, err);
      ++bad;
    }
  }
  std::printf("decode loop (%s): %d steps, lengths %d %d %d, %d wrong\n", what, steps, e.lens[0], e.lens[1],
              e.lens[2], bad);
}

// The same loop with the pool on the device (kvouter/device_cache.h): each appended token is
// written into the cache in place, the block tables live in the runner (written once, then each
// new page's entry as an append takes it), a step uploads only q and its selection (the runner
// builds the decode plan on the device), and out/lse are read back into the engine's buffers.
void device_decode_loop(const std::string& target, Dtype dtype, int steps, int* passed, int* failed) {
  Engine e;
  e.dtype = dtype;
  halide::DeviceKvCache cache(target, {Engine::pool_pages, Engine::Hkv, Engine::page, Engine::D, dtype});
  auto append = [&] {
    e.append();
    std::vector<int32_t> pages, slots;
    std::vector<float> k, v;
    std::vector<uint16_t> k16, v16;
    for (int64_t b = 0; b < Engine::B; ++b) {
      const int32_t pos = e.lens[b] - 1;
      const int32_t pg = e.tables[b * Engine::max_pages + pos / Engine::page];
      pages.push_back(pg);
      slots.push_back(pos % Engine::page);
      for (int64_t h = 0; h < Engine::Hkv; ++h) {
        const int64_t at = ((int64_t{pg} * Engine::Hkv + h) * Engine::page + pos % Engine::page) * Engine::D;
        k.insert(k.end(), e.k.begin() + at, e.k.begin() + at + Engine::D);
        v.insert(v.end(), e.v.begin() + at, e.v.begin() + at + Engine::D);
        k16.insert(k16.end(), e.k16.begin() + at, e.k16.begin() + at + Engine::D);
        v16.insert(v16.end(), e.v16.begin() + at, e.v16.begin() + at + Engine::D);
      }
    }
    const TensorView<const int32_t> pv(pages.data(), {Engine::B}), sv(slots.data(), {Engine::B});
    if (dtype == Dtype::kFloat32) {
      cache.write_tokens(pv, sv, StorageView(k.data(), {Engine::B, Engine::Hkv, Engine::D}),
                         StorageView(v.data(), {Engine::B, Engine::Hkv, Engine::D}));
    } else {
      cache.write_tokens(pv, sv, StorageView(k16.data(), {Engine::B, Engine::Hkv, Engine::D}, dtype),
                         StorageView(v16.data(), {Engine::B, Engine::Hkv, Engine::D}, dtype));
    }
  };
  for (int i = 0; i < 5; ++i) append();
  halide::DeviceStepRunner runner(cache, "vulkan_slices");  // the default GPU schedule
  // The plan built on the device here whatever the target's default (on Vulkan: the host's), so
  // that the installed decode-plan kernel runs.
  runner.set_decode_plan_on_device(true);
  runner.write_block_tables(TensorView<const int32_t>(e.tables.data(), {Engine::B, Engine::max_pages}));
  int bad = 0;
  for (int step = 0; step < steps; ++step) {
    append();
    std::vector<int32_t> seqs, entries, new_pages;  // the entries this append set
    for (int64_t b = 0; b < Engine::B; ++b) {
      const int32_t pos = e.lens[b] - 1;
      if (pos % Engine::page != 0) continue;
      seqs.push_back(static_cast<int32_t>(b));
      entries.push_back(pos / static_cast<int32_t>(Engine::page));
      new_pages.push_back(e.tables[b * Engine::max_pages + pos / Engine::page]);
    }
    const int64_t n = static_cast<int64_t>(seqs.size());
    runner.write_block_table_entries(TensorView<const int32_t>(seqs.data(), {n}), TensorView<const int32_t>(entries.data(), {n}),
                                     TensorView<const int32_t>(new_pages.data(), {n}));
    e.new_query_and_selection();
    const InputsView in = e.view();
    halide::StepInputs s(in);
    s.block_tables = TensorView<const int32_t>();
    s.resident_tables = true;
    // q written where the runner uploads it from, out/lse read where it reads them back
    // (step_and_read: on CUDA, in parts whose copies overlap the kernels).
    void* staged = runner.q_staging(Engine::B, Engine::Hq);
    std::memcpy(staged, s.q.data, static_cast<size_t>(s.q.numel() * s.q.element_bytes()));
    s.q.data = staged;
    const OutputsView o = runner.step_and_read(s);
    std::copy(o.out.ptr(), o.out.ptr() + o.out.numel(), e.out.data());
    std::copy(o.lse.ptr(), o.lse.ptr() + o.lse.numel(), e.lse.data());
    const double err = e.max_error();
    (err < 1e-4 ? *passed : *failed)++;
    if (err >= 1e-4) {
      std::printf("device cache on %s, decode step %d: max error %g\n", target.c_str(), step, err);
      ++bad;
    }
  }
  if (!runner.plan().tiles_on_device) {
    std::printf("device cache on %s: the last decode step was not planned on the device\n", target.c_str());
    ++*failed;
  }
  std::printf("decode loop (device cache on %s, %s): %d steps, %d wrong; last step: plan %.3f ms, uploads %.3f ms, "
              "kernels %.3f ms, readback %.3f ms\n",
              target.c_str(), dtype_name(dtype).c_str(), steps, bad, runner.timing().plan_ms, runner.timing().upload_ms,
              runner.timing().forward_ms + runner.timing().combine_ms, runner.timing().readback_ms);
}

}  // namespace

int main() {
  halide::register_generated_aot_kernels();
  auto backend = halide::make_aot_backend({"aot", "cpu_tiled", {}, ""});
  int passed = 0, failed = 0;
  (closed_form(*backend) ? passed : failed)++;
  decode_loop(*backend, Dtype::kFloat32, 40, "cpu_tiled, float32", &passed, &failed);
  decode_loop(*backend, Dtype::kBFloat16, 40, "cpu_tiled, bfloat16", &passed, &failed);
  if (vulkan_devices().empty()) {
    std::printf("decode loop on Vulkan: not run, no Vulkan device\n");
  } else {
    auto vk = halide::make_aot_backend({"aot", "vulkan_tiled", {}, "host-vulkan"});
    decode_loop(*vk, Dtype::kFloat32, 10, "vulkan_tiled on host-vulkan, float32", &passed, &failed);
    decode_loop(*vk, Dtype::kBFloat16, 10, "vulkan_tiled on host-vulkan, bfloat16", &passed, &failed);
    device_decode_loop("host-vulkan", Dtype::kFloat32, 10, &passed, &failed);
    device_decode_loop("host-vulkan", Dtype::kBFloat16, 10, &passed, &failed);
  }
  std::printf("%zu AOT variants; %d passed, %d failed\n", halide::aot_variants().size(), passed, failed);
  return failed == 0 ? 0 : 1;
}
