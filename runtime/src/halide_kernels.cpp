#include "kvouter/halide_kernels.h"

#include <HalideBuffer.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <limits>

#include "kvouter/device_cache.h"
#include "kvouter/errors.h"
#include "kvouter/stats.h"
#include "kvouter/tile_layout.h"

namespace kvouter::halide {

using Halide::Runtime::Buffer;

namespace {

std::vector<int> halide_sizes(const std::vector<int64_t>& shape) {
  std::vector<int> sizes;
  for (auto it = shape.rbegin(); it != shape.rend(); ++it) {
    if (*it > std::numeric_limits<int32_t>::max()) {
      throw BackendError("halide: an extent of " + std::to_string(*it) + " exceeds Halide's int32 extents");
    }
    sizes.push_back(static_cast<int>(*it));
  }
  return sizes;
}

// A C-order array [n0, n1, ..., nk] is the Halide buffer (nk, ..., n1, n0).
template <class T>
Buffer<T> wrap(const T* data, std::vector<int64_t> shape) {
  return Buffer<T>(const_cast<T*>(data), halide_sizes(shape));
}

Buffer<void> wrap_storage(const StorageView& v) {
  return Buffer<void>(storage_type(v.dtype), const_cast<void*>(v.data), halide_sizes(v.shape_vec()));
}

void check_rc(int rc, const char* stage, const Kernels& k) {
  if (rc != 0) {
    throw BackendError(std::string("halide: ") + stage + " of " + k.description() + " failed with code " + std::to_string(rc));
  }
}

// Per-repetition kernel times, summed over a plan's query batches (each batch runs every
// repetition on its own buffers, so a repetition's time is its batches' sum).
struct RepTimes {
  std::vector<double> fwd, comb;
  void into(RunTiming* t) const {
    t->forward_all = fwd;
    t->combine_all = comb;
    t->forward_ms = median(fwd);
    t->combine_ms = median(comb);
  }
};

// Runs `fwd` then `comb` as `kt` asks: first (when `warm`) untimed for at least kt.warmup_ms,
// then kt.reps times, timed. Each callable synchronises with its device before returning.
void run_timed(const KernelTiming& kt, bool warm, RepTimes& rt, const std::function<void()>& fwd,
               const std::function<void()>& comb) {
  if (warm && kt.warmup_ms > 0) {
    const Stopwatch w;
    do {
      fwd();
      comb();
    } while (w.ms() < kt.warmup_ms);
  }
  rt.fwd.resize(static_cast<size_t>(std::max(kt.reps, 1)), 0.0);
  rt.comb.resize(rt.fwd.size(), 0.0);
  for (size_t r = 0; r < rt.fwd.size(); ++r) {
    Stopwatch t;
    fwd();
    rt.fwd[r] += t.lap_ms();
    comb();
    rt.comb[r] += t.lap_ms();
  }
}

// A GPU run as an engine makes it (kvouter/device_cache.h): the case's pool as a device cache,
// with the pages the plan's tiles read written in place (page ids kept: nothing is compacted);
// then the step runner's uploads, the kernels as `kt` asks, and the read-back of out/lse. The
// cache, the page writes, the uploads and the read-back are the run's transfer time.
void run_on_device(const Kernels& kernels, const Plan& plan, const InputsView& in, const OutputsView& res,
                   RunTiming* timing, const KernelTiming& kt) {
  if (!kernels.kit) throw BackendError("halide: " + kernels.description() + " runs on a device, but has no device kit");
  const Problem& p = plan.problem;
  Stopwatch t;
  double xfer = 0;
  DeviceKvCache cache(kernels.kit, {std::max<int64_t>(p.num_pages, 1), p.Hkv, p.page_size, p.D, p.dtype});
  std::vector<int32_t> pages;  // each page a tile reads, once
  std::vector<uint8_t> seen(static_cast<size_t>(p.num_pages), 0);
  for (const int32_t pg : plan.tiles.tile_pages) {
    if (pg < 0 || seen[static_cast<size_t>(pg)]) continue;
    seen[static_cast<size_t>(pg)] = 1;
    pages.push_back(pg);
  }
  if (!pages.empty()) {
    cache.write_pool_pages(TensorView<const int32_t>(pages.data(), {static_cast<int64_t>(pages.size())}), in.k_pages,
                           in.v_pages);
  }
  DeviceStepRunner runner(cache, [&kernels](const Plan&) -> const Kernels& { return kernels; }, PlanOptions{});
  runner.prepare(plan, in.q);
  xfer += t.ms();
  if (kt.warmup_ms > 0) {
    const Stopwatch w;
    do {
      runner.launch();
    } while (w.ms() < kt.warmup_ms);
  }
  RepTimes rt;
  for (int r = 0; r < std::max(kt.reps, 1); ++r) {
    runner.launch();
    rt.fwd.push_back(runner.timing().forward_ms);
    rt.comb.push_back(runner.timing().combine_ms);
  }
  t.restart();
  runner.read_outputs(res);
  xfer += t.ms();
  rt.into(timing);
  timing->transfer_ms = xfer;
}

}  // namespace

// q, K or V in their storage dtype: float32, float16, or bfloat16 as its uint16 bits (the
// pipelines' input types, generators/kvouter_forward_generator.cpp).
halide_type_t storage_type(Dtype t) {
  switch (t) {
    case Dtype::kFloat16: return halide_type_t(halide_type_float, 16);
    case Dtype::kBFloat16: return halide_type_t(halide_type_uint, 16);
    case Dtype::kFloat32: break;
  }
  return halide_type_of<float>();
}

// Kernels emit kMaskedScore (finite) as the LSE of an empty row: GPU backends do not promise IEEE
// infinities inside kernels, so SPEC's -inf is produced here, on the host, for every backend.
void finish_lse(const TensorView<float>& lse) {
  for (int64_t i = 0; i < lse.numel(); ++i) {
    float& x = lse.data[i];
    if (x <= layout::kEmptyThreshold) x = -std::numeric_limits<float>::infinity();
  }
}


Outputs run_kernels(const Kernels& kernels, const Plan& plan, const InputsView& in, RunTiming* timing,
                    const KernelTiming& kt) {
  Outputs res = outputs_for(plan.problem);
  run_kernels(kernels, plan, in, res, timing, kt);
  return res;
}

void run_kernels(const Kernels& kernels, const Plan& plan, const InputsView& in, const OutputsView& res,
                 RunTiming* timing, const KernelTiming& kt, HostArray<float>* scratch) {
  const Problem& p = plan.problem;
  const TileSet& ts = plan.tiles;
  check_outputs(res, p);
  *timing = RunTiming{0, 0, timing->compile_ms, 0, {}, {}};
  if (p.Tq == 0) return;
  const int64_t row_floats = p.qhead * (p.D + layout::kPartialExtra);
  int64_t batch_partials = std::max<int64_t>(ts.num_partials(), 1) * row_floats;
  if (kernels.device) {
    batch_partials = 0;
    for (size_t b = 0; b + 1 < ts.batch_tile_begin.size(); ++b) {
      batch_partials = std::max(batch_partials, (ts.batch_tile_begin[b + 1] - ts.batch_tile_begin[b]) * ts.T * row_floats);
    }
  }
  if (batch_partials > std::numeric_limits<int32_t>::max()) {
    throw BackendError("halide: the partials of this plan hold " + std::to_string(batch_partials) +
                       " floats, beyond Halide's int32 buffer indexing; plan with query batches "
                       "(PlanOptions::max_batch_partial_floats) or run fewer queries per call");
  }
  if (kernels.device) return run_on_device(kernels, plan, in, res, timing, kt);

  const int64_t C = p.D + layout::kPartialExtra;
  // Partials in the tile layout [tiles, T * qhead, C]. With no tile at all, one tile of empty
  // edges keeps the combine's buffers non-empty (of the plan's T, which a combine may be
  // specialised to).
  const int64_t tiles = std::max<int64_t>(ts.num_tiles, 1), T = std::max<int64_t>(ts.T, 1);
  const std::vector<int64_t> part_shape{tiles, T * p.qhead, C};
  const size_t part_floats = static_cast<size_t>(tiles * T * p.qhead * C);
  HostArray<float> own;
  HostArray<float>& store = scratch ? *scratch : own;
  if (store.size() < part_floats) {
    HostArray<float>().swap(store);  // (grown without copying the old contents)
    store.resize(part_floats);
  }
  float* partials = store.data();
  if (ts.num_tiles == 0) {
    std::fill_n(partials, part_floats, 0.f);
    mark_empty_partials(partials, T * p.qhead, C, p.D);
  }

  auto pidx = wrap(ts.partial_index.data(), {p.Tq, p.Hkv, p.topk});
  auto out = wrap(res.out.ptr(), res.out.shape_vec());
  auto lse = wrap(res.lse.ptr(), res.lse.shape_vec());
  RepTimes rt;
  run_timed(
      kt, true, rt,
      [&] {
        if (ts.num_tiles == 0) return;
        auto q = wrap_storage(in.q);
        auto k = wrap_storage(in.k_pages);
        auto v = wrap_storage(in.v_pages);
        auto head = wrap(ts.tile_head.data(), {ts.num_tiles});
        auto pages = wrap(ts.tile_pages.data(), {ts.num_tiles, ts.ppb});
        auto query = wrap(ts.tile_query.data(), {ts.num_tiles, ts.T});
        auto limit = wrap(ts.tile_limit.data(), {ts.num_tiles, ts.T});
        auto part = wrap(partials, part_shape);
        check_rc(kernels.forward(q, k, v, head, pages, query, limit, p.scale, part), "forward", kernels);
      },
      [&] {
        auto part = wrap(partials, part_shape);
        check_rc(kernels.combine(part, pidx, out, lse), "combine", kernels);
      });
  rt.into(timing);
  finish_lse(res.lse);
}

}  // namespace kvouter::halide
