#include "roofline.h"

#include "kvouter/pool_memory.h"
#include "kvouter/stats.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <numeric>
#include <random>
#include <cstring>
#include <sstream>
#include <vector>

namespace kvouter::experiments {

namespace {

#if defined(__AVX512F__)
constexpr int kLanes = 16;
constexpr const char* kIsa = "avx512";
#elif defined(__AVX__)
constexpr int kLanes = 8;
constexpr const char* kIsa = "avx2";
#else
constexpr int kLanes = 4;
constexpr const char* kIsa = "sse";
#endif
typedef float vf __attribute__((vector_size(4 * kLanes)));

// 12 independent accumulator chains hide the FMA latency (4 cycles x 2 ports + margin). They must
// stay in registers: an asm barrier naming the accumulators as "+x" operands makes the compiler
// keep the array in memory and store every chain each iteration, and on a core with one 256-bit
// store a cycle (Zen 3) that halves the rate the probe reports. The barrier names the multiplier
// instead, which is enough to stop the loop being folded; the loop holds 14 vector registers.
__attribute__((noinline)) double fma_chains(int64_t iters, float seed) {
  vf a[12];
  for (int i = 0; i < 12; ++i) a[i] = vf{} + seed * static_cast<float>(i + 1);
  vf x = vf{} + 0.999999f;
  const vf y = vf{} + 1e-7f;
  for (int64_t n = 0; n < iters; ++n) {
#pragma GCC unroll 12
    for (int i = 0; i < 12; ++i) a[i] = a[i] * x + y;
    asm volatile("" : "+x"(x));
  }
  double s = 0;
  for (int i = 0; i < 12; ++i) s += a[i][0];
  return s;
}

template <class F>
double median_rate(F&& once, int reps) {
  std::vector<double> r;
  for (int i = 0; i < reps; ++i) r.push_back(once());
  return median(std::move(r));
}

}  // namespace

Roofline measure_roofline(double seconds_per_probe) {
  Roofline r;
  r.threads = omp_get_max_threads();
  r.isa = kIsa;
  using clock = std::chrono::steady_clock;
  // Calibrate iterations so that one probe lasts about seconds_per_probe / 5.
  int64_t iters = 1 << 20;
  for (;;) {
    const auto t0 = clock::now();
    fma_chains(iters, 1.f);
    const double s = std::chrono::duration<double>(clock::now() - t0).count();
    if (s > seconds_per_probe / 5) break;
    iters *= 2;
  }
  volatile double sink = 0;
  r.fma_gflops = median_rate(
      [&] {
        const auto t0 = clock::now();
        double acc = 0;
#pragma omp parallel reduction(+ : acc)
        acc += fma_chains(iters, 1.f + omp_get_thread_num());
        const double s = std::chrono::duration<double>(clock::now() - t0).count();
        sink = sink + acc;
        return 2.0 * 12 * kLanes * static_cast<double>(iters) * r.threads / s / 1e9;
      },
      5);

  const size_t n = size_t{1} << 27;  // 512 MiB of floats: far beyond any cache
  std::vector<float> buf(n);
#pragma omp parallel for
  for (size_t i = 0; i < n; ++i) buf[i] = static_cast<float>(i & 7);
  r.read_gbps = median_rate(
      [&] {
        const auto t0 = clock::now();
        double acc = 0;
        const size_t step = 4 * kLanes;
#pragma omp parallel reduction(+ : acc)
        {
          vf a0{}, a1{}, a2{}, a3{};
#pragma omp for
          for (size_t i = 0; i < n; i += step) {
            vf x0, x1, x2, x3;
            std::memcpy(&x0, &buf[i], sizeof(vf));
            std::memcpy(&x1, &buf[i + kLanes], sizeof(vf));
            std::memcpy(&x2, &buf[i + 2 * kLanes], sizeof(vf));
            std::memcpy(&x3, &buf[i + 3 * kLanes], sizeof(vf));
            a0 += x0; a1 += x1; a2 += x2; a3 += x3;
          }
          acc += (a0 + a1 + a2 + a3)[0];
        }
        const double s = std::chrono::duration<double>(clock::now() - t0).count();
        sink = sink + acc;
        return static_cast<double>(n * sizeof(float)) / s / 1e9;
      },
      5);
  return r;
}

double paged_read_gbps(size_t chunk_bytes, size_t pool_bytes, int reps, int ahead) {
  const size_t chunk = std::max<size_t>(chunk_bytes / (4 * kLanes * sizeof(float)), 1) * 4 * kLanes * sizeof(float);
  PoolMemory pool(pool_bytes);
  auto* base = static_cast<float*>(pool.data());
#pragma omp parallel for
  for (size_t i = 0; i < pool_bytes / sizeof(float); ++i) base[i] = static_cast<float>(i & 7);
  const size_t chunks = pool_bytes / chunk;
  std::vector<size_t> order(chunks);
  std::iota(order.begin(), order.end(), size_t{0});
  std::shuffle(order.begin(), order.end(), std::mt19937(7));
  const size_t per_rep = std::min<size_t>(chunks, (size_t{256} << 20) / chunk);  // 256 MiB a repetition
  volatile double sink = 0;
  int rep = 0;
  return median_rate(
      [&] {
        const size_t first = static_cast<size_t>(rep++) * per_rep;
        const auto t0 = std::chrono::steady_clock::now();
        double acc = 0;
#pragma omp parallel reduction(+ : acc)
        {
          vf a0{}, a1{}, a2{}, a3{};
#pragma omp for schedule(dynamic, 16)
          for (size_t c = 0; c < per_rep; ++c) {
            const float* p = base + order[(first + c) % chunks] * (chunk / sizeof(float));
            const char* later =
                ahead > 0 ? reinterpret_cast<const char*>(base + order[(first + c + static_cast<size_t>(ahead)) % chunks] *
                                                                     (chunk / sizeof(float)))
                          : nullptr;
            for (size_t i = 0; i < chunk / sizeof(float); i += 4 * kLanes) {
              if (later) {
                for (size_t b = 0; b < 4 * kLanes * sizeof(float); b += 64) __builtin_prefetch(later + i * sizeof(float) + b, 0, 2);
              }
              vf x0, x1, x2, x3;
              std::memcpy(&x0, p + i, sizeof(vf));
              std::memcpy(&x1, p + i + kLanes, sizeof(vf));
              std::memcpy(&x2, p + i + 2 * kLanes, sizeof(vf));
              std::memcpy(&x3, p + i + 3 * kLanes, sizeof(vf));
              a0 += x0; a1 += x1; a2 += x2; a3 += x3;
            }
          }
          acc += (a0 + a1 + a2 + a3)[0];
        }
        const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        sink = sink + acc;
        return static_cast<double>(per_rep * chunk) / s / 1e9;
      },
      reps);
}

double roofline_bound_ms(const Plan& plan, const Inputs& in, const Roofline& r) {
  // K/V and q read at their storage size (SPEC section 5), out written in float32.
  const double bytes = plan.kv_unit_bytes() +
                       static_cast<double>(in.q.numel()) * (dtype_bytes(plan.problem.dtype) + sizeof(float));
  return std::max(plan.flops() / (r.fma_gflops * 1e6), bytes / (r.read_gbps * 1e6));
}

std::string roofline_json(const Roofline& r) {
  std::ostringstream os;
  os << "{\"fp32_fma_gflops\": " << r.fma_gflops << ", \"read_gbps\": " << r.read_gbps
     << ", \"threads\": " << r.threads << ", \"isa\": \"" << r.isa << "\"}";
  return os.str();
}

}  // namespace kvouter::experiments
