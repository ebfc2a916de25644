#include "kvouter/halide_kernels.h"

#include "kvouter/knobs.h"

#include <HalideBuffer.h>

#include <algorithm>
#include <cctype>
#include <cstring>
#include <chrono>
#include <functional>
#include <limits>
#include <sstream>

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

double ms_between(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
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
  using clock = std::chrono::steady_clock;
  if (warm && kt.warmup_ms > 0) {
    const auto w0 = clock::now();
    do {
      fwd();
      comb();
    } while (ms_between(w0, clock::now()) < kt.warmup_ms);
  }
  rt.fwd.resize(static_cast<size_t>(std::max(kt.reps, 1)), 0.0);
  rt.comb.resize(rt.fwd.size(), 0.0);
  for (size_t r = 0; r < rt.fwd.size(); ++r) {
    const auto t0 = clock::now();
    fwd();
    const auto t1 = clock::now();
    comb();
    const auto t2 = clock::now();
    rt.fwd[r] += ms_between(t0, t1);
    rt.comb[r] += ms_between(t1, t2);
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
  using clock = std::chrono::steady_clock;
  auto t = clock::now();
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
  xfer += ms_between(t, clock::now());
  if (kt.warmup_ms > 0) {
    const auto w0 = clock::now();
    do {
      runner.launch();
    } while (ms_between(w0, clock::now()) < kt.warmup_ms);
  }
  RepTimes rt;
  for (int r = 0; r < std::max(kt.reps, 1); ++r) {
    runner.launch();
    rt.fwd.push_back(runner.timing().forward_ms);
    rt.comb.push_back(runner.timing().combine_ms);
  }
  t = clock::now();
  runner.read_outputs(res);
  xfer += ms_between(t, clock::now());
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

Specialization Specialization::of(const Plan& plan) {
  const Problem& p = plan.problem;
  return {static_cast<int>(p.D), static_cast<int>(p.page_size), static_cast<int>(p.block_size),
          static_cast<int>(p.qhead), static_cast<int>(plan.tiles.T), p.dtype};
}

Specialization Specialization::with_extents(const Plan& plan) const {
  Specialization s = *this;
  const Problem& p = plan.problem;
  s.tq = std::max<int64_t>(p.Tq, 1);
  s.hq = p.Hq;
  // Mullapudi2016 fails (with an empty message) on an input estimate of extent 1; inputs only
  // need an estimate of the right order, so these never drop below 2.
  s.hkv = std::max<int64_t>(p.Hkv, 2);
  s.pages = std::max<int64_t>(p.num_pages, 2);
  s.tiles = std::max<int64_t>(plan.tiles.num_tiles, 1);
  s.topk = std::max<int64_t>(p.topk, 2);
  return s;
}

std::string Specialization::str() const {
  std::ostringstream os;
  os << "D=" << D << ",page_size=" << page_size << ",block_size=" << block_size << ",qhead=" << qhead << ",T=" << T;
  if (dtype != Dtype::kFloat32) os << ",storage=" << dtype_name(dtype);
  if (tq) os << ",est_tq=" << tq << ",est_hq=" << hq << ",est_hkv=" << hkv << ",est_pages=" << pages << ",est_tiles=" << tiles << ",est_topk=" << topk;
  return os.str();
}

std::string variant_name(const std::string& schedule, const std::string& target, const Specialization& spec,
                         const std::vector<std::pair<std::string, std::string>>& knobs) {
  std::string name = "kvouter_" + schedule;
  if (spec.D == 0 && spec.page_size == 0 && spec.block_size == 0 && spec.qhead == 0 && spec.T == 0) {
    name += "_generic";
  } else {
    name += "_d" + std::to_string(spec.D) + "_p" + std::to_string(spec.page_size) + "_b" + std::to_string(spec.block_size) +
            "_q" + std::to_string(spec.qhead) + "_t" + std::to_string(spec.T);
  }
  std::string suffix;
  if (target != "host") suffix += "_" + target;
  for (const auto& [k, v] : knobs) suffix += "_" + k + "_" + v;
  if (spec.dtype != Dtype::kFloat32) suffix += "_storage_" + dtype_name(spec.dtype);
  for (char& c : suffix) {
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  }
  return name + suffix;
}

std::string storage_target(const std::string& target, Dtype dtype) {
  if (!is_vulkan_target(target) || dtype == Dtype::kFloat32) return target;
  return target + (dtype == Dtype::kFloat16 ? "-vk_float16-vk_int16" : "-vk_int16");
}

const std::vector<std::string>& knob_names() {
  static const std::vector<std::string> names = {"T", "chunk", "vec", "rows", "unroll", "grain", "slice"};
  return names;
}

std::map<std::string, std::string> checked_knobs(const std::map<std::string, std::string>& params) {
  namespace kd = knob_defaults;
  std::map<std::string, std::string> k = {{"T", std::to_string(kd::T)},         {"chunk", std::to_string(kd::chunk)},
                                          {"vec", std::to_string(kd::vec)},     {"rows", std::to_string(kd::rows)},
                                          {"unroll", std::to_string(kd::unroll)}, {"grain", std::to_string(kd::grain)},
                                          {"slice", std::to_string(kd::slice)}};
  for (const auto& [name, value] : params) {
    if (!k.count(name)) {
      std::string known;
      for (const auto& n : knob_names()) known += (known.empty() ? "" : ", ") + n;
      throw BackendError("--param " + name + ": unknown knob (known: " + known + ")");
    }
    long v = 0;
    try {
      size_t used = 0;
      v = std::stol(value, &used);
      if (used != value.size()) v = 0;
    } catch (...) {
      v = 0;
    }
    // 0: chosen by the planner / schedule (T, slice), the whole block (chunk), or sized to the
    // target (vec, rows, unroll).
    const long lowest = name == "grain" ? 1 : 0;
    if (value.empty() || v < lowest || v > 4096 || (v == 0 && value != "0")) {
      throw BackendError("--param " + name + ": expected an integer in [" + std::to_string(lowest) +
                         ", 4096], got '" + value + "'");
    }
    k[name] = std::to_string(v);
  }
  return k;
}

int64_t tile_edges_of(const std::map<std::string, std::string>& knobs) { return std::stol(knobs.at("T")); }

Outputs run_kernels(const Kernels& kernels, const Plan& plan, const InputsView& in, RunTiming* timing,
                    const KernelTiming& kt) {
  Outputs res = outputs_for(plan.problem);
  run_kernels(kernels, plan, in, res, timing, kt);
  return res;
}

void run_kernels(const Kernels& kernels, const Plan& plan, const InputsView& in, const OutputsView& res,
                 RunTiming* timing, const KernelTiming& kt) {
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
  Tensor<float> partials({tiles, T * p.qhead, C});
  if (ts.num_tiles == 0) mark_empty_partials(partials.data.data(), T * p.qhead, C, p.D);

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
        auto part = wrap(partials.ptr(), partials.shape);
        check_rc(kernels.forward(q, k, v, head, pages, query, limit, p.scale, part), "forward", kernels);
      },
      [&] {
        auto part = wrap(partials.ptr(), partials.shape);
        check_rc(kernels.combine(part, pidx, out, lse), "combine", kernels);
      });
  rt.into(timing);
  finish_lse(res.lse);
}

}  // namespace kvouter::halide
