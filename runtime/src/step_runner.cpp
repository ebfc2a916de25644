// DeviceStepRunner: a step's plan, uploads, kernels and read-back on a DeviceKvCache (kvouter/device_cache.h).
#include "kvouter/device_cache.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cstring>
#include <exception>
#include <limits>
#include <numeric>

#include "device_detail.h"
#include "kvouter/aot.h"
#include "kvouter/cuda_driver.h"
#include "kvouter/cuda_probe.h"
#include "kvouter/errors.h"
#include "kvouter/host_copy.h"
#include "kvouter/stats.h"
#include "kvouter/tile_layout.h"
#include "kvouter/variant.h"
#include "kvouter/vulkan_probe.h"
#include "kvouter/vulkan_readback.h"
#include "thread_pool.h"

namespace kvouter::halide {

using namespace device_detail;

// --- DeviceStepRunner --------------------------------------------------------------------------

// One segment's tiles of a batch (its own arrays, from tile 0: Halide 21's Vulkan device crops
// bind invalid descriptor ranges, docs/vulkan.md limit 13), and where its partials go.
struct SegmentTiles {
  explicit SegmentTiles(const DeviceArraySpec& a)
      : head(halide_type_of<int32_t>(), a, true, true), pages(halide_type_of<int32_t>(), a, true, true),
        query(halide_type_of<int32_t>(), a, true, true), limit(halide_type_of<int32_t>(), a, true, true),
        part(halide_type_of<float>(), a, false, true), to_tile(halide_type_of<int32_t>(), a),
        zeros(halide_type_of<int32_t>(), a) {}
  DeviceArray head, pages, query, limit, part, to_tile, zeros;
  int64_t n = 0, offset = 0;
  // (Hkv, topk, first tile, end tile) of the fixed decode layout whose tile_head and tile_query
  // head and query hold (they depend on nothing else), or -1s.
  std::array<int64_t, 4> decode_of{-1, -1, -1, -1};
};

// One query batch's device arrays (PlanOptions::max_batch_partial_floats), reused across steps.
struct DeviceStepRunner::Batch {
  explicit Batch(const DeviceArraySpec& a)
      : pidx(halide_type_of<int32_t>(), a, true, true), part(halide_type_of<float>(), a, false, true),
        out(halide_type_of<float>(), a, true, true), lse(halide_type_of<float>(), a, true, true),
        empty(halide_type_of<float>(), a, true, true) {}
  std::vector<std::unique_ptr<SegmentTiles>> seg;
  DeviceArray pidx, part, out, lse;
  DeviceArray empty;  // a batch with no tile: one tile of empty partials, for the combine
  halide_buffer_t* combine_part = nullptr;
  int64_t t0 = 0, t1 = 0;
};

namespace {

// Generated variants of one schedule for the plan at hand (aot_select), each wrapped once.
KernelPicker aot_picker(const std::string& schedule, const std::string& target, const std::string& name) {
  auto wrapped = std::make_shared<std::map<const AotVariant*, Kernels>>();
  return [=](const Plan& plan) -> const Kernels& {
    const AotVariant& v = aot_select(schedule, target, plan, name);
    check_generic_vulkan_loops(v, plan);
    auto it = wrapped->find(&v);
    if (it == wrapped->end()) it = wrapped->emplace(&v, aot_kernels(v)).first;
    return it->second;
  };
}

}  // namespace

int64_t DeviceStepRunner::max_batch_partial_floats(const std::string& target) {
  // Every batch's buffers within one device buffer and Halide's int32 indexing. (Halide 21's
  // Vulkan runtime failed to allocate 2.2 GB on the H200: device_malloc_failed; so below 2^31
  // bytes on both targets.)
  // Less 2^20 floats: the runner pads a batch's tiles to 16 (DeviceArray's whole_rows), and a
  // padded array must still fit (gpu-prefill's batches, planned to the limit itself, did not).
  int64_t most = (int64_t{1} << 29) - 16;
  if (is_vulkan_target(target)) most = std::min(most, vulkan_max_buffer_floats());
  return most - (int64_t{1} << 20);
}

DeviceStepRunner::DeviceStepRunner(DeviceKvCache& cache, const std::string& schedule,
                                   const std::map<std::string, std::string>& params)
    : cache_(cache) {
  std::map<std::string, std::string> knobs = params;
  std::string name;
  if (auto it = knobs.find("variant"); it != knobs.end()) {
    name = it->second;
    knobs.erase(it);
  }
  for (const auto& [k, v] : knobs) {
    if (k != "T") throw BackendError("--param " + k + ": the device step runs generated variants; only T and variant may be set");
    (void)v;
  }
  bool any = false;
  for (const auto& v : aot_variants()) any |= v.schedule == schedule && v.target == cache.target();
  if (!any) throw BackendError("device step: no generated kernel for schedule '" + schedule + "' and target '" + cache.target() + "'");
  pick_ = aot_picker(schedule, cache.target(), name);
  PlanOptions o{tile_edges_of(checked_knobs(knobs))};
  init(o);
  set_plan_tasks(default_plan_tasks(cache.target()));
}

DeviceStepRunner::DeviceStepRunner(DeviceKvCache& cache, KernelPicker pick, PlanOptions options)
    : cache_(cache), pick_(std::move(pick)) {
  init(options);
}

void DeviceStepRunner::init(PlanOptions o) {
  const int64_t most = max_batch_partial_floats(cache_.target());
  o.max_batch_partial_floats = o.max_batch_partial_floats > 0 ? std::min(o.max_batch_partial_floats, most) : most;
  // Decode steps in the fixed decode layout: no index, nothing sorted (plan.h).
  o.decode_layout = true;
  planner_ = Planner(o);
  decode_plan_on_device_ = default_decode_plan_on_device(cache_.target());
  q_ = std::make_unique<DeviceArray>(storage_type(cache_.shape().dtype), cache_.array_spec(), true, true);
  host_out_ = std::make_unique<PinnedHost>(cache_.array_spec().pin);
  overlap_parts_ = default_overlap_parts(cache_.target());
  outputs_in_place_on_ = default_outputs_in_place(cache_.target());
}

bool DeviceStepRunner::default_outputs_in_place(const std::string& target) {
  // Measured 2026-12-04 (H200, gpu-decode, 64-step loops on resident tables, medians, alternating
  // in one process; experiments/results/gpu/2026-12-04/gpu_bench_loop_outputs_in_place_barrier.json):
  // Vulkan float32 steps 2.289 / 2.402 / 2.380 ms with the outputs written in place against
  // 2.431 / 2.411 / 2.332 read back (bfloat16 2.402 / 2.442 / 2.438 against 2.424 / 2.449 /
  // 2.413): the combine's host writes and the host-read barrier (+0.10-0.16 ms) cost no more than
  // the read-back's copy and submission (0.16-0.18 ms), and the step is 1.13-1.17x its kernels
  // against 1.20-1.27x. CUDA reads back by DMA into page-locked memory, overlapped with other
  // parts' kernels in step_and_read.
  return is_vulkan_target(target);
}

int DeviceStepRunner::default_overlap_parts(const std::string& target) {
  // Measured 2026-12-04 (H200, gpu-decode, 64-step loops on resident tables, medians, each count
  // run twice in one call; experiments/results/gpu/2026-12-04/gpu_bench_loop_overlap_final.json):
  // 2 parts 0.817 / 0.816 ms a step in float32 (3: 0.822 / 0.877, 4: 0.815 / 0.828) and 0.770 /
  // 0.766 in bfloat16 (3: 0.786 / 0.785, 4: 0.789 / 0.800), against 0.970 / 0.929 and 0.883 /
  // 0.897 phase by phase (step()). Vulkan never runs in parts.
  return is_cuda_target(target) ? 2 : 1;
}

int DeviceStepRunner::default_plan_tasks(const std::string&) {
  // Measured 2026-12-04 (H200 host, 16 threads; Vulkan gpu-decode, 64-step loops on resident
  // tables, medians, each count twice in one process;
  // experiments/results/gpu/2026-12-04/gpu_bench_loop_plan_tasks.json): the plan took 0.186 /
  // 0.274 ms (float32) and 0.179 / 0.230 (bfloat16) on the calling thread, 0.175 / 0.174 and
  // 0.169 / 0.187 in 4 tasks, 0.179 / 0.150 and 0.159 / 0.203 in one per hardware thread (8
  // here: 128 queries, at least 16 a task): within the loops' spread beyond the calling thread,
  // so the default stays one per hardware thread. (CUDA builds a decode step's tiles on the
  // device where the tables are resident.)
  return 0;
}

void DeviceStepRunner::set_plan_tasks(int tasks) {
  if (tasks < 0) throw InputError("plan_tasks", "0 (one per hardware thread) or more", std::to_string(tasks));
  PlanOptions o = planner_.options();
  o.parallel_heads = tasks != 1;
  o.sequence_chunks = tasks;
  planner_.set_options(o);
}

void DeviceStepRunner::set_overlap_parts(int parts) {
  if (parts < 1) throw InputError("overlap_parts", "at least 1", std::to_string(parts));
  overlap_parts_ = parts;
}

DeviceStepRunner::~DeviceStepRunner() = default;

void DeviceStepRunner::write_block_tables(const TensorView<const int32_t>& tables) {
  if (tables.rank != 2 || !tables.row_major()) {
    throw InputError("block_tables", "a contiguous [B, max_pages] array", shape_str(tables));
  }
  const int64_t B = tables.dim(0), W = tables.dim(1), n = B * W, P = cache_.shape().num_pages;
  if (n > 0 && tables.data == nullptr) throw InputError("block_tables", "data", "a null pointer");
  if (n >= std::numeric_limits<int32_t>::max()) {
    throw InputError("block_tables", "fewer than 2^31 entries", shape_str(tables));
  }
  for (int64_t i = 0; i < n; ++i) {
    if (tables.data[i] >= P) {
      throw InputError("block_tables[" + std::to_string(i / W) + ", " + std::to_string(i % W) + "]",
                       "a page id < num_pages = " + std::to_string(P) + " (or negative)", std::to_string(tables.data[i]));
    }
  }
  if (!tables_) {
    const DeviceArraySpec& a = cache_.array_spec();
    tables_ = std::make_unique<DeviceArray>(halide_type_of<uint32_t>(), a);
    entry_values_ = std::make_unique<DeviceArray>(halide_type_of<uint32_t>(), a);
    entry_seqs_ = std::make_unique<DeviceArray>(halide_type_of<int32_t>(), a);
    entry_cols_ = std::make_unique<DeviceArray>(halide_type_of<int32_t>(), a);
  }
  tables_host_.assign(tables.data, tables.data + n);
  tables_B_ = B;
  tables_width_ = W;
  // (A [0, W] or [B, 0] table: one word on the device, never read.)
  has_tables_ = false;
  tables_->upload(tables_host_.data(), n, {std::max<int64_t>(B, 1), 1, std::max<int64_t>(W, 1), 1});
  check(dev_sync(tables_->buffer()), "uploading the block tables (sync)");
  has_tables_ = true;
}

void DeviceStepRunner::write_block_table_entries(const TensorView<const int32_t>& seqs,
                                                 const TensorView<const int32_t>& entries,
                                                 const TensorView<const int32_t>& pages) {
  if (!has_tables_) {
    throw InputError("block_tables", "written by write_block_tables before write_block_table_entries", "none");
  }
  const int64_t n = seqs.rank == 1 ? seqs.dim(0) : -1;
  if (n < 0 || !seqs.row_major()) throw InputError("seqs", "a contiguous [n] array", shape_str(seqs));
  const std::string count = "a contiguous [" + std::to_string(n) + "] array (one per entry)";
  if (entries.rank != 1 || entries.dim(0) != n || !entries.row_major()) throw InputError("entries", count, shape_str(entries));
  if (pages.rank != 1 || pages.dim(0) != n || !pages.row_major()) throw InputError("pages", count, shape_str(pages));
  if (n == 0) return;
  if (seqs.data == nullptr || entries.data == nullptr || pages.data == nullptr) {
    throw InputError(seqs.data == nullptr ? "seqs" : entries.data == nullptr ? "entries" : "pages", "data", "a null pointer");
  }
  const int64_t P = cache_.shape().num_pages;
  entry_keys_.resize(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const std::string at = "[" + std::to_string(i) + "]";
    if (seqs.data[i] < 0 || seqs.data[i] >= tables_B_) {
      throw InputError("seqs" + at, "a sequence in [0, " + std::to_string(tables_B_) + ")", std::to_string(seqs.data[i]));
    }
    if (entries.data[i] < 0 || entries.data[i] >= tables_width_) {
      throw InputError("entries" + at, "an entry in [0, " + std::to_string(tables_width_) + ")", std::to_string(entries.data[i]));
    }
    if (pages.data[i] >= P) {
      throw InputError("pages" + at, "a page id < num_pages = " + std::to_string(P) + " (or negative)", std::to_string(pages.data[i]));
    }
    entry_keys_[static_cast<size_t>(i)] = {int64_t{seqs.data[i]} * tables_width_ + entries.data[i], i};
  }
  if (const int64_t i = first_repeated_key(entry_keys_); i >= 0) {
    throw InputError("entries[" + std::to_string(i) + "]", "each (sequence, entry) once per call",
                     "sequence " + std::to_string(seqs.data[i]) + " entry " + std::to_string(entries.data[i]) + " again");
  }
  for (int64_t i = 0; i < n; ++i) tables_host_[static_cast<size_t>(seqs.data[i] * tables_width_ + entries.data[i])] = pages.data[i];
  // Each entry a row of one word, at (page = sequence, slot = entry) of the tables as a pool.
  const KvWriteFn& write = cache_.kit().writer(32);
  for (int64_t r0 = 0; r0 < n; r0 += kMaxRowsPerCall) {
    const int64_t m = std::min(kMaxRowsPerCall, n - r0);
    halide_buffer_t* rs = entry_seqs_->upload(seqs.data + r0, m, {m});
    halide_buffer_t* rc = entry_cols_->upload(entries.data + r0, m, {m});
    halide_buffer_t* rows = entry_values_->upload(pages.data + r0, m, {m, 1, 1});
    check(write(rows, rs, rc, tables_->buffer()), "writing block table entries");
  }
  check(dev_sync(tables_->buffer()), "writing block table entries (sync)");
}

bool DeviceStepRunner::default_decode_plan_on_device(const std::string& target) {
  // Measured 2026-12-03 (H200, gpu-decode, 64-step loops, medians;
  // experiments/results/gpu/2026-12-03/gpu_bench_loop_device_plan_one_kernel.json): on CUDA the
  // step took 1.138 / 1.048 ms (float32 / bfloat16) with the plan on the device against 1.259 /
  // 1.215 ms planned on the host; on Vulkan 3.708 / 3.712 ms against 3.508 / 3.293 ms (the
  // kernel's submission and wait in Halide 21's Vulkan runtime: 0.27-0.29 ms, the host plan
  // 0.16 ms).
  return is_cuda_target(target);
}

TensorView<const int32_t> DeviceStepRunner::block_tables() const {
  if (!has_tables_) return TensorView<const int32_t>(nullptr, {0, 0});
  return TensorView<const int32_t>(tables_host_.data(), {tables_B_, tables_width_});
}

void DeviceStepRunner::step(const StepInputs& s, bool check_block_tables) { step_with(s, check_block_tables, false); }

OutputsView DeviceStepRunner::step_and_read(const StepInputs& s, bool check_block_tables) {
  if (const std::optional<OutputsView> read = step_with(s, check_block_tables, true)) return *read;
  return read_outputs();
}

InputsView DeviceStepRunner::plan_view(const StepInputs& s, bool* check_block_tables) const {
  const DeviceCacheShape& cs = cache_.shape();
  // (The plan would name the pool's dtype, which the runner, not the caller, gives it.)
  if (s.q.dtype != cs.dtype) throw InputError("q", "dtype " + dtype_name(cs.dtype) + " (the cache's)", dtype_name(s.q.dtype));
  InputsView in;
  in.q = s.q;
  // The plan checks K/V's shape and dtype against the rest, and reads none of their elements.
  const void* kv = &kv_dummy_;
  TensorView<const void> pool(kv, {cs.num_pages, cs.Hkv, cs.page_size, cs.D});
  in.k_pages.data = pool.data;
  in.k_pages.rank = pool.rank;
  in.k_pages.shape = pool.shape;
  in.k_pages.strides = pool.strides;
  in.k_pages.dtype = cs.dtype;
  in.v_pages = in.k_pages;
  in.selected = s.selected;
  in.block_tables = s.block_tables;
  if (s.resident_tables) {
    if (s.block_tables.data != nullptr) {
      throw InputError("block_tables", "empty with resident_tables (the runner's tables are read)", shape_str(s.block_tables));
    }
    if (!has_tables_) throw InputError("block_tables", "written by write_block_tables before a step with resident_tables", "none");
    in.block_tables = block_tables();
    *check_block_tables = false;  // checked where they were written
  }
  in.cu_seqlens_q = s.cu_seqlens_q;
  in.used_kv_lens = s.used_kv_lens;
  in.block_size = s.block_size;
  in.page_size = cs.page_size;
  in.causal = s.causal;
  in.softmax_scale = s.softmax_scale;
  return in;
}

void DeviceStepRunner::forget_own_plan() {
  if (plan_ != &planner_.current()) return;  // a caller's plan (prepare) is not the planner's
  plan_ = nullptr;
  outputs_at_ = OutputsAt::kNone;
}

const Plan& DeviceStepRunner::prepared_plan(const char* call) const {
  if (!plan_) {
    throw BackendError(std::string("device step: ") + call +
                       " with no step prepared (none yet, or the last refused or replaced by host_plan)");
  }
  return *plan_;
}

const Plan& DeviceStepRunner::plan() const { return prepared_plan("plan()"); }

const Plan& DeviceStepRunner::host_plan(const StepInputs& s, bool check_block_tables) {
  const InputsView in = plan_view(s, &check_block_tables);
  forget_own_plan();
  return check_block_tables ? planner_.plan(in) : planner_.plan_checked_tables(in);
}

std::optional<OutputsView> DeviceStepRunner::step_with(const StepInputs& s, bool check_block_tables, bool overlap_asked) {
  Stopwatch t;
  const InputsView in = plan_view(s, &check_block_tables);
  // The planner writes over its last plan (a refused step too): that step's outputs and kernels
  // are gone with it.
  forget_own_plan();
  // On CUDA, q goes up beside the plan and the plan's arrays (a task each on Halide's thread
  // pool): the plan reads no q value, and q's copy is a DMA from page-locked staging that the host
  // only waits for. On Vulkan, a q in the runner's mapping is submitted before the plan (below,
  // start_q_upload); any other q joins the step's one batched submission in prepare_with().
  // A decode step's tiles are built on the device where its tables are (one segment: the
  // device plan addresses one pool).
  const bool on_device = s.resident_tables && decode_plan_on_device_ && cache_.segments() == 1 && cache_.kit().decode_plan;
  // step_and_read on CUDA: after the plan and its arrays, q's rows go up in parts on the runner's
  // streams, each part's kernels and read-back behind its rows (launch_overlapped). (Ahead of the
  // plan, q's copies held up the plan's arrays on the same copy engine: 0.09-0.14 ms of upload
  // instead of 0.03, experiments/results/gpu/2026-12-04/gpu_bench_loop_overlap_q_ahead.json.)
  const bool overlap = overlap_asked && is_cuda_target(cache_.target()) && overlap_parts_ > 1 && cache_.segments() == 1 &&
                       s.q.data != nullptr && s.q.data == q_->host_data() && ensure_streams(s.q);
  // A decode plan built on the device goes on the first part's stream (its selection's copy
  // asynchronous there, the kernel behind it), which the other parts then wait for.
  plan_on_stream_ = overlap && on_device;
  struct Unset {
    DeviceStepRunner* self;
    ~Unset() {
      // A step that throws with the plan's copy or kernel on the stream waits for them (the
      // selection's staging is the next step's).
      if (self->plan_on_stream_ && std::uncaught_exceptions() > 0) {
        try {
          self->streams_->sync(0);
        } catch (...) {  // (an exception is already on its way)
        }
      }
      self->plan_on_stream_ = false;
    }
  } unset{this};
  if (on_device && is_cuda_target(cache_.target())) {
    // In stream order: the selection's upload and the decode plan ahead of q's DMA, so that q's
    // copy is the only wait before the forward (beside it, the plan would wait for q's copy).
    const Plan& plan = planner_.plan_on_device(in);
    prepare_with(plan, pick_(plan), s.q, true, &in);
    const double arrays_ms = timing_.upload_ms;
    if (overlap && overlappable(plan)) {
      const double wall = t.lap_ms();
      timing_.plan_ms = std::min(plan.plan_ms + timing_.device_plan_ms, wall);
      timing_.upload_ms = wall - timing_.plan_ms;
      timing_.arrays_upload_ms = arrays_ms - timing_.device_plan_ms;
      return launch_overlapped(s.q);
    }
    if (plan_on_stream_) streams_->sync(0);  // (the plan on the stream; the kernels below on Halide's)
    Stopwatch tq;
    upload_q(s.q, nullptr);
    check(dev_sync(q_->buffer()), "uploads (sync)");
    timing_.q_upload_ms = tq.lap_ms();
    const double wall = t.lap_ms();
    timing_.plan_ms = std::min(plan.plan_ms + timing_.device_plan_ms, wall);
    timing_.upload_ms = wall - timing_.plan_ms;
    timing_.arrays_upload_ms = arrays_ms - timing_.device_plan_ms;
    launch();
    return std::nullopt;
  }
  // On Vulkan, a q that the engine wrote into the runner's mapping goes up while the host plans
  // (the plan reads no q value); the step waits for it before the plan's arrays go up. Whatever
  // happens, the copy is waited for before the step returns or throws.
  Stopwatch tq0;
  const bool q_ahead = q_ahead_on_ && start_q_upload(s.q);
  const double q_submit_ms = q_ahead ? tq0.lap_ms() : 0.0;
  struct QWait {
    UploadBatch* batch;
    ~QWait() {
      if (!batch) return;
      try {
        batch->finish();
      } catch (...) {  // (an exception is already on its way)
      }
    }
  } q_wait{q_ahead ? &q_ahead_ : nullptr};
  struct Tasks {
    DeviceStepRunner* self;
    const InputsView* in;
    // upload_q: CUDA, the plan's arrays uploaded by the plan's task; q_beside: q's upload beside it.
    bool check_block_tables, upload_q, q_beside, on_device;
    const Plan* plan = nullptr;
    const Kernels* kernels = nullptr;
    std::exception_ptr error[2];
    double q_ms = 0, arrays_ms = 0;
  } tasks{this, &in, check_block_tables, is_cuda_target(cache_.target()), is_cuda_target(cache_.target()) && !overlap,
          on_device, nullptr, nullptr, {}, 0, 0};
  halide_task_t task = [](void*, int i, uint8_t* closure) -> int {
    Tasks& c = *reinterpret_cast<Tasks*>(closure);
    try {
      if (i == 0) {
        Planner& pl = c.self->planner_;
        c.plan = c.on_device ? &pl.plan_on_device(*c.in) : c.check_block_tables ? &pl.plan(*c.in) : &pl.plan_checked_tables(*c.in);
        c.kernels = &c.self->pick_(*c.plan);  // before the timing: a refused variant is a planning error
        if (c.upload_q) {
          c.self->prepare_with(*c.plan, *c.kernels, c.in->q, true, c.in);
          c.arrays_ms = c.self->timing_.upload_ms;
        }
      } else if (c.q_beside) {
        Stopwatch tq;
        c.self->upload_q(c.in->q, nullptr);
        c.q_ms = tq.lap_ms();
      }
    } catch (...) {
      c.error[i] = std::current_exception();
    }
    return 0;
  };
  const int err = tasks.q_beside ? detail::par_for(task, 2, &tasks) : task(nullptr, 0, reinterpret_cast<uint8_t*>(&tasks));
  for (const std::exception_ptr& e : tasks.error) {
    if (e) std::rethrow_exception(e);  // the plan's error first
  }
  if (err != 0) throw std::runtime_error("device step: Halide's thread pool failed with " + std::to_string(err));
  if (tasks.upload_q && !tasks.q_beside) {
    // step_and_read's overlapped step: q goes up in parts after the plan; or, where the plan cannot
    // run in parts, whole, now.
    const double wall = t.lap_ms();
    timing_.plan_ms = std::min(tasks.plan->plan_ms + timing_.device_plan_ms, wall);
    timing_.upload_ms = wall - timing_.plan_ms;
    timing_.arrays_upload_ms = tasks.arrays_ms;
    if (overlappable(*tasks.plan)) {
      return launch_overlapped(s.q);
    }
    Stopwatch tq;
    upload_q(s.q, nullptr);
    check(dev_sync(q_->buffer()), "uploads (sync)");
    timing_.q_upload_ms = tq.lap_ms();
    timing_.upload_ms += timing_.q_upload_ms;
  } else if (tasks.upload_q) {
    check(dev_sync(q_->buffer()), "uploads (sync)");
    // The plan's own time (with its device part); the uploads are the rest of the wall time (both
    // beside q's).
    const double wall = t.lap_ms();
    timing_.plan_ms = std::min(tasks.plan->plan_ms + timing_.device_plan_ms, wall);
    timing_.upload_ms = wall - timing_.plan_ms;
    timing_.q_upload_ms = tasks.q_ms;
    timing_.arrays_upload_ms = tasks.arrays_ms;
  } else {
    const double plan_ms = t.lap_ms() - q_submit_ms;
    Stopwatch tq;
    if (q_ahead) q_ahead_.finish();
    const double q_wait_ms = tq.lap_ms();
    prepare_with(*tasks.plan, *tasks.kernels, s.q, q_ahead, &in);
    timing_.plan_ms = plan_ms + timing_.device_plan_ms;
    timing_.upload_ms -= timing_.device_plan_ms;
    if (q_ahead) {
      // q's copy ran beside the plan: its submission (or, where it could not go ahead, its whole
      // upload) and what was left of it after the plan count.
      timing_.q_upload_ms = q_submit_ms + q_wait_ms;
      timing_.upload_ms += q_submit_ms + q_wait_ms;
    }
  }
  launch();
  return std::nullopt;
}

void DeviceStepRunner::upload_q(const StorageView& sq, UploadBatch* batch) {
  const bool mapped = sq.data != nullptr && q_mapped_ && sq.data == q_mapped_->data();
  if (sq.data != nullptr && (sq.data == q_->host_data() || mapped) && !q_->fits(sq.shape_vec())) {
    // Larger than q_staging() was sized for: growing the staging would free what q views.
    throw InputError("q", "a view of the runner's q staging within the shape q_staging() was given",
                     shape_str(sq.shape_vec()));
  }
  if (mapped) {
    // Copied by the device from where the engine wrote it, its padding the mapping's zeros.
    q_->view(sq.shape_vec());
    const int64_t used = sq.numel() * sq.element_bytes();
    if (q_->view_bytes() <= 0 || q_mapped_->holds(sq.data, q_->view_bytes())) {
      q_dirty_ = std::max(q_dirty_, used);
      q_->upload(sq.data, sq.numel(), sq.shape_vec(), batch, q_mapped_.get());
      return;
    }
  }
  q_->upload(sq.data, sq.numel(), sq.shape_vec(), batch);
}

bool DeviceStepRunner::start_q_upload(const StorageView& sq) {
  // Only a q the engine wrote into the runner's mapping (q_staging()): copied by the device from
  // there, with nothing of the host's to keep until the wait. (Where it cannot go ahead, it goes
  // up here, waited for.)
  if (!is_vulkan_target(cache_.target()) || !q_mapped_ || sq.data == nullptr || sq.data != q_mapped_->data()) return false;
  // q's shape is checked with the plan (prepare_with), after this: only a q of the cache's head
  // dimension goes ahead (its dtype, checked by step(), and its byte count size what q_staging()
  // clears next).
  if (sq.rank != 3 || sq.shape[0] < 0 || sq.shape[1] <= 0 || sq.shape[2] != cache_.shape().D) return false;
  upload_q(sq, &q_ahead_);
  q_ahead_.submit();
  return true;
}

void DeviceStepRunner::prepare(const Plan& plan, const StorageView& q) {
  if (plan.tiles_on_device) {
    throw BackendError("device step: prepare() takes a plan with its tiles (Planner::plan_on_device's are built by step())");
  }
  prepare_with(plan, pick_(plan), q, false);
}

void DeviceStepRunner::prepare_with(const Plan& plan, const Kernels& kernels, const StorageView& sq, bool q_uploaded,
                                    const InputsView* in) {
  Stopwatch t;
  if (kernels.device != cache_.device()) {
    throw BackendError("device step: " + kernels.description() + " runs on another device than the cache's (" + cache_.target() + ")");
  }
  if (plan.problem.dtype != cache_.shape().dtype) {
    throw InputError("q", "dtype " + dtype_name(cache_.shape().dtype) + " (the cache's)", dtype_name(plan.problem.dtype));
  }
  const Problem& p = plan.problem;
  if (sq.rank != 3 || sq.shape[0] != p.Tq || sq.shape[1] != p.Hq || sq.shape[2] != p.D) {
    throw InputError("q", "shape " + shape_str({p.Tq, p.Hq, p.D}) + " (the plan's [Tq, Hq, D])", shape_str(sq.shape_vec()));
  }
  if (sq.dtype != p.dtype) throw InputError("q", "dtype " + dtype_name(p.dtype) + " (the plan's)", dtype_name(sq.dtype));
  // Checked: from here on the last step's outputs are not the ones read_outputs() would read.
  outputs_at_ = OutputsAt::kNone;
  timing_ = StepTiming{};
  plan_ = &plan;
  kernels_ = &kernels;
  const TileSet& ts = plan.tiles;
  const int64_t S = cache_.segments(), ppb = ts.ppb, T = std::max<int64_t>(ts.T, 1);
  const int64_t C = p.D + layout::kPartialExtra;
  if (!q_uploaded) upload_q(sq, &uploads_);
  const int64_t nb = p.Tq == 0 ? 0 : ts.batches();
  while (static_cast<int64_t>(batches_.size()) < nb) batches_.push_back(std::make_unique<Batch>(cache_.array_spec()));
  used_batches_ = nb;
  seg_count_.assign(static_cast<size_t>(nb * S), 0);
  for (int64_t b = 0; b < nb; ++b) {
    Batch& bt = *batches_[static_cast<size_t>(b)];
    const TileSet::Batch range = ts.batch(b, p.Tq);
    bt.t0 = range.t0;
    bt.t1 = range.t1;
    const int64_t tb = range.tile_begin, te = range.tile_end;
    const int64_t nq = bt.t1 - bt.t0, ranks = p.topk * S;
    while (static_cast<int64_t>(bt.seg.size()) < S) bt.seg.push_back(std::make_unique<SegmentTiles>(cache_.array_spec()));
    const int32_t* pidx = nullptr;  // the batch's partial index
    if (S == 1) {
      // One segment: the plan's own arrays, its partial index rebased to the batch's tiles.
      SegmentTiles& st = *bt.seg[0];
      st.n = te - tb;
      st.offset = 0;
      seg_count_[static_cast<size_t>(b)] = st.n;
      if (st.n > 0) {
        // The fixed decode layout's heads and queries are the same at every step of a shape:
        // uploaded once.
        const std::array<int64_t, 4> key{p.Hkv, p.topk, tb, te};
        if (plan.decode_layout && st.decode_of == key) {  // (the same tiles: the arrays fit as they are)
          st.head.view({st.n});
          st.query.view({st.n, T});
        } else {
          st.head.upload(ts.tile_head.data() + tb, st.n, {st.n}, &uploads_);
          st.query.upload(ts.tile_query.data() + tb * T, st.n * T, {st.n, T}, &uploads_);
          st.decode_of = plan.decode_layout ? key : std::array<int64_t, 4>{-1, -1, -1, -1};
        }
        if (plan.tiles_on_device) {
          build_tiles_on_device(plan, in, bt, st);
        } else {
          st.pages.upload(ts.tile_pages.data() + tb * ppb, st.n * ppb, {st.n, ppb}, &uploads_);
          st.limit.upload(ts.tile_limit.data() + tb * T, st.n * T, {st.n, T}, &uploads_);
        }
      }
      pidx = plan.tiles_on_device ? nullptr : ts.partial_index.data() + bt.t0 * p.Hkv * p.topk;
      if (pidx && tb != 0) {  // rebased to the batch's tiles
        pidx_.assign(pidx, pidx + nq * p.Hkv * p.topk);
        for (int32_t& x : pidx_) {
          if (x >= 0) x = static_cast<int32_t>(x - tb * T);
        }
        pidx = pidx_.data();
      }
    } else {
      build_segment_tiles(plan, b, tb, te);
      pidx = pidx_.data();  // (after: it may have grown)
    }
    const int64_t nt = std::accumulate(seg_count_.begin() + b * S, seg_count_.begin() + (b + 1) * S, int64_t{0});
    if (pidx && plan.decode_layout && S == 1) {
      // The padding rows name no partial (as the device's decode plan writes them): a padding
      // row's combine reads nothing (step_and_read's last part would otherwise read a tile the
      // first part's forward writes).
      const int64_t n = nq * p.Hkv * ranks, padded = (nq + 15) / 16 * 16 * p.Hkv * ranks;
      if (pidx != pidx_.data()) pidx_.assign(pidx, pidx + n);
      pidx_.resize(static_cast<size_t>(padded), layout::kNoPartial);
      bt.pidx.upload(pidx_.data(), padded, {nq, p.Hkv, ranks}, &uploads_);
    } else if (pidx) {
      bt.pidx.upload(pidx, nq * p.Hkv * ranks, {nq, p.Hkv, ranks}, &uploads_);  // else written on the device
    }
    bt.part.view({std::max<int64_t>(nt, 1), T * p.qhead, C});
    bt.out.view({nq, p.Hq, p.D});
    bt.lse.view({nq, p.Hq});
    bt.combine_part = bt.part.buffer();
    if (nt == 0) {
      // No tile: one tile of empty partials (every partial index is -1), so that the combine
      // writes zeros and an empty LSE.
      empty_.assign(static_cast<size_t>(T * p.qhead * C), 0.f);
      mark_empty_partials(empty_.data(), T * p.qhead, C, p.D);
      bt.combine_part = bt.empty.upload(empty_.data(), static_cast<int64_t>(empty_.size()), {1, T * p.qhead, C}, &uploads_);
    }
    uploads_.flush();  // this batch's arrays (the next batch reuses the host ones)
  }
  uploads_.flush();
  // (With q uploaded elsewhere, q's view may be changing on that thread: the caller syncs.)
  if (!q_uploaded) check(dev_sync(q_->buffer()), "uploads (sync)");
  timing_.upload_ms = t.lap_ms();
}

void DeviceStepRunner::build_tiles_on_device(const Plan& plan, const InputsView* in, Batch& bt, SegmentTiles& st) {
  if (in == nullptr) throw BackendError("device step: a plan whose tiles the device builds, outside step()");
  const Problem& p = plan.problem;
  const int64_t n = st.n, count = n + p.Tq;
  // The selection, then each query's L_b: one upload, in the step's submission.
  if (!step_ints_) step_ints_ = std::make_unique<DeviceArray>(halide_type_of<int32_t>(), cache_.array_spec());
  step_ints_->view({count});
  auto* h = static_cast<int32_t*>(step_ints_->host_data());
  std::memcpy(h, in->selected.data, static_cast<size_t>(n) * sizeof(int32_t));
  for (int64_t t = 0; t < p.Tq; ++t) h[n + t] = static_cast<int32_t>(p.kv_len[static_cast<size_t>(t)]);
  halide_buffer_t* ints = nullptr;
  if (plan_on_stream_) {
    // (The staging is page-locked: a DMA that the host does not wait for; the step's end waits
    // for the stream.)
    ints = step_ints_->view({count});
    const int64_t bytes = step_ints_->view_bytes();
    host_copy(reinterpret_cast<uint8_t*>(h) + count * 4, nullptr, bytes - count * 4);
    streams_->to_device(0, ints->device, h, static_cast<size_t>(bytes));
  } else {
    ints = step_ints_->upload(h, count, {count}, &uploads_);
    uploads_.flush();
  }
  Stopwatch t;
  const auto i32 = [](int64_t v) { return static_cast<int32_t>(v); };
  // The partial index as the kernel writes it: flat, padding rows included.
  const halide_buffer_t* pidx = bt.pidx.view({p.Tq, p.Hkv, p.topk});
  halide_buffer_t flat = *pidx;
  halide_dimension_t flat_dim{0, static_cast<int32_t>(pidx->number_of_elements()), 1, 0};
  flat.dim = &flat_dim;
  flat.dimensions = 1;
  {
    CudaStreamScope scope(plan_on_stream_ ? streams_->context() : nullptr, plan_on_stream_ ? streams_->stream(0) : nullptr);
    check(cache_.kit().decode_plan(ints, tables_->buffer(), i32(p.Tq), i32(p.Hkv), i32(p.topk), i32(p.block_size),
                                   i32(p.page_size), i32(p.num_pages), st.pages.view({n, p.ppb}), st.limit.view({n, 1}),
                                   &flat),
          "the decode plan");
  }
  // On CUDA the kernels run in stream order before q's copy and the forward (step() waits for q):
  // the time here is their issue; their run is in upload_ms. Elsewhere, to their end.
  if (!is_cuda_target(cache_.target())) check(dev_sync(bt.pidx.buffer()), "the decode plan (sync)");
  timing_.device_plan_ms = t.lap_ms();
}

void DeviceStepRunner::launch() {
  const Plan& plan = prepared_plan("launch()");
  outputs_at_ = OutputsAt::kNone;
  timing_.outputs_in_place = false;
  Stopwatch t;
  const Kernels& k = *kernels_;
  const Problem& p = plan.problem;
  const int64_t S = cache_.segments(), nb = used_batches_;
  halide_buffer_t* q = q_->buffer();
  const KvWriteFn* copy = S > 1 ? &cache_.kit().writer(32) : nullptr;
  for (int64_t b = 0; b < nb; ++b) {
    Batch& bt = *batches_[static_cast<size_t>(b)];
    for (int64_t sg = 0; sg < S; ++sg) {
      SegmentTiles& st = *bt.seg[static_cast<size_t>(sg)];
      if (st.n == 0) continue;
      // One segment: straight into the batch's partials. Several: into the segment's own, then
      // copied into place by the scatter kernel (the partials as rows of 32-bit words).
      halide_buffer_t* part = S == 1 ? bt.part.buffer() : st.part.buffer();
      check(k.forward(q, cache_.k_segment(sg), cache_.v_segment(sg), st.head.buffer(), st.pages.buffer(),
                      st.query.buffer(), st.limit.buffer(), p.scale, part),
            "forward of " + k.description());
      if (S > 1) {
        const int32_t row_words = part->dim[1].extent * part->dim[0].extent;
        // The segment's own tiles, not its padding.
        halide_dimension_t src_dims[3] = {{0, part->dim[0].extent, 1}, {0, part->dim[1].extent, part->dim[0].extent},
                                          {0, static_cast<int32_t>(st.n), row_words}};
        halide_buffer_t src = *part;
        src.type = halide_type_t(halide_type_uint, 32);
        src.dim = src_dims;
        src.dimensions = 3;
        halide_buffer_t* all = bt.part.buffer();
        halide_dimension_t dst_dims[4] = {{0, all->dim[0].extent, 1}, {0, 1, row_words},
                                          {0, all->dim[1].extent, all->dim[0].extent}, {0, all->dim[2].extent, row_words}};
        halide_buffer_t dst = *all;
        dst.type = src.type;
        dst.dim = dst_dims;
        dst.dimensions = 4;
        check((*copy)(&src, st.to_tile.buffer(), st.zeros.buffer(), &dst), "placing a segment's partials");
      }
    }
  }
  if (nb > 0) check(dev_sync(batches_[0]->combine_part), "forward (sync)");
  timing_.forward_ms = t.lap_ms();
  // On Vulkan, one batch's out and lse written by the combine into the runner's mapped host memory.
  const bool in_place = nb == 1 && p.Tq > 0 && outputs_in_place_on_ && is_vulkan_target(cache_.target()) &&
                        DeviceArray::fast_transfers() && alias_outputs(p, *batches_[0]);
  for (int64_t b = 0; b < nb; ++b) {
    Batch& bt = *batches_[static_cast<size_t>(b)];
    check(k.combine(bt.combine_part, bt.pidx.buffer(), in_place ? &out_in_place_ : bt.out.buffer(),
                    in_place ? &lse_in_place_ : bt.lse.buffer()),
          "combine of " + k.description());
  }
  if (nb > 0) check(dev_sync(in_place ? &out_in_place_ : batches_[0]->out.buffer()), "combine (sync)");
  // The combine's writes made visible to the host (Halide's launch records no barrier for them).
  if (in_place && !vulkan_host_read_barrier(*out_mapped_)) {
    throw BackendError("device step: making the outputs visible to the host failed");
  }
  timing_.outputs_in_place = in_place;
  timing_.combine_ms = t.lap_ms();
  outputs_at_ = in_place ? OutputsAt::kMapping : OutputsAt::kDevice;
}

// A segmented pool: each segment's tiles (a tile per segment its pages reach, the other segments'
// pages masked), concatenated, and the partial index over S * topk ranks (rank s * topk + k: the
// edge's partial in segment s).
void DeviceStepRunner::build_segment_tiles(const Plan& plan, int64_t b, int64_t tb, int64_t te) {
  const Problem& p = plan.problem;
  const TileSet& ts = plan.tiles;
  Batch& bt = *batches_[static_cast<size_t>(b)];
  const int64_t S = cache_.segments(), segp = cache_.segment_pages(), ppb = ts.ppb, T = std::max<int64_t>(ts.T, 1);
  const int64_t C = p.D + layout::kPartialExtra, nq = bt.t1 - bt.t0, ranks = p.topk * S;
  head_.clear();
  pages_.clear();
  query_.clear();
  limit_.clear();
  copy_of_.assign(static_cast<size_t>((te - tb) * S), -1);
  for (int64_t sg = 0; sg < S; ++sg) {
    const int64_t lo = sg * segp, hi = lo + segp;
    for (int64_t i = tb; i < te; ++i) {
      bool reach = false;
      for (int64_t k = 0; k < ppb; ++k) {
        const int32_t pg = ts.tile_pages[static_cast<size_t>(i * ppb + k)];
        reach |= pg >= lo && pg < hi;
      }
      if (!reach) continue;
      copy_of_[static_cast<size_t>((i - tb) * S + sg)] = static_cast<int32_t>(head_.size());
      head_.push_back(ts.tile_head[static_cast<size_t>(i)]);
      for (int64_t k = 0; k < ppb; ++k) {
        const int32_t pg = ts.tile_pages[static_cast<size_t>(i * ppb + k)];
        pages_.push_back(pg >= lo && pg < hi ? static_cast<int32_t>(pg - lo) : layout::kNoPage);
      }
      query_.insert(query_.end(), ts.tile_query.begin() + i * T, ts.tile_query.begin() + (i + 1) * T);
      limit_.insert(limit_.end(), ts.tile_limit.begin() + i * T, ts.tile_limit.begin() + (i + 1) * T);
      ++seg_count_[static_cast<size_t>(b * S + sg)];
    }
  }
  pidx_.assign(static_cast<size_t>(nq * p.Hkv * ranks), -1);
  for (int64_t tq = 0; tq < nq; ++tq) {
    for (int64_t h = 0; h < p.Hkv; ++h) {
      for (int64_t k = 0; k < p.topk; ++k) {
        const int32_t x = ts.partial_index[static_cast<size_t>(((bt.t0 + tq) * p.Hkv + h) * p.topk + k)];
        if (x < 0) continue;
        const int64_t tile = x / T - tb, slot = x % T;
        for (int64_t sg = 0; sg < S; ++sg) {
          const int32_t c = copy_of_[static_cast<size_t>(tile * S + sg)];
          if (c >= 0) pidx_[static_cast<size_t>((tq * p.Hkv + h) * ranks + sg * p.topk + k)] = static_cast<int32_t>(c * T + slot);
        }
      }
    }
  }
  // Where each segment's partials go in the batch's: tiles [offset, offset + n) (the sources of a
  // batch's uploads stay as they are until its flush).
  iota_.resize(static_cast<size_t>(std::accumulate(seg_count_.begin() + b * S, seg_count_.begin() + (b + 1) * S, int64_t{0})));
  std::iota(iota_.begin(), iota_.end(), 0);
  int64_t off = 0;
  for (int64_t sg = 0; sg < S; ++sg) {
    SegmentTiles& st = *bt.seg[static_cast<size_t>(sg)];
    st.n = seg_count_[static_cast<size_t>(b * S + sg)];
    st.offset = off;
    off += st.n;
    if (st.n == 0) continue;
    st.decode_of = {-1, -1, -1, -1};
    st.head.upload(head_.data() + st.offset, st.n, {st.n}, &uploads_);
    st.pages.upload(pages_.data() + st.offset * ppb, st.n * ppb, {st.n, ppb}, &uploads_);
    st.query.upload(query_.data() + st.offset * T, st.n * T, {st.n, T}, &uploads_);
    st.limit.upload(limit_.data() + st.offset * T, st.n * T, {st.n, T}, &uploads_);
    st.to_tile.upload(iota_.data() + st.offset, st.n, {st.n}, &uploads_);
    st.zeros.upload(nullptr, 0, {st.n}, &uploads_);
    st.part.view({st.n, T * p.qhead, C});
  }
}

void DeviceStepRunner::require_outputs() const {
  prepared_plan("read_outputs()");
  if (outputs_at_ == OutputsAt::kNone) {
    throw BackendError("device step: read_outputs() after a step whose kernels did not run (refused, or prepared only)");
  }
}

OutputsView DeviceStepRunner::read_outputs() {
  require_outputs();
  if (outputs_at_ == OutputsAt::kMapping) {
    // Written by the combine where the engine reads: SPEC's -inf for empty rows, nothing copied.
    Stopwatch t;
    finish_lse(in_place_views_.lse);
    timing_.readback_ms = t.lap_ms();
    return in_place_views_;
  }
  const OutputsView v = own_outputs(plan_->problem);
  read_into(v, true);
  return v;
}

bool DeviceStepRunner::alias_outputs(const Problem& p, Batch& bt) {
  // out's and lse's padded rows (the combine writes them all), lse at the next 256 bytes (any
  // storage buffer offset alignment).
  const int64_t out_bytes = bt.out.view_bytes(), lse_at = (out_bytes + 255) / 256 * 256, lse_bytes = bt.lse.view_bytes();
  if (!vulkan_copies_serve(bt.out.buffer())) return false;
  if (!out_mapped_) out_mapped_ = std::make_unique<VulkanMappedBuffer>();
  auto* base = static_cast<float*>(out_mapped_->reserve(lse_at + lse_bytes));
  if (!base) return false;
  if (!out_alias_) out_alias_ = std::make_unique<VulkanMappedAlias>();
  if (!lse_alias_) lse_alias_ = std::make_unique<VulkanMappedAlias>();
  if (!out_alias_->point_at(*out_mapped_, 0, out_bytes, bt.out.buffer()) ||
      !lse_alias_->point_at(*out_mapped_, lse_at, lse_bytes, bt.lse.buffer())) {
    return false;
  }
  auto alias = [](const halide_buffer_t& v, const VulkanMappedAlias& a, halide_dimension_t* dims, halide_buffer_t* b) {
    *b = v;
    for (int i = 0; i < v.dimensions; ++i) dims[i] = v.dim[i];
    b->dim = dims;
    b->device = a.device();
    b->host = nullptr;
    b->flags = 0;
  };
  alias(*bt.out.buffer(), *out_alias_, out_in_place_dims_, &out_in_place_);
  alias(*bt.lse.buffer(), *lse_alias_, lse_in_place_dims_, &lse_in_place_);
  in_place_views_ = OutputsView(TensorView<float>(base, {p.Tq, p.Hq, p.D}), TensorView<float>(base + lse_at / 4, {p.Tq, p.Hq}));
  return true;
}

OutputsView DeviceStepRunner::own_outputs(const Problem& p) {
  const size_t n_out = static_cast<size_t>(p.Tq * p.Hq * p.D), n_lse = static_cast<size_t>(p.Tq * p.Hq);
  const size_t floats = std::max<size_t>(n_out + n_lse, 1);
  const size_t bytes = (floats + floats / 4) * sizeof(float);
  float* base = nullptr;
  if (is_vulkan_target(cache_.target()) && DeviceArray::fast_transfers()) {
    // Read back into mapped memory of our own: the device's copies land where the engine reads.
    if (!out_mapped_) out_mapped_ = std::make_unique<VulkanMappedBuffer>();
    base = static_cast<float*>(out_mapped_->reserve(static_cast<int64_t>(bytes)));
  }
  if (!base) base = reinterpret_cast<float*>(host_out_->reserve(bytes));
  return OutputsView(TensorView<float>(base, {p.Tq, p.Hq, p.D}), TensorView<float>(base + n_out, {p.Tq, p.Hq}));
}

namespace {

// Rows [r0, r1) of a device view's outermost dimension, as a view of their own from row 0 (the
// device address moved to r0: CUDA's pointer arithmetic), with no host memory.
halide_buffer_t rows_of(const halide_buffer_t& v, int64_t r0, int64_t r1, halide_dimension_t* dims) {
  halide_buffer_t b = v;
  for (int i = 0; i < v.dimensions; ++i) dims[i] = v.dim[i];
  halide_dimension_t& outer = dims[v.dimensions - 1];
  b.device = v.device + static_cast<uint64_t>(r0 * outer.stride * v.type.bytes());
  outer.min = 0;
  outer.extent = static_cast<int32_t>(r1 - r0);
  b.dim = dims;
  b.host = nullptr;
  b.flags = 0;
  return b;
}

}  // namespace

// Part i of `parts` of Tq queries, in units of 16 (the arrays' padded rows, DeviceArray's
// whole_rows; the last part runs to Tq). With three parts or more the first and the last are one
// unit each and the others share the rest evenly: only the first part's q rows and the last
// part's out/lse rows are not hidden behind kernels, and they are then the fewest.
std::pair<int64_t, int64_t> DeviceStepRunner::overlap_part(int64_t i, int64_t parts, int64_t Tq) {
  const int64_t units = (Tq + 15) / 16;
  auto start = [&](int64_t j) -> int64_t {  // the first unit of part j (j = parts: units)
    if (parts < 3 || units < parts) return units * j / parts;
    if (j == 0) return 0;
    if (j == parts) return units;
    return 1 + (units - 2) * (j - 1) / (parts - 2);
  };
  return {start(i) * 16, i + 1 == parts ? Tq : start(i + 1) * 16};
}

bool DeviceStepRunner::ensure_streams(const StorageView& sq) {
  if (sq.rank != 3 || sq.shape[0] < 32 || !q_->fits(sq.shape_vec())) return false;
  const int64_t parts = std::min<int64_t>(overlap_parts_, (sq.shape[0] + 15) / 16);
  const uint64_t dev = q_->view(sq.shape_vec())->device;
  // (The streams they replace are waited for as they go.)
  if (!streams_ || streams_->size() < parts || !streams_->owns(dev)) streams_ = std::make_unique<CudaStreams>(dev, static_cast<int>(parts));
  return true;
}

void DeviceStepRunner::start_overlapped_q(const StorageView& sq) {
  const DeviceCacheShape& cs = cache_.shape();
  if (!q_->fits(sq.shape_vec())) {  // (prepare_with checked q's shape against the plan's)
    throw InputError("q", "a view of the runner's q staging within the shape q_staging() was given", shape_str(sq.shape_vec()));
  }
  const int64_t Tq = sq.shape[0], parts = std::min<int64_t>(overlap_parts_, (Tq + 15) / 16);
  halide_buffer_t* q = q_->view(sq.shape_vec());
  const int64_t row_bytes = sq.shape[1] * cs.D * dtype_bytes(cs.dtype);
  const int64_t used = Tq * row_bytes, padded = q_->view_bytes();
  auto* host = static_cast<uint8_t*>(q_->host_data());
  host_copy(host + used, nullptr, padded - used);  // the padding rows, zeros
  for (int64_t i = 0; i < parts; ++i) {
    const auto [t0, t1] = overlap_part(i, parts, Tq);
    const int64_t end = i + 1 == parts ? padded : t1 * row_bytes;
    streams_->to_device(static_cast<int>(i), q->device + static_cast<uint64_t>(t0 * row_bytes), host + t0 * row_bytes,
                        static_cast<size_t>(end - t0 * row_bytes));
  }
  q_parts_ = parts;
}

bool DeviceStepRunner::overlappable(const Plan& plan) const {
  const Problem& p = plan.problem;
  return plan.decode_layout && std::max<int64_t>(plan.tiles.T, 1) == 1 && used_batches_ == 1 &&
         cache_.segments() == 1 && batches_[0]->seg[0]->n == p.Tq * p.Hkv * p.topk && batches_[0]->t0 == 0 &&
         batches_[0]->t1 == p.Tq && p.Tq >= 32 && overlap_parts_ > 1;
}

OutputsView DeviceStepRunner::launch_overlapped(const StorageView& sq) {
  Stopwatch t;
  // Every part's rows first: the copy engine runs them back to back while the host launches the
  // kernels behind them.
  start_overlapped_q(sq);
  // Whatever fails, nothing of this step is still running on the streams when the error leaves.
  struct Drain {
    CudaStreams* streams;
    int64_t parts;
    bool armed = true;
    ~Drain() {
      for (int64_t i = 0; armed && i < parts; ++i) {
        try {
          streams->sync(static_cast<int>(i));
        } catch (...) {  // (an exception is already on its way)
        }
      }
    }
  } drain{streams_.get(), q_parts_};
  const Plan& plan = *plan_;
  const Kernels& k = *kernels_;
  const Problem& p = plan.problem;
  Batch& bt = *batches_[0];
  SegmentTiles& st = *bt.seg[0];
  const int64_t parts = q_parts_;
  halide_buffer_t* q = q_->buffer();
  const OutputsView out = own_outputs(p);
  const int64_t per_query = p.Hkv * p.topk;  // tiles (T = 1)
  halide_buffer_t* part_all = bt.part.buffer();
  const halide_buffer_t* out_all = bt.out.buffer();
  const halide_buffer_t* lse_all = bt.lse.buffer();
  // Every other part waits for what the first part's stream holds before any kernel goes there:
  // the decode plan where it was built on the device, and the first part's q rows (the last
  // part's padding tiles read query 0's row).
  for (int64_t i = 1; i < parts; ++i) streams_->after(0, static_cast<int>(i));
  for (int64_t i = 0; i < parts; ++i) {
    const bool last = i + 1 == parts;
    const auto [t0, t1] = overlap_part(i, parts, p.Tq);
    const int s = static_cast<int>(i);
    // The plan's arrays first (a decode plan built on the device: the first part's stream holds
    // it, waited for above).
    if (!plan_on_stream_) streams_->after_default(s);
    // The part's tiles and query rows; the last part's views run to the arrays' padded ends.
    auto rows = [&, t0 = t0, t1 = t1](DeviceArray& a, int64_t per, halide_dimension_t* d) {
      const halide_buffer_t& v = *a.buffer();
      return rows_of(v, t0 * per, last ? v.dim[v.dimensions - 1].extent : t1 * per, d);
    };
    halide_dimension_t dh[4], dp[4], dq[4], dl[4], dpart[4], dx[4], dout[4], dlse[4];
    halide_buffer_t head = rows(st.head, per_query, dh), pages = rows(st.pages, per_query, dp);
    halide_buffer_t query = rows(st.query, per_query, dq), limit = rows(st.limit, per_query, dl);
    halide_buffer_t part = rows(bt.part, per_query, dpart), pidx = rows(bt.pidx, 1, dx);
    halide_buffer_t out_rows = rows(bt.out, 1, dout), lse_rows = rows(bt.lse, 1, dlse);
    {
      CudaStreamScope scope(streams_->context(), streams_->stream(s));
      check(k.forward(q, cache_.k_segment(0), cache_.v_segment(0), &head, &pages, &query, &limit, p.scale, &part),
            "forward of " + k.description());
      // (The partial index names tiles of the whole batch: the part's own.)
      check(k.combine(part_all, &pidx, &out_rows, &lse_rows), "combine of " + k.description());
    }
    streams_->to_host(s, out.out.ptr() + t0 * p.Hq * p.D, out_all->device + static_cast<uint64_t>(t0 * p.Hq * p.D * 4),
                      static_cast<size_t>((t1 - t0) * p.Hq * p.D) * sizeof(float));
    streams_->to_host(s, out.lse.ptr() + t0 * p.Hq, lse_all->device + static_cast<uint64_t>(t0 * p.Hq * 4),
                      static_cast<size_t>((t1 - t0) * p.Hq) * sizeof(float));
  }
  drain.armed = false;
  for (int64_t i = 0; i < parts; ++i) streams_->sync(static_cast<int>(i));
  finish_lse(out.lse);
  timing_.overlap_parts = static_cast<int>(parts);
  timing_.overlapped_ms = t.lap_ms();
  outputs_at_ = OutputsAt::kDevice;
  return out;
}

void* DeviceStepRunner::q_staging(int64_t Tq, int64_t Hq) {
  const DeviceCacheShape& cs = cache_.shape();
  if (Tq < 0) throw InputError("q", "a non-negative query count", std::to_string(Tq));
  if (Hq <= 0 || Hq % cs.Hkv != 0) throw InputError("q", "a head count that is a multiple of Hkv = " + std::to_string(cs.Hkv), std::to_string(Hq));
  q_->view({Tq, Hq, cs.D});
  if (is_vulkan_target(cache_.target())) {
    // The engine writes q where the device copies it from. Past the shape's elements, up to the
    // padded view, the mapping holds zeros (cleared where an earlier, larger shape was written).
    if (!q_mapped_) q_mapped_ = std::make_unique<VulkanMappedBuffer>();
    const int64_t bytes = q_->view_bytes(), used = Tq * Hq * cs.D * dtype_bytes(cs.dtype);
    const int64_t before = q_mapped_->size();
    if (auto* m = static_cast<uint8_t*>(q_mapped_->reserve(bytes))) {
      if (q_mapped_->size() != before) q_dirty_ = bytes;  // a new mapping: all of it unknown
      if (q_dirty_ > used) std::memset(m + used, 0, static_cast<size_t>(q_dirty_ - used));
      q_dirty_ = used;
      return m;
    }
  }
  return q_->host_data();
}

void DeviceStepRunner::read_outputs(const OutputsView& out) {
  require_outputs();
  check_outputs(out, plan_->problem);
  read_into(out, false);
}

void DeviceStepRunner::read_into(const OutputsView& out, bool direct) {
  Stopwatch t;
  const Problem& p = plan_->problem;
  if (p.Tq == 0) return;
  if (outputs_at_ == OutputsAt::kMapping) {
    host_copy(out.out.ptr(), in_place_views_.out.ptr(), in_place_views_.out.numel() * static_cast<int64_t>(sizeof(float)));
    host_copy(out.lse.ptr(), in_place_views_.lse.ptr(), in_place_views_.lse.numel() * static_cast<int64_t>(sizeof(float)));
    finish_lse(out.lse);
    timing_.readback_ms = t.lap_ms();
    return;
  }
  bool done = false;
  if (out_mapped_ && out_mapped_->holds(out.out.ptr(), 0)) {
    // Into the mapping: every batch's out and lse in one submission.
    reads_.clear();
    for (int64_t b = 0; b < used_batches_; ++b) {
      Batch& bt = *batches_[static_cast<size_t>(b)];
      reads_.push_back(bt.out.read_of(out.out.ptr() + bt.t0 * p.Hq * p.D));
      reads_.push_back(bt.lse.read_of(out.lse.ptr() + bt.t0 * p.Hq));
    }
    done = vulkan_read_device(reads_, *out_mapped_);
  }
  for (int64_t b = 0; b < used_batches_ && !done; ++b) {
    Batch& bt = *batches_[static_cast<size_t>(b)];
    bt.out.download(out.out.ptr() + bt.t0 * p.Hq * p.D, direct);
    bt.lse.download(out.lse.ptr() + bt.t0 * p.Hq, direct);
  }
  finish_lse(out.lse);
  timing_.readback_ms = t.lap_ms();
}

}  // namespace kvouter::halide
