// Uses the installed package only: build inputs, plan, run the generated cpu_tiled kernels, and
// compare with a closed-form softmax. Prints "1 passed, 0 failed" on success.
#include <cmath>
#include <cstdio>

#include "kvouter/aot.h"
#include "kvouter/aot_kernels.h"
#include "kvouter/plan.h"

int main() {
  using namespace kvouter;
  halide::register_generated_aot_kernels();
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
  auto backend = halide::make_aot_backend({"aot", "cpu_tiled", {}, ""});
  const Plan plan = make_plan(in, backend->plan_options());
  const Outputs out = backend->run(plan, in);
  const double w0 = std::exp(1 / std::sqrt(2.0)), w1 = 1.0;
  const bool ok = std::fabs(out.out.data[0] - (w0 + 3 * w1) / (w0 + w1)) < 1e-5 &&
                  std::fabs(out.out.data[1] - (2 * w0 + 4 * w1) / (w0 + w1)) < 1e-5 &&
                  std::fabs(out.lse.data[0] - std::log(w0 + w1)) < 1e-5;
  std::printf("consumer: out = (%f, %f) lse = %f, %zu AOT variants\n", out.out.data[0], out.out.data[1],
              out.lse.data[0], halide::aot_variants().size());
  std::printf("%d passed, %d failed\n", ok ? 1 : 0, ok ? 0 : 1);
  return ok ? 0 : 1;
}
