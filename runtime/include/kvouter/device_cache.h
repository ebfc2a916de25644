// A device-resident paged KV cache and a step runner over it, for the GPU targets (host-vulkan,
// host-cuda): FlashInfer's shape. The K and V pools are allocated on the device once; pages and
// appended tokens are written in place by a scatter kernel (generators/kvouter_kv_write); a step
// uploads only q, the plan's arrays and the query's partial index, runs forward and combine on
// device buffers, and reads out/lse back only when asked. Nothing is compacted per step. With the
// block tables resident in the runner (write_block_tables, StepInputs::resident_tables), a decode
// step's plan arrays are built on the device (generators/kvouter_decode_plan) from the step's
// selection and lengths, one upload.
//
// Every GPU run goes through these two classes: the 'aot' and 'jit' backends' GPU kernels too
// (halide_kernels.cpp), with the kernels and writers of their own runtime (a DeviceKit), so that
// `kvouter run`, the benchmarks, the sweeps and the tuner run the engine's path.
//
// A pool larger than one device buffer (the device's storage-buffer limit, or 2^31 bytes, the most
// Halide 21 addresses without large_buffers) is held in segments of whole pages. A step then runs
// the forward once per segment that its tiles reach, each over its tiles with the other segments'
// pages masked as unallocated, into partials of its own, which the scatter kernel then places in
// one partials buffer (not through device crops: Halide 21's Vulkan runtime binds a crop with an
// offset past its own buffer, docs/vulkan.md limit 13); the combine merges a query's partials
// across the segments by the same log-sum-exp rule (SPEC section 2), so a block whose pages
// straddle two segments is still exact.
//
// Neither class is thread-safe; separate caches and runners may be used from separate threads.
#pragma once

#include <HalideRuntime.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "kvouter/backend.h"
#include "kvouter/cuda_driver.h"
#include "kvouter/halide_kernels.h"
#include "kvouter/vulkan_readback.h"
#include "kvouter/plan.h"

namespace kvouter::halide {

struct DeviceCacheShape {
  int64_t num_pages = 0, Hkv = 0, page_size = 0, D = 0;
  Dtype dtype = Dtype::kFloat32;
};

// Where a DeviceArray lives: the device, the most one of its buffers may hold, and whether its
// host staging is page-locked (CUDA: copies by DMA, kvouter/cuda_driver.h).
struct DeviceArraySpec {
  const halide_device_interface_t* dev = nullptr;
  int64_t max_bytes = 0;
  bool pin = false;
  // For a target (host-vulkan: one descriptor's range and below 2^31 bytes, since Halide 21's
  // Vulkan runtime failed to allocate 2.2 GB on the H200; host-cuda: Halide's int32 indexing).
  static DeviceArraySpec of(const std::string& target, const halide_device_interface_t* dev);
};

// Host memory for device copies, grown on demand (its contents then lost, zeroed), page-locked
// when asked and the device is CUDA's (kvouter/cuda_driver.h: copied by DMA).
class PinnedHost {
 public:
  explicit PinnedHost(bool pin) : pin_(pin) {}
  ~PinnedHost();
  PinnedHost(const PinnedHost&) = delete;
  PinnedHost& operator=(const PinnedHost&) = delete;
  // At least `bytes`.
  uint8_t* reserve(size_t bytes);
  uint8_t* data() { return bytes_.data(); }

 private:
  bool pin_, pinned_ = false;
  std::vector<uint8_t> bytes_;
};

// A scratch array on the device: a halide_buffer_t whose device allocation holds `capacity`
// bytes, viewed at any shape that fits (views share the allocation, at offset 0).
class DeviceArray;

// Uploads gathered for one submission at flush() (Vulkan: vulkan_write_device, all of them
// through one staging copy and one wait; elsewhere each array's own copy). The sources must stay
// valid until flush(), and each array is uploaded once per batch (its view is read at flush()).
class UploadBatch {
 public:
  void flush();
  // flush() without its wait where every upload is copied from one mapping on Vulkan
  // (vulkan_write_device_async): true, and finish() waits (the sources stay as they are until
  // then). Otherwise flush(), and false.
  bool submit();
  void finish();

 private:
  friend class DeviceArray;
  const std::vector<VulkanWrite>& gather();  // writes_ made from pending_
  struct Pending {
    DeviceArray* array;
    const void* data;
    int64_t count;
    const VulkanMappedBuffer* from;  // data lies in it (copied from there, no host copy)
  };
  std::vector<Pending> pending_;
  std::vector<VulkanWrite> writes_;  // pending_'s, for vulkan_write_device (reused)
  bool in_flight_ = false;            // submitted, not yet finished
};

class DeviceArray {
 public:
  // whole_rows: every view's outermost extent is padded to whole 64-byte lines of rows (16 rows of
  // 4-byte elements), zeros where uploaded: the step runner's arrays, as the kernels need them
  // (Halide 21's Vulkan allocator, and the schedules that size intermediates by these extents;
  // docs/vulkan.md limits 1, 2 and 15). A download copies the unpadded rows.
  DeviceArray(halide_type_t type, const DeviceArraySpec& spec, bool host_staging = true, bool whole_rows = false);
  ~DeviceArray();
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;

  // A view of `shape` (C order; its outermost extent padded with whole_rows), growing the
  // allocation (its contents lost) when it is too small.
  halide_buffer_t* view(const std::vector<int64_t>& shape);
  // view(shape), with `count` elements from `data` copied to the device (the rest zero): at once,
  // or, given a batch, at the batch's flush().
  // With `from` (Vulkan), data lies in that mapping, zeros after its `count` elements up to the
  // view's padded size: a batch's copy reads it there.
  halide_buffer_t* upload(const void* data, int64_t count, const std::vector<int64_t>& shape,
                          UploadBatch* batch = nullptr, const VulkanMappedBuffer* from = nullptr);
  // Copies the view's elements (without padding rows) back into `dst`: through the host staging,
  // or with `direct` by the device's copy straight into `dst` (page-locked memory, as the step
  // runner's read_outputs() reads into, takes the DMA at full rate).
  void download(void* dst, bool direct = false);
  // The view's elements (without padding rows) as one read of a batched Vulkan read-back.
  VulkanRead read_of(void* dst) const { return {&alloc_, elements_ * type_.bytes(), dst}; }
  int64_t view_bytes() const;  // the view's bytes with padding rows, rounded to 64
  // The host staging (nullptr without one): page-locked on CUDA; valid until the allocation grows.
  void* host_data() { return staging_ ? host_.data() : nullptr; }
  // Whether a view of `shape` fits the allocation as it is (view() would not grow it).
  bool fits(const std::vector<int64_t>& shape) const;
  halide_buffer_t* buffer() { return &view_; }
  int64_t capacity_bytes() const { return capacity_; }
  // Vulkan read-backs and batched uploads through our own staging (vulkan_read_device,
  // vulkan_write_device; on by default); off: Halide's copy_to_host and copy_to_device.
  static void set_fast_transfers(bool on);
  static bool fast_transfers() { return fast_transfers_; }

 private:
  friend class UploadBatch;
  void reserve(int64_t bytes);
  void upload_now(const void* data, int64_t count);
  static std::atomic<bool> fast_transfers_;
  halide_type_t type_;
  DeviceArraySpec spec_;
  bool staging_;
  bool whole_rows_;
  int64_t elements_ = 0;  // the view's elements before padding
  std::vector<int64_t> shape_;  // the view's shape after padding (reused)
  PinnedHost host_;  // the staging (page-locked where spec_.pin)
  int64_t capacity_ = 0;
  halide_buffer_t alloc_{};    // the allocation (1-D, capacity bytes)
  halide_buffer_t view_{};     // the current view
  halide_dimension_t dims_[4]{};
  halide_dimension_t alloc_dim_{};
};

class DeviceKvCache {
 public:
  // target: "host-vulkan" or "host-cuda". segment_pages: pages per device buffer; 0 = as many as
  // one buffer holds. Throws BackendError without a device of that kind, InputError on a bad shape.
  DeviceKvCache(const std::string& target, const DeviceCacheShape& shape, int64_t segment_pages = 0);
  // The same on a kit's device, with its writers (a JIT-compiled kit: the JIT's kernels read it).
  DeviceKvCache(std::shared_ptr<const DeviceKit> kit, const DeviceCacheShape& shape, int64_t segment_pages = 0);
  ~DeviceKvCache();
  DeviceKvCache(const DeviceKvCache&) = delete;
  DeviceKvCache& operator=(const DeviceKvCache&) = delete;

  // Whole pages: pages[i] gets k[i] and v[i], each [n, Hkv, page_size, D] in the cache's dtype.
  void write_pages(const TensorView<const int32_t>& pages, const StorageView& k, const StorageView& v);
  // Pages of host pools: page pages[i] of k_pool and v_pool ([P, Hkv, page_size, D] each, P the
  // cache's page count) to the same page of the cache.
  void write_pool_pages(const TensorView<const int32_t>& pages, const StorageView& k_pool, const StorageView& v_pool);
  // One position per row: (pages[i], slots[i]) gets k[i] and v[i], each [n, Hkv, D]. A position
  // written twice in one call is an InputError (the scatter would race).
  void write_tokens(const TensorView<const int32_t>& pages, const TensorView<const int32_t>& slots,
                    const StorageView& k, const StorageView& v);
  // Copies pages back to the host ([n, Hkv, page_size, D] each, element bytes of the dtype), for
  // checks: it reads each segment that holds one of them whole.
  void read_pages(const TensorView<const int32_t>& pages, void* k_out, void* v_out);

  const DeviceCacheShape& shape() const { return shape_; }
  const std::string& target() const { return target_; }
  int64_t segments() const { return static_cast<int64_t>(k_.size()); }
  int64_t segment_pages() const { return segment_pages_; }
  // The device buffers of segment s (pages [s * segment_pages, ...)), typed as the forward reads
  // them (float32, float16, or bfloat16 bits as uint16).
  halide_buffer_t* k_segment(int64_t s) { return &k_[static_cast<size_t>(s)].typed; }
  const DeviceArraySpec& array_spec() const { return spec_; }
  halide_buffer_t* v_segment(int64_t s) { return &v_[static_cast<size_t>(s)].typed; }
  const halide_device_interface_t* device() const { return dev_; }
  const DeviceKit& kit() const { return *kit_; }
  // The most pages one segment may hold for this shape on this target.
  static int64_t max_segment_pages(const std::string& target, const DeviceCacheShape& shape);

 private:
  struct Segment {
    halide_buffer_t bits{};   // uint32/uint16: what the writer sees (owns the allocation)
    halide_buffer_t typed{};  // the same allocation as the forward's input type
    halide_dimension_t dims[4]{};
    int64_t pages = 0;
  };
  // k and v as whole pages [n_src, Hkv, page_size, D] (whole_pages; page_size may be 1) or as
  // one token's rows [n_src, Hkv, D].
  void check_rows(const TensorView<const int32_t>& pages, const StorageView& k, const StorageView& v,
                  bool whole_pages, int64_t n_src) const;
  // Pages [n, Hkv, page_size, D] to rows and on to the device: page i of k/v (or page src[i]) to
  // page pages[i].
  void write_page_rows(const TensorView<const int32_t>& pages, const int32_t* src, const StorageView& k,
                       const StorageView& v);
  // n rows of Hkv x D elements to (row_page[i], row_slot[i]), each segment's in calls of at most
  // kMaxRowsPerCall rows.
  void scatter(int64_t n, const int32_t* row_page, const int32_t* row_slot, const uint8_t* k_rows, const uint8_t* v_rows);
  int64_t first_repeat(const int32_t* pages, const int32_t* slots, int64_t n);
  void write_segment(int64_t s, int64_t n, const int32_t* page, const int32_t* slot, const uint8_t* k, const uint8_t* v);
  std::shared_ptr<const DeviceKit> kit_;
  std::string target_;
  DeviceCacheShape shape_;
  int64_t segment_pages_ = 0;
  const halide_device_interface_t* dev_ = nullptr;
  DeviceArraySpec spec_;
  KvWriteFn writer_;
  std::vector<Segment> k_, v_;
  std::unique_ptr<DeviceArray> rows_, row_page_, row_slot_;
  // Reused across calls: a write_pages call's rows, and a call's rows of one segment.
  std::vector<int32_t> all_page_, all_slot_, seg_page_, seg_slot_;
  std::vector<uint8_t> k_rows_, v_rows_, seg_k_, seg_v_;
  std::vector<std::pair<int64_t, int64_t>> keys_;  // (position, entry) of a call, for repeats
};

// Everything a step reads but K and V (those are the cache's): SPEC section 1's other inputs.
struct StepInputs {
  StepInputs() = default;
  // A step's inputs out of full inputs (their K/V views are not read).
  explicit StepInputs(const InputsView& in)
      : q(in.q), selected(in.selected), block_tables(in.block_tables), cu_seqlens_q(in.cu_seqlens_q),
        used_kv_lens(in.used_kv_lens), block_size(in.block_size), causal(in.causal), softmax_scale(in.softmax_scale) {}
  StorageView q;
  TensorView<const int32_t> selected, block_tables;
  TensorView<const int64_t> cu_seqlens_q;
  std::optional<TensorView<const int32_t>> used_kv_lens;
  int64_t block_size = 0;
  bool causal = false;
  std::optional<float> softmax_scale;
  // The runner's resident block tables (DeviceStepRunner::write_block_tables) instead of
  // block_tables, which must then be empty: on the device already, their entries checked where
  // they were written. A decode step then has its tiles built on the device (plan.h,
  // Planner::plan_on_device), from the selection and the lengths alone.
  bool resident_tables = false;
};

// Wall times of the last step (milliseconds), each phase synchronised with the device.
// step() on CUDA uploads q beside the plan and the plan's arrays: plan_ms is then the plan's own
// time, and upload_ms the rest of the wall time until every upload is done. On Vulkan, a q in the
// runner's mapping (q_staging()) goes up while the host plans: q_upload_ms is then its submission
// and the wait for it after the plan, inside upload_ms (plan_ms is the plan's alone).
// A plan built on the device (StepInputs::resident_tables): plan_ms is the host's part (validation
// and the layout) and device_plan_ms, the decode-plan kernels to their end (on CUDA: their issue;
// they run in stream order ahead of q's copy, inside upload_ms).
// step_and_read's overlapped step (CUDA): overlapped_ms is everything after the plan's arrays
// went up (q's copies, the kernels, the read-backs, in parts on the runner's streams, with the
// device part of a plan built there), and forward_ms, combine_ms, readback_ms and q_upload_ms
// are 0 (q's copies are inside overlapped_ms, not plan_ms + upload_ms as below).
struct StepTiming {
  double plan_ms = 0, upload_ms = 0, forward_ms = 0, combine_ms = 0, readback_ms = 0;
  double overlapped_ms = 0;
  int overlap_parts = 0;  // the overlapped step's parts (0: the step ran its phases one by one)
  // On CUDA, inside plan_ms + upload_ms: q's upload and the plan's arrays' uploads, each alone
  // (on Vulkan, q_upload_ms as above).
  double q_upload_ms = 0, arrays_upload_ms = 0;
  // Inside plan_ms: the device's part of a plan built there (0 for a host plan).
  double device_plan_ms = 0;
  // On Vulkan: the combine wrote out and lse into host memory (set_outputs_in_place); readback_ms
  // is then the host's part of read_outputs() alone, and combine_ms holds the writes.
  bool outputs_in_place = false;
  double total_ms() const { return plan_ms + upload_ms + forward_ms + combine_ms + readback_ms + overlapped_ms; }
};

// The kernels for a plan (the runner calls it once per step; what it returns stays valid while
// the picker lives).
using KernelPicker = std::function<const Kernels&(const Plan&)>;

struct SegmentTiles;

class DeviceStepRunner {
 public:
  // An AOT schedule generated for the cache's target (halide::aot_select picks the variant per
  // plan; params as for the aot backend: T, variant).
  DeviceStepRunner(DeviceKvCache& cache, const std::string& schedule, const std::map<std::string, std::string>& params = {});
  // Any kernels on the cache's device (the JIT's, or one AOT variant), with the runner's planner
  // planning as `options` says (with options.max_batch_partial_floats 0: the device's limit).
  DeviceStepRunner(DeviceKvCache& cache, KernelPicker pick, PlanOptions options);
  ~DeviceStepRunner();

  // Plans (reading no K/V; with check_block_tables false the table entries are trusted, as
  // Planner::plan_checked_tables; a decode step in the fixed decode layout, plan.h) and runs one
  // step: prepare(), then launch(). out/lse stay on the device.
  void step(const StepInputs& in, bool check_block_tables = true);
  // The host plan of a step as step() makes it (decode layout, tasks; without building tiles on
  // the device), uploading and launching nothing: to time the plan alone (its plan_ms). Valid
  // until the next step or host_plan. It replaces the runner's own last plan: that step's outputs
  // are no longer readable, and launch() waits for the next step (a plan the caller prepared
  // stays).
  const Plan& host_plan(const StepInputs& in, bool check_block_tables = true);
  // The block tables for steps with StepInputs::resident_tables ([B, max_pages], SPEC's
  // block_tables), kept on the device: written whole, every entry checked once here (a page id
  // below the cache's num_pages, or negative for none) ...
  void write_block_tables(const TensorView<const int32_t>& tables);
  // ... or entry by entry, in place: tables[seqs[i], entries[i]] = pages[i], each checked, by the
  // device cache's scatter kernel. An entry written twice in one call is an InputError.
  void write_block_table_entries(const TensorView<const int32_t>& seqs, const TensorView<const int32_t>& entries,
                                 const TensorView<const int32_t>& pages);
  // The resident tables as written (empty before write_block_tables).
  TensorView<const int32_t> block_tables() const;
  // Whether a decode step on the resident tables has its tiles built on the device (else planned
  // on the host from the runner's copy of the tables). Default: the faster on the target, as
  // measured (default_decode_plan_on_device).
  void set_decode_plan_on_device(bool on) { decode_plan_on_device_ = on; }
  static bool default_decode_plan_on_device(const std::string& target);
  // Whether, on Vulkan, a q in q_staging() goes up while the host plans (else after the plan, with
  // the plan's arrays). Default on, measured 2026-12-03 (H200, gpu-decode bfloat16, 64-step
  // loops, medians): 2.518 ms a step against 2.571
  // (experiments/results/gpu/2026-12-03/gpu_bench_loop_q_ahead.json).
  void set_q_ahead(bool on) { q_ahead_on_ = on; }
  // Whether, on Vulkan, a one-batch step's combine writes out and lse straight into the runner's
  // mapped host memory, where read_outputs() then finds them (no read-back;
  // timing().outputs_in_place), instead of into device memory read back by a copy. Default:
  // default_outputs_in_place (measured).
  void set_outputs_in_place(bool on) { outputs_in_place_on_ = on; }
  static bool default_outputs_in_place(const std::string& target);
  // A step in parts, for a plan made elsewhere (it must outlive the runner's use of it, through
  // read_outputs): uploads q, the plan's arrays and the partial index (timing().upload_ms) ...
  void prepare(const Plan& plan, const StorageView& q);
  // ... then runs forward and combine on them, again at every call (timing().forward_ms, combine_ms).
  void launch();
  // Reads the last step's outputs into `out` ([Tq, Hq, D] and [Tq, Hq], SPEC's -inf for empty rows).
  void read_outputs(const OutputsView& out);
  // The same into the runner's own host arrays (page-locked on CUDA, mapped host-cached memory of
  // the runner's on Vulkan: the device copies straight into them, with no host copy), returned as
  // views: valid until the next step or read_outputs(). On Vulkan, where the step's combine wrote
  // them there itself (set_outputs_in_place), nothing is copied.
  OutputsView read_outputs();
  // step(), with out/lse read back into the runner's own arrays (as read_outputs(); the views
  // valid until the next read). On CUDA, a decode step of at least 32 queries in the fixed decode
  // layout on one segment and one query batch, whose q lies in q_staging(), runs in parts of its
  // queries (whole 16s; min(overlap_parts(), ceil(Tq / 16)) of them), each on a stream of its
  // own: its q rows' copy, its forward and combine, and its out/lse rows' copy, so that one
  // part's copies overlap another's kernels (timing().overlapped_ms, overlap_parts). Elsewhere
  // step() then read_outputs(), the same values.
  OutputsView step_and_read(const StepInputs& in, bool check_block_tables = true);
  // The parts of step_and_read's overlapped step (1: none; at least 1). Default: the fastest
  // measured on the target (default_overlap_parts).
  void set_overlap_parts(int parts);
  int overlap_parts() const { return overlap_parts_; }
  static int default_overlap_parts(const std::string& target);
  // How the host plans a step: 1 on the calling thread alone; n > 1 in about n tasks at once on
  // Halide's thread pool (PlanOptions::sequence_chunks); 0 about as many as the machine has
  // hardware threads. Default: default_plan_tasks (measured) for a runner of a schedule; a runner
  // made with PlanOptions plans as they say until this is called. plan_tasks() reads the planner's
  // options (1 where they plan on the calling thread).
  void set_plan_tasks(int tasks);
  int plan_tasks() const {
    return planner_.options().parallel_heads ? static_cast<int>(planner_.options().sequence_chunks) : 1;
  }
  const PlanOptions& plan_options() const { return planner_.options(); }
  static int default_plan_tasks(const std::string& target);
  // The host staging of a step's q, for Tq queries of Hq heads ([Tq, Hq, D] in the cache's dtype;
  // page-locked on CUDA; on Vulkan mapped memory that the device copies from). A step whose StepInputs::q views this memory, with that shape, uploads
  // it as it lies: an engine that writes q here has no host copy in its step. Valid until the
  // next call of q_staging (a larger shape may move it).
  void* q_staging(int64_t Tq, int64_t Hq);
  const StepTiming& timing() const { return timing_; }
  // The last prepared step's plan (a BackendError before any, or after a refused step or
  // host_plan() replaced it).
  const Plan& plan() const;
  // The last prepared kernels' name (an AOT variant's, or the JIT's key); empty before a step.
  std::string variant() const { return kernels_ ? kernels_->name : std::string(); }
  // The largest query batch's partials a plan for this cache's device may hold (PlanOptions).
  static int64_t max_batch_partial_floats(const std::string& target);

 private:
  struct Batch;
  void init(PlanOptions options);
  // The plan's view of a step (the pool's shape, the runner's tables where resident; then
  // *check_block_tables false).
  InputsView plan_view(const StepInputs& in, bool* check_block_tables) const;
  // Before the planner writes over its plan: where the prepared step is the planner's, the step's
  // outputs and launch() go with it.
  void forget_own_plan();
  // step() and step_and_read(): the outputs where the step ran overlapped (read back already).
  std::optional<OutputsView> step_with(const StepInputs& in, bool check_block_tables, bool overlap);
  // step_and_read on CUDA: whether the prepared plan can run in parts; the run (q's rows copied
  // up in parts, each on its stream, then each part's kernels and read-back behind its rows).
  bool overlappable(const Plan& plan) const;
  OutputsView launch_overlapped(const StorageView& q);
  void start_overlapped_q(const StorageView& q);
  // The overlapped step's streams, made before the plan, for a q of this shape in the staging
  // (false: not a q that runs in parts).
  bool ensure_streams(const StorageView& q);
  bool plan_on_stream_ = false;  // this step's decode plan runs on the first part's stream
  static std::pair<int64_t, int64_t> overlap_part(int64_t i, int64_t parts, int64_t Tq);
  // The runner's own host arrays for out/lse (read_outputs()), grown as needed.
  OutputsView own_outputs(const Problem& p);
  // in: the step's inputs, for a plan whose tiles the device builds (their selection and lengths).
  void prepare_with(const Plan& plan, const Kernels& kernels, const StorageView& q, bool q_uploaded,
                    const InputsView* in = nullptr);
  // q's checks against the staging, then its upload: now, or in the step's batched submission.
  void upload_q(const StorageView& q, UploadBatch* batch);  // nullptr: now
  bool start_q_upload(const StorageView& q);
  void build_segment_tiles(const Plan& plan, int64_t b, int64_t tb, int64_t te);
  DeviceKvCache& cache_;
  KernelPicker pick_;
  Planner planner_;
  const Plan* plan_ = nullptr;     // the last prepared plan
  const Kernels* kernels_ = nullptr;  // its kernels
  StepTiming timing_;
  std::vector<std::unique_ptr<Batch>> batches_;
  int64_t used_batches_ = 0;
  std::unique_ptr<DeviceArray> q_;
  std::vector<float> empty_;  // a batch with no tile: its one tile of empty partials
  UploadBatch q_ahead_;   // q's copy while the host plans (Vulkan, q in the runner's mapping)
  UploadBatch uploads_;   // a step's uploads, one submission per query batch
  uint8_t kv_dummy_ = 0;  // the address the plan's K/V views carry (the plan reads no K/V)
  // Host scratch, reused across steps.
  std::vector<int32_t> head_, pages_, query_, limit_, pidx_, copy_of_, iota_;  // segmented pools only
  std::vector<int64_t> seg_count_;
  // The resident block tables: the host's copy, and the device's as the KV writer's 32-bit pool
  // ([B, 1, max_pages, 1]); with the rows of an entry write.
  std::vector<int32_t> tables_host_;
  int64_t tables_B_ = 0, tables_width_ = 0;
  bool has_tables_ = false;
  bool decode_plan_on_device_ = false;
  bool q_ahead_on_ = true;
  std::unique_ptr<DeviceArray> tables_, entry_values_, entry_seqs_, entry_cols_;
  std::vector<std::pair<int64_t, int64_t>> entry_keys_;
  // A plan built on the device: the step's selection and lengths (one upload).
  std::unique_ptr<DeviceArray> step_ints_;
  void build_tiles_on_device(const Plan& plan, const InputsView* in, Batch& bt, SegmentTiles& st);
  void read_into(const OutputsView& out, bool direct);
  // read_outputs()'s host arrays, out then lse (page-locked on CUDA), grown as needed.
  std::unique_ptr<PinnedHost> host_out_;
  // On Vulkan: q_staging() and read_outputs() in mapped memory of our own, which the device copies
  // from and into (no host copy); q_dirty_ bytes of q's may hold an engine's writes.
  std::unique_ptr<VulkanMappedBuffer> q_mapped_, out_mapped_;
  int64_t q_dirty_ = 0;
  // Outputs written in place (set_outputs_in_place): out and lse in out_mapped_ (lse at the next
  // 256 bytes past out's padded rows), as the combine's buffers (aliases of the mapping) and as
  // the views read_outputs() returns.
  bool outputs_in_place_on_ = false;
  // Where the last step's outputs are: nowhere yet (prepared, not launched to its end), in the
  // batches' device arrays, or in out_mapped_ (written there by the combine).
  enum class OutputsAt { kNone, kDevice, kMapping } outputs_at_ = OutputsAt::kNone;
  // The prepared step's plan, or a BackendError naming `call` where there is none.
  const Plan& prepared_plan(const char* call) const;
  void require_outputs() const;  // BackendError unless a step's kernels ran to their end
  bool alias_outputs(const Problem& p, Batch& bt);  // false: the mapping could not take them
  std::unique_ptr<VulkanMappedAlias> out_alias_, lse_alias_;
  halide_buffer_t out_in_place_{}, lse_in_place_{};
  halide_dimension_t out_in_place_dims_[4]{}, lse_in_place_dims_[4]{};
  OutputsView in_place_views_;
  std::vector<VulkanRead> reads_;
  // The overlapped step's streams (CUDA), and what it read.
  int overlap_parts_ = 1;
  std::unique_ptr<CudaStreams> streams_;
  int64_t q_parts_ = 0;  // the parts of the last overlapped step
};

}  // namespace kvouter::halide
