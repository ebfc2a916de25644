// fuzz_validate_plan: validation, the index and the tiles on fuzzed inputs. Small dimensions and
// arrays full of holes, negatives, huge values and wrong shapes come from the FuzzedDataProvider;
// validate() may only throw InputError. When it accepts, build_kvouter_index and build_tiles
// (several T) and make_plan must hold every invariant of plan_invariants.h, and the plan's
// attended pairs must equal a brute-force count of SPEC §2.
#include <algorithm>
#include <fuzzer/FuzzedDataProvider.h>

#include <cmath>
#include <limits>

#include "HalideBuffer.h"
#include "fuzz_common.h"
#include "kvouter/errors.h"
#include "kvouter/tile_layout.h"
#include "kvouter_decode_plan_host.h"
#include "plan_invariants.h"

namespace {

using namespace kvouter;

constexpr int32_t kI32Max = std::numeric_limits<int32_t>::max();
constexpr int32_t kI32Min = std::numeric_limits<int32_t>::min();

// An int32 array entry: mostly in [lo, hi) (the valid range), else one of the values that break
// things (negative, the first invalid one, extremes) or anything at all.
int32_t entry(FuzzedDataProvider& fdp, int64_t lo, int64_t hi) {
  switch (fdp.ConsumeIntegralInRange<int>(0, 7)) {
    case 0:
      return -1;
    case 1:
      return static_cast<int32_t>(hi);
    case 2:
      return fdp.PickValueInArray({kI32Max, kI32Min, kI32Max - 1, -2});
    case 3:
      return fdp.ConsumeIntegral<int32_t>();
    default:
      return hi > lo ? static_cast<int32_t>(fdp.ConsumeIntegralInRange<int64_t>(lo, hi - 1)) : -1;
  }
}

// An extent: usually the wanted one, sometimes off by one, zero, negative or huge.
int64_t extent(FuzzedDataProvider& fdp, int64_t want, bool corrupt) {
  if (!corrupt || fdp.ConsumeIntegralInRange<int>(0, 15) != 0) return want;
  return fdp.PickValueInArray<int64_t>({want + 1, want - 1, 0, -1, kI32Max, int64_t{1} << 31,
                                        int64_t{1} << 40, std::numeric_limits<int64_t>::max()});
}

// A tensor whose data holds `count` elements but whose shape may disagree (rank or extents).
template <class T>
Tensor<T> tensor(FuzzedDataProvider& fdp, std::vector<int64_t> shape, bool corrupt) {
  Tensor<T> t;
  int64_t n = 1;
  for (int64_t e : shape) n *= e;
  t.data.assign(static_cast<size_t>(n), T{});
  for (int64_t& e : shape) e = extent(fdp, e, corrupt);
  if (corrupt && fdp.ConsumeIntegralInRange<int>(0, 31) == 0) {
    if (fdp.ConsumeBool())
      shape.push_back(1);
    else if (!shape.empty())
      shape.pop_back();
  }
  t.shape = std::move(shape);
  return t;
}

Inputs fuzzed_inputs(FuzzedDataProvider& fdp) {
  Inputs in;
  const bool corrupt = fdp.ConsumeBool();  // shapes may disagree with each other and the data
  const int64_t B = fdp.ConsumeIntegralInRange<int64_t>(0, 4);
  const int64_t Hkv = fdp.ConsumeIntegralInRange<int64_t>(0, 3);
  const int64_t Hq = Hkv * fdp.ConsumeIntegralInRange<int64_t>(0, 3) +
                     (fdp.ConsumeIntegralInRange<int>(0, 15) == 0);
  const int64_t D = fdp.ConsumeIntegralInRange<int64_t>(0, 3);
  in.page_size = fdp.PickValueInArray<int64_t>({1, 2, 3, 4, 8, 0, -4});
  in.block_size =
      in.page_size * fdp.PickValueInArray<int64_t>({1, 2, 3, 4}) +
      (fdp.ConsumeIntegralInRange<int>(0, 15) == 0 ? fdp.PickValueInArray<int64_t>({1, -1, -64})
                                                   : 0);
  const int64_t page_size = std::max<int64_t>(in.page_size, 1);
  const int64_t ppb = std::max<int64_t>(in.block_size / page_size, 1);
  const int64_t max_pages = fdp.ConsumeIntegralInRange<int64_t>(0, 12);
  const int64_t num_pages = fdp.ConsumeIntegralInRange<int64_t>(0, 10);
  const int64_t topk = fdp.ConsumeIntegralInRange<int64_t>(0, 5);
  const int64_t msb = max_pages / ppb;

  // Query counts per sequence, then cu_seqlens_q (valid or not).
  std::vector<int64_t> qo(static_cast<size_t>(B));
  int64_t Tq = 0;
  for (auto& n : qo) Tq += n = fdp.ConsumeIntegralInRange<int64_t>(0, 4);
  in.cu_seqlens_q = tensor<int64_t>(fdp, {B + 1}, corrupt);
  for (size_t b = 0; b < in.cu_seqlens_q.data.size(); ++b) {
    in.cu_seqlens_q.data[b] = b == 0 ? 0 : in.cu_seqlens_q.data[b - 1] + qo[b - 1];
  }
  if (fdp.ConsumeIntegralInRange<int>(0, 7) == 0 && !in.cu_seqlens_q.data.empty()) {
    const size_t i = fdp.ConsumeIntegralInRange<size_t>(0, in.cu_seqlens_q.data.size() - 1);
    in.cu_seqlens_q.data[i] = fdp.PickValueInArray<int64_t>(
        {-1, Tq + 1, in.cu_seqlens_q.data[i] - 1, std::numeric_limits<int64_t>::max(),
         std::numeric_limits<int64_t>::min()});
  }

  in.q = tensor<float>(fdp, {Tq, Hq, D}, corrupt);
  in.k_pages = tensor<float>(fdp, {num_pages, Hkv, page_size, D}, corrupt);
  in.v_pages = tensor<float>(fdp, {num_pages, Hkv, page_size, D}, corrupt);
  in.block_tables = tensor<int32_t>(fdp, {B, max_pages}, corrupt);
  for (auto& x : in.block_tables.data) x = entry(fdp, 0, num_pages);
  in.selected = tensor<int32_t>(fdp, {Tq, Hkv, topk}, corrupt);
  for (auto& x : in.selected.data) x = entry(fdp, 0, msb);
  if (fdp.ConsumeBool()) {
    in.used_kv_lens = tensor<int32_t>(fdp, {B}, corrupt);
    for (auto& x : in.used_kv_lens->data) x = entry(fdp, 0, msb * in.block_size + 1);
  }
  in.causal = fdp.ConsumeBool();
  if (fdp.ConsumeBool()) {
    in.softmax_scale =
        fdp.PickValueInArray<float>({0.5f, 0.f, -1.f, std::numeric_limits<float>::infinity(),
                                     std::numeric_limits<float>::quiet_NaN(), 1e30f});
  }
  return in;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider fdp(data, size);
  const Inputs in = fuzzed_inputs(fdp);
  Problem p;
  try {
    p = validate(in);
  } catch (const InputError&) {
    return 0;
  }
  FUZZ_CHECK(std::isfinite(p.scale), "validated scale is not finite");
  const KvIndex ix = build_kvouter_index(in, p);
  const int64_t attended = fuzz::check_index(in, p, ix);
  for (int64_t T : {int64_t{1}, int64_t{2}, int64_t{3}, int64_t{16}, auto_tile_edges(ix)}) {
    fuzz::check_tiles(in, p, ix, build_tiles(p, ix, T), T);
  }
  const int64_t T = fdp.ConsumeIntegralInRange<int64_t>(0, 5);
  const Plan plan = make_plan(in, {T});
  FUZZ_CHECK(plan.index.edge_query == ix.edge_query && plan.index.edge_limit == ix.edge_limit,
             "make_plan's index differs from build_kvouter_index's");
  fuzz::check_tiles(in, plan.problem, plan.index, plan.tiles, T > 0 ? T : auto_tile_edges(ix));
  FUZZ_CHECK(plan.attended_pairs == attended, "attended pairs %lld, SPEC count %lld",
             static_cast<long long>(plan.attended_pairs), static_cast<long long>(attended));
  if (is_decode_step(p)) {
    // The fixed decode layout: each rank's tile is what the index's partial of that rank is.
    PlanOptions o;
    o.decode_layout = true;
    o.parallel_heads = fdp.ConsumeBool();
    Planner planner(o);
    const Plan& f = planner.plan(in);
    const Plan ip = make_plan(in, {1});
    FUZZ_CHECK(f.decode_layout && f.units == ip.units && f.attended_pairs == attended, "decode layout counts differ");
    const size_t n = static_cast<size_t>(p.Tq * p.Hkv * p.topk), ppb = static_cast<size_t>(p.ppb);
    FUZZ_CHECK(f.tiles.num_tiles == static_cast<int64_t>(n) && f.tiles.partial_index.size() == n &&
                   f.tiles.tile_pages.size() == n * ppb && f.tiles.tile_limit.size() == n,
               "decode layout sizes");
    for (size_t i = 0; i < n; ++i) {
      const int32_t x = ip.tiles.partial_index[i];
      FUZZ_CHECK(f.tiles.tile_head[i] == static_cast<int32_t>((i / p.topk) % p.Hkv) &&
                     f.tiles.tile_query[i] == static_cast<int32_t>(i / (p.topk * p.Hkv)),
                 "decode layout tile %zu: head or query", i);
      if (x < 0) {
        FUZZ_CHECK(f.tiles.partial_index[i] < 0 && f.tiles.tile_limit[i] == 0, "decode layout rank %zu attends", i);
        continue;
      }
      const size_t xs = static_cast<size_t>(x);
      FUZZ_CHECK(f.tiles.partial_index[i] == static_cast<int32_t>(i) && f.tiles.tile_limit[i] == ip.tiles.tile_limit[xs] &&
                     std::equal(f.tiles.tile_pages.begin() + i * ppb, f.tiles.tile_pages.begin() + (i + 1) * ppb,
                                ip.tiles.tile_pages.begin() + xs * ppb),
                 "decode layout rank %zu differs from the index's partial %d", i, x);
    }
    // The step runner's decode plan (generators/kvouter_decode_plan, generated for the host) on
    // the same step: the same arrays, and its padding rows empty. Its tables hold only entries
    // the runner accepts (a page id below num_pages, or negative).
    bool accepted = true;
    for (int32_t e : in.block_tables.data) accepted &= e < p.num_pages;
    if (accepted && n > 0) {
      std::vector<int32_t> ints(in.selected.data.begin(), in.selected.data.end());
      for (int64_t t = 0; t < p.Tq; ++t) ints.push_back(static_cast<int32_t>(p.kv_len[static_cast<size_t>(t)]));
      std::vector<uint32_t> words(in.block_tables.data.begin(), in.block_tables.data.end());
      if (words.empty()) words.push_back(0);
      Halide::Runtime::Buffer<int32_t> step(ints.data(), static_cast<int>(ints.size()));
      Halide::Runtime::Buffer<uint32_t> tables(words.data(), 1, std::max<int>(static_cast<int>(p.max_pages), 1), 1,
                                               std::max<int>(static_cast<int>(p.B), 1));
      const int pad = 5;
      Halide::Runtime::Buffer<int32_t> pages(static_cast<int>(ppb), static_cast<int>(n) + pad);
      Halide::Runtime::Buffer<int32_t> limit(1, static_cast<int>(n) + pad);
      Halide::Runtime::Buffer<int32_t> pidx(static_cast<int>(n) + pad);
      const int rc = kvouter_decode_plan_host(step, tables, static_cast<int32_t>(p.Tq), static_cast<int32_t>(p.Hkv),
                                              static_cast<int32_t>(p.topk), static_cast<int32_t>(p.block_size),
                                              static_cast<int32_t>(p.page_size), static_cast<int32_t>(p.num_pages), pages,
                                              limit, pidx);
      FUZZ_CHECK(rc == 0, "decode plan kernel returned %d", rc);
      for (size_t i = 0; i < n + pad; ++i) {
        const bool real = i < n;
        FUZZ_CHECK(limit(0, static_cast<int>(i)) == (real ? f.tiles.tile_limit[i] : 0) &&
                       pidx(static_cast<int>(i)) == (real ? f.tiles.partial_index[i] : layout::kNoPartial),
                   "decode plan kernel: tile %zu's limit or partial index", i);
        for (size_t j = 0; j < ppb; ++j) {
          FUZZ_CHECK(pages(static_cast<int>(j), static_cast<int>(i)) == (real ? f.tiles.tile_pages[i * ppb + j] : layout::kNoPage),
                     "decode plan kernel: tile %zu page %zu", i, j);
        }
      }
    }
  }
  return 0;
}
