// Uses the installed package only (no compiler inside): a closed-form check, then a decode loop as
// an inference engine runs it. The engine owns its KV pool, block tables and lengths; each step it
// appends one token per sequence in place, picks a new selection, plans with a reused Planner and
// has the AOT cpu_tiled kernels write into its own output buffers, through views (nothing copied).
// Every step is checked against a naive softmax over the selected positions. Prints
// "N passed, M failed".
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "kvouter/aot.h"
#include "kvouter/aot_kernels.h"
#include "kvouter/plan.h"

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
        }
      }
      ++lens[b];
    }
  }

  void new_query_and_selection() {
    for (float& x : q) x = uniform();
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

}  // namespace

int main() {
  halide::register_generated_aot_kernels();
  auto backend = halide::make_aot_backend({"aot", "cpu_tiled", {}, ""});
  int passed = 0, failed = 0;
  (closed_form(*backend) ? passed : failed)++;

  Engine e;
  for (int i = 0; i < 5; ++i) e.append();  // a prefill of 5 tokens per sequence
  Planner planner(backend->plan_options());
  for (int step = 0; step < 40; ++step) {
    e.append();
    e.new_query_and_selection();
    const InputsView in = e.view();
    const Plan& plan = planner.plan_checked_tables(in);  // the engine wrote its tables itself
    backend->run_into(plan, in, OutputsView(TensorView<float>(e.out.data(), {Engine::B, Engine::Hq, Engine::D}),
                                            TensorView<float>(e.lse.data(), {Engine::B, Engine::Hq})));
    const double err = e.max_error();
    (err < 1e-4 ? passed : failed)++;
    if (err >= 1e-4) std::printf("decode step %d: max error %g\n", step, err);
  }
  std::printf("decode loop: 40 steps, lengths %d %d %d, %zu AOT variants\n", e.lens[0], e.lens[1], e.lens[2],
              halide::aot_variants().size());
  std::printf("%d passed, %d failed\n", passed, failed);
  return failed == 0 ? 0 : 1;
}
