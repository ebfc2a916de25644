#include "kvouter/device_cache.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstring>
#include <limits>
#include <numeric>

#include "kvouter/aot.h"
#include "kvouter/cuda_pinned.h"
#include "kvouter/cuda_probe.h"
#include "kvouter/stats.h"
#include "kvouter/errors.h"
#include "kvouter/host_copy.h"
#include "kvouter/tile_layout.h"
#include "kvouter/vulkan_probe.h"
#include "kvouter/vulkan_readback.h"
#include "thread_pool.h"

namespace kvouter::halide {

namespace {

// Halide 21's Vulkan allocator corrupts or fails allocations whose byte size is not a multiple of
// 64 (shared/notes/halide21-vulkan.md): every allocation and every copy here is whole 64-byte lines.
int64_t round64(int64_t bytes) { return (std::max<int64_t>(bytes, 1) + 63) / 64 * 64; }

// The least a device array allocates. Halide 21's Vulkan allocator can hand a new allocation the
// region of a freed one together with that one's buffer object, sized as it was requested: a
// kernel's scalar-argument buffer (tens to hundreds of bytes, not whole 64-byte lines) then
// became a 192-byte array's, and copies into it overran it (the validation layer's
// VUID-vkCmdCopyBuffer-size-00116; the JIT's kernels then read zeros; docs/vulkan.md limit 15).
// No array is that small.
constexpr int64_t kMinArrayBytes = 4096;

// Rows per call of the scatter kernel: its grid's x extent, below the 65535 workgroups that some
// devices allow (lavapipe, in every dimension).
constexpr int64_t kMaxRowsPerCall = 32768;

// Halide 21 indexes a buffer's elements with int32 (without large_buffers).
constexpr int64_t kMaxElements = (int64_t{1} << 31) - 64;

void check(int rc, const std::string& what) {
  if (rc != 0) throw BackendError("device cache: " + what + " failed with code " + std::to_string(rc));
}

// Device calls through the interface's own entry points (those of the runtime that made it: the
// generated kernels' runtime, or libHalide's for the JIT), never this program's global
// halide_device_* symbols: a program that only JITs links no Halide runtime of its own (the
// fuzzers), and a JIT buffer belongs to libHalide's runtime.
int dev_malloc(halide_buffer_t* b, const halide_device_interface_t* d) { return d->device_malloc(nullptr, b, d); }
int dev_free(halide_buffer_t* b) { return b->device_interface->device_free(nullptr, b); }
int dev_sync(halide_buffer_t* b) { return b->device_interface->device_sync(nullptr, b); }
int to_device(halide_buffer_t* b, const halide_device_interface_t* d) { return d->copy_to_device(nullptr, b, d); }
int to_host(halide_buffer_t* b) { return b->device_interface->copy_to_host(nullptr, b); }

halide_type_t bits_type(Dtype t) { return halide_type_t(halide_type_uint, static_cast<uint8_t>(8 * dtype_bytes(t))); }

// `bytes` bytes at offset 0 of a device allocation, with `host` as their host memory: the view
// every copy here goes through (whole 64-byte lines, never a crop).
halide_buffer_t byte_view(uint8_t* host, const halide_buffer_t& alloc, halide_dimension_t* d, int64_t bytes) {
  *d = halide_dimension_t(0, static_cast<int32_t>(round64(bytes)), 1);
  halide_buffer_t raw{};
  raw.type = halide_type_t(halide_type_uint, 8);
  raw.host = host;
  raw.device = alloc.device;
  raw.device_interface = alloc.device_interface;
  raw.dimensions = 1;
  raw.dim = d;
  return raw;
}

// C order [n0, ..., nk] as Halide dimensions (nk innermost).
int set_dims(halide_dimension_t* dims, const std::vector<int64_t>& shape) {
  const int rank = static_cast<int>(shape.size());
  int64_t stride = 1;
  for (int i = 0; i < rank; ++i) {
    const int64_t e = shape[static_cast<size_t>(rank - 1 - i)];
    if (e > std::numeric_limits<int32_t>::max() || stride > std::numeric_limits<int32_t>::max()) {
      throw BackendError("device cache: an extent of " + std::to_string(e) + " exceeds Halide's int32 indexing");
    }
    dims[i] = halide_dimension_t(0, static_cast<int32_t>(e), static_cast<int32_t>(stride));
    stride *= e;
  }
  return rank;
}

// --- DeviceArray -------------------------------------------------------------------------------

// The most one Vulkan descriptor may bind on every device present.
int64_t vulkan_range_bytes() { return (vulkan_max_buffer_floats() + 16) * 4 - 64; }

}  // namespace

DeviceArraySpec DeviceArraySpec::of(const std::string& target, const halide_device_interface_t* dev) {
  DeviceArraySpec s{dev, int64_t{1} << 62, is_cuda_target(target)};
  if (is_vulkan_target(target)) s.max_bytes = std::min<int64_t>((int64_t{1} << 31) - 64, vulkan_range_bytes());
  return s;
}

PinnedHost::~PinnedHost() {
  if (pinned_) cuda_unpin(bytes_.data());
}

uint8_t* PinnedHost::reserve(size_t bytes) {
  if (bytes > bytes_.size()) {
    if (pinned_) cuda_unpin(bytes_.data());
    pinned_ = false;
    bytes_.assign(bytes, 0);
    if (pin_) pinned_ = cuda_pin(bytes_.data(), bytes_.size());
  }
  return bytes_.data();
}

DeviceArray::DeviceArray(halide_type_t type, const DeviceArraySpec& spec, bool host_staging, bool whole_rows)
    : type_(type), spec_(spec), staging_(host_staging), whole_rows_(whole_rows), host_(spec.pin) {}

std::atomic<bool> DeviceArray::fast_transfers_{true};
void DeviceArray::set_fast_transfers(bool on) { fast_transfers_ = on; }

DeviceArray::~DeviceArray() {
  if (alloc_.device) dev_free(&alloc_);
}

void DeviceArray::reserve(int64_t bytes) {
  bytes = round64(bytes);
  if (bytes <= capacity_) return;
  // Halide indexes elements with int32; a Vulkan descriptor binds at most the device's range.
  const int64_t most = std::min(kMaxElements * type_.bytes() / 64 * 64, spec_.max_bytes);
  if (bytes > most) {
    throw BackendError("device cache: a device array of " + std::to_string(bytes) + " bytes exceeds " +
                       std::to_string(most) + " (one storage buffer of the device, or Halide's int32 addressing)");
  }
  if (alloc_.device) check(dev_free(&alloc_), "freeing an outgrown device array");
  // Never past what one descriptor may bind: Halide binds the whole allocation.
  const int64_t grown =
      std::min(most / 64 * 64, std::max({bytes, round64(capacity_ + capacity_ / 2), kMinArrayBytes}));
  alloc_ = halide_buffer_t{};
  alloc_.type = halide_type_t(halide_type_uint, 8);
  alloc_dim_ = halide_dimension_t(0, static_cast<int32_t>(grown), 1);
  alloc_.dimensions = 1;
  alloc_.dim = &alloc_dim_;
  check(dev_malloc(&alloc_, spec_.dev), "allocating " + std::to_string(grown) + " device bytes");
  capacity_ = grown;
  if (staging_) host_.reserve(static_cast<size_t>(grown));
}

namespace {

// A view's shape as allocated (its outermost extent padded to whole 64-byte lines of rows with
// whole_rows), and its bytes.
int64_t padded_shape(const std::vector<int64_t>& given, bool whole_rows, int elem_bytes, std::vector<int64_t>* shape) {
  *shape = given;
  if (whole_rows && !shape->empty()) {
    const int64_t m = std::max<int64_t>(64 / elem_bytes, 1);
    (*shape)[0] = (std::max<int64_t>((*shape)[0], 1) + m - 1) / m * m;
  }
  int64_t n = 1;
  for (int64_t e : *shape) n *= std::max<int64_t>(e, 0);
  return n * elem_bytes;
}

}  // namespace

bool DeviceArray::fits(const std::vector<int64_t>& given) const {
  std::vector<int64_t> shape;
  return round64(padded_shape(given, whole_rows_, type_.bytes(), &shape)) <= capacity_;
}

halide_buffer_t* DeviceArray::view(const std::vector<int64_t>& given) {
  elements_ = 1;
  for (int64_t e : given) elements_ *= std::max<int64_t>(e, 0);
  reserve(padded_shape(given, whole_rows_, type_.bytes(), &shape_));
  view_ = halide_buffer_t{};
  view_.type = type_;
  view_.device = alloc_.device;
  view_.device_interface = alloc_.device_interface;
  view_.host = staging_ ? host_.data() : nullptr;
  view_.dimensions = set_dims(dims_, shape_);
  view_.dim = dims_;
  return &view_;
}

int64_t DeviceArray::view_bytes() const { return round64(static_cast<int64_t>(view_.size_in_bytes())); }

halide_buffer_t* DeviceArray::upload(const void* data, int64_t count, const std::vector<int64_t>& shape,
                                     UploadBatch* batch, const VulkanMappedBuffer* from) {
  halide_buffer_t* v = view(shape);
  if (batch && fast_transfers_) {
    batch->pending_.push_back({this, data, count, from});
  } else {
    upload_now(data, count);
  }
  return v;
}

const std::vector<VulkanWrite>& UploadBatch::gather() {
  writes_.clear();
  for (const Pending& p : pending_) {
    const DeviceArray& a = *p.array;
    writes_.push_back({&a.alloc_, p.data, p.count * a.type_.bytes(), round64(static_cast<int64_t>(a.view_.size_in_bytes())), p.from});
  }
  return writes_;
}

void UploadBatch::flush() {
  if (pending_.empty()) return;
  // Not a Vulkan device (or no host-cached memory there): each array's own copy.
  if (!vulkan_write_device(gather())) {
    for (const Pending& p : pending_) p.array->upload_now(p.data, p.count);
  }
  pending_.clear();
}

bool UploadBatch::submit() {
  if (pending_.empty() || in_flight_) {
    flush();
    return false;
  }
  if (!vulkan_write_device_async(gather())) {
    flush();
    return false;
  }
  pending_.clear();
  in_flight_ = true;
  return true;
}

void UploadBatch::finish() {
  if (!in_flight_) return;
  in_flight_ = false;
  if (!vulkan_finish_writes()) throw BackendError("device step: waiting for the uploads failed");
}

void DeviceArray::upload_now(const void* data, int64_t count) {
  const int64_t bytes = round64(static_cast<int64_t>(view_.size_in_bytes()));
  const int64_t used = count * type_.bytes();
  if (used > 0 && data != host_.data()) host_copy(host_.data(), data, used);  // else written in place
  host_copy(host_.data() + used, nullptr, bytes - used);
  halide_dimension_t d;
  halide_buffer_t raw = byte_view(host_.data(), alloc_, &d, bytes);
  raw.set_host_dirty(true);
  check(to_device(&raw, spec_.dev), "uploading " + std::to_string(bytes) + " bytes");
}

void DeviceArray::download(void* dst, bool direct) {
  const int64_t bytes = elements_ * type_.bytes();
  if (fast_transfers_ && vulkan_read_device(&alloc_, bytes, dst)) return;
  halide_dimension_t d;
  halide_buffer_t raw = byte_view(direct ? static_cast<uint8_t*>(dst) : host_.data(), alloc_, &d, bytes);
  if (direct) d.extent = static_cast<int32_t>(bytes);  // exactly the view's bytes: dst holds no more
  raw.set_device_dirty(true);
  check(to_host(&raw), "reading back " + std::to_string(bytes) + " bytes");
  if (!direct) host_copy(dst, host_.data(), bytes);
}

// --- DeviceKvCache -----------------------------------------------------------------------------

int64_t DeviceKvCache::max_segment_pages(const std::string& target, const DeviceCacheShape& shape) {
  int64_t limit = kMaxElements * dtype_bytes(shape.dtype);
  if (is_vulkan_target(target)) {
    limit = std::min<int64_t>(limit, vulkan_range_bytes());
  }
  const int64_t page_bytes = shape.Hkv * shape.page_size * shape.D * dtype_bytes(shape.dtype);
  return std::max<int64_t>(limit / page_bytes / 64 * 64, 0);
}

namespace {

const DeviceCacheShape& checked_shape(const DeviceCacheShape& shape, int64_t segment_pages) {
  if (shape.num_pages <= 0) throw InputError("num_pages", "a positive page count", std::to_string(shape.num_pages));
  if (shape.Hkv <= 0) throw InputError("Hkv", "a positive head count", std::to_string(shape.Hkv));
  if (shape.page_size <= 0) throw InputError("page_size", "a positive page size", std::to_string(shape.page_size));
  if (shape.D <= 0) throw InputError("D", "a positive head dimension", std::to_string(shape.D));
  if (segment_pages < 0) throw InputError("segment_pages", "0 (automatic) or a positive page count", std::to_string(segment_pages));
  return shape;
}

}  // namespace

DeviceKvCache::DeviceKvCache(const std::string& target, const DeviceCacheShape& shape, int64_t segment_pages)
    : DeviceKvCache((checked_shape(shape, segment_pages), generated_device_kit(target)), shape, segment_pages) {}

DeviceKvCache::DeviceKvCache(std::shared_ptr<const DeviceKit> kit, const DeviceCacheShape& shape, int64_t segment_pages)
    : kit_(std::move(kit)), target_(kit_->target), shape_(checked_shape(shape, segment_pages)) {
  const int bits = 8 * static_cast<int>(dtype_bytes(shape.dtype));
  dev_ = kit_->dev;
  spec_ = DeviceArraySpec::of(target_, dev_);
  writer_ = kit_->writer(bits);
  const int64_t most = max_segment_pages(target_, shape);
  if (most <= 0) throw InputError("page_size", "pages that fit one device buffer", "a page of " + std::to_string(shape.Hkv * shape.page_size * shape.D * dtype_bytes(shape.dtype)) + " bytes");
  segment_pages_ = segment_pages == 0 ? std::min(most, shape.num_pages) : segment_pages;
  if (segment_pages_ > most) {
    throw InputError("segment_pages", "at most " + std::to_string(most) + " pages (one device buffer)", std::to_string(segment_pages));
  }
  const int64_t nseg = (shape.num_pages + segment_pages_ - 1) / segment_pages_;
  const int64_t page_bytes = shape.Hkv * shape.page_size * shape.D * dtype_bytes(shape.dtype);
  k_.resize(static_cast<size_t>(nseg));
  v_.resize(static_cast<size_t>(nseg));
  for (auto* pool : {&k_, &v_}) {
    for (int64_t s = 0; s < nseg; ++s) {
      Segment& g = (*pool)[static_cast<size_t>(s)];
      g.pages = std::min(segment_pages_, shape.num_pages - s * segment_pages_);
      // Pages padded so the allocation is whole 64-byte lines; the kernels see g.pages.
      int64_t alloc_pages = g.pages;
      while ((alloc_pages * page_bytes) % 64 != 0) ++alloc_pages;
      set_dims(g.dims, {alloc_pages, shape.Hkv, shape.page_size, shape.D});
      g.bits.type = bits_type(shape.dtype);
      g.bits.dimensions = 4;
      g.bits.dim = g.dims;
      check(dev_malloc(&g.bits, dev_), "allocating a K/V segment of " + std::to_string(alloc_pages * page_bytes) + " bytes");
      g.dims[3].extent = static_cast<int32_t>(g.pages);
      g.typed = g.bits;
      g.typed.type = storage_type(shape.dtype);
    }
  }
  rows_ = std::make_unique<DeviceArray>(bits_type(shape.dtype), spec_);
  row_page_ = std::make_unique<DeviceArray>(halide_type_of<int32_t>(), spec_);
  row_slot_ = std::make_unique<DeviceArray>(halide_type_of<int32_t>(), spec_);
  // Zeros everywhere, so that no position a page never had written holds a NaN that a masked
  // weight (0 * NaN) would carry into a result: written through the scatter kernel, from one
  // uploaded block of zero rows.
  const int64_t row_bytes = shape.Hkv * shape.D * dtype_bytes(shape.dtype);
  const int64_t chunk_rows = std::max<int64_t>(
      1, std::min({shape.num_pages * shape.page_size, (int64_t{16} << 20) / row_bytes, kMaxRowsPerCall}));
  std::vector<int32_t> page(static_cast<size_t>(chunk_rows)), slot(page.size());
  rows_->upload(nullptr, 0, {chunk_rows, shape.Hkv, shape.D});
  for (int64_t s = 0; s < nseg; ++s) {
    const int64_t seg_positions = k_[static_cast<size_t>(s)].pages * shape.page_size;
    for (int64_t p0 = 0; p0 < seg_positions; p0 += chunk_rows) {
      const int64_t n = std::min(chunk_rows, seg_positions - p0);
      for (int64_t i = 0; i < n; ++i) {
        page[static_cast<size_t>(i)] = static_cast<int32_t>((p0 + i) / shape.page_size);
        slot[static_cast<size_t>(i)] = static_cast<int32_t>((p0 + i) % shape.page_size);
      }
      halide_buffer_t* rows = rows_->view({n, shape.Hkv, shape.D});  // zeros, uploaded once
      halide_buffer_t* rp = row_page_->upload(page.data(), n, {n});
      halide_buffer_t* rs = row_slot_->upload(slot.data(), n, {n});
      check(writer_(rows, rp, rs, &k_[static_cast<size_t>(s)].bits), "clearing the K pool");
      check(writer_(rows, rp, rs, &v_[static_cast<size_t>(s)].bits), "clearing the V pool");
    }
  }
  check(dev_sync(&k_.front().bits), "clearing the pools (sync)");
}

DeviceKvCache::~DeviceKvCache() {
  rows_.reset();
  row_page_.reset();
  row_slot_.reset();
  for (auto* pool : {&k_, &v_}) {
    for (Segment& g : *pool) {
      if (g.bits.device) dev_free(&g.bits);
    }
  }
}

void DeviceKvCache::check_rows(const TensorView<const int32_t>& pages, const StorageView& k, const StorageView& v,
                               int64_t rows_per_page, int64_t n_src) const {
  const int64_t n = pages.rank == 1 ? pages.dim(0) : -1;
  if (n < 0 || !pages.row_major()) throw InputError("pages", "a contiguous [n] array", shape_str(pages));
  if (n_src < 0) n_src = n;
  const std::vector<int64_t> want = rows_per_page > 1
                                        ? std::vector<int64_t>{n_src, shape_.Hkv, shape_.page_size, shape_.D}
                                        : std::vector<int64_t>{n_src, shape_.Hkv, shape_.D};
  for (const auto& [name, x] : {std::pair<const char*, const StorageView*>{"k", &k}, {"v", &v}}) {
    if (x->dtype != shape_.dtype) {
      throw InputError(name, "dtype " + dtype_name(shape_.dtype) + " (the cache's)", dtype_name(x->dtype));
    }
    if (x->shape_vec() != want || !x->row_major()) throw InputError(name, "a contiguous " + shape_str(want), shape_str(*x));
    if (n > 0 && n_src > 0 && x->data == nullptr) throw InputError(name, "data", "a null pointer");
  }
  if (n > 0 && pages.data == nullptr) throw InputError("pages", "data", "a null pointer");
  for (int64_t i = 0; i < n; ++i) {
    const int32_t p = pages.data[i];
    if (p < 0 || p >= shape_.num_pages) {
      throw InputError("pages[" + std::to_string(i) + "]", "a page id in [0, " + std::to_string(shape_.num_pages) + ")",
                       std::to_string(p));
    }
  }
}

// The first i whose (page, slot) an earlier entry has (slots null: pages alone), or -1; in
// arrays reused across calls.
namespace {

// The first row i (in row order) whose key an earlier row has: keys[i] = (key, i), sorted here.
int64_t first_repeated_key(std::vector<std::pair<int64_t, int64_t>>& keys) {
  std::sort(keys.begin(), keys.end());
  int64_t first = -1;
  for (size_t j = 1; j < keys.size(); ++j) {
    if (keys[j].first == keys[j - 1].first && (first < 0 || keys[j].second < first)) first = keys[j].second;
  }
  return first;
}

}  // namespace

int64_t DeviceKvCache::first_repeat(const int32_t* pages, const int32_t* slots, int64_t n) {
  keys_.resize(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    keys_[static_cast<size_t>(i)] = {int64_t{pages[i]} * shape_.page_size + (slots ? slots[i] : 0), i};
  }
  return first_repeated_key(keys_);
}

void DeviceKvCache::write_pages(const TensorView<const int32_t>& pages, const StorageView& k, const StorageView& v) {
  check_rows(pages, k, v, shape_.page_size, -1);
  write_page_rows(pages, nullptr, k, v);
}

void DeviceKvCache::write_pool_pages(const TensorView<const int32_t>& pages, const StorageView& k_pool,
                                     const StorageView& v_pool) {
  check_rows(pages, k_pool, v_pool, shape_.page_size, shape_.num_pages);
  write_page_rows(pages, pages.data, k_pool, v_pool);
}

void DeviceKvCache::write_page_rows(const TensorView<const int32_t>& pages, const int32_t* src, const StorageView& k,
                                    const StorageView& v) {
  const int64_t n = pages.dim(0), PS = shape_.page_size, H = shape_.Hkv;
  const int64_t eb = dtype_bytes(shape_.dtype), row_bytes = shape_.D * eb;
  if (const int64_t i = first_repeat(pages.data, nullptr, n); i >= 0) {
    throw InputError("pages[" + std::to_string(i) + "]", "each page once per call", "page " + std::to_string(pages.data[i]) + " again");
  }
  // [n, Hkv, PS, D] pages as [n * PS, Hkv, D] rows.
  all_page_.resize(static_cast<size_t>(n * PS));
  all_slot_.resize(all_page_.size());
  k_rows_.resize(static_cast<size_t>(n * PS * H * row_bytes));
  v_rows_.resize(k_rows_.size());
  const auto* ks = static_cast<const uint8_t*>(k.data);
  const auto* vs = static_cast<const uint8_t*>(v.data);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t from = src ? src[i] : i;
    for (int64_t s = 0; s < PS; ++s) {
      const int64_t r = i * PS + s;
      all_page_[static_cast<size_t>(r)] = pages.data[i];
      all_slot_[static_cast<size_t>(r)] = static_cast<int32_t>(s);
      for (int64_t h = 0; h < H; ++h) {
        const int64_t at = ((from * H + h) * PS + s) * row_bytes, dst = (r * H + h) * row_bytes;
        std::memcpy(k_rows_.data() + dst, ks + at, static_cast<size_t>(row_bytes));
        std::memcpy(v_rows_.data() + dst, vs + at, static_cast<size_t>(row_bytes));
      }
    }
  }
  scatter(n * PS, all_page_.data(), all_slot_.data(), k_rows_.data(), v_rows_.data());
}

void DeviceKvCache::write_tokens(const TensorView<const int32_t>& pages, const TensorView<const int32_t>& slots,
                                 const StorageView& k, const StorageView& v) {
  check_rows(pages, k, v, 1, -1);
  const int64_t n = pages.dim(0);
  if (slots.rank != 1 || slots.dim(0) != n || !slots.row_major()) {
    throw InputError("slots", "a contiguous [" + std::to_string(n) + "] array (one per page entry)", shape_str(slots));
  }
  if (n > 0 && slots.data == nullptr) throw InputError("slots", "data", "a null pointer");
  for (int64_t i = 0; i < n; ++i) {
    const int32_t s = slots.data[i];
    if (s < 0 || s >= shape_.page_size) {
      throw InputError("slots[" + std::to_string(i) + "]", "a slot in [0, " + std::to_string(shape_.page_size) + ")", std::to_string(s));
    }
  }
  if (const int64_t i = first_repeat(pages.data, slots.data, n); i >= 0) {
    throw InputError("slots[" + std::to_string(i) + "]", "each (page, slot) once per call",
                     "page " + std::to_string(pages.data[i]) + " slot " + std::to_string(slots.data[i]) + " again");
  }
  scatter(n, pages.data, slots.data, static_cast<const uint8_t*>(k.data), static_cast<const uint8_t*>(v.data));
}

void DeviceKvCache::scatter(int64_t n, const int32_t* row_page, const int32_t* row_slot, const uint8_t* k_rows,
                            const uint8_t* v_rows) {
  if (segments() == 1) {
    write_segment(0, n, row_page, row_slot, k_rows, v_rows);  // page ids are the segment's own
  } else {
    const int64_t row_bytes = shape_.Hkv * shape_.D * dtype_bytes(shape_.dtype);
    for (int64_t s = 0; s < segments(); ++s) {
      const int64_t lo = s * segment_pages_, hi = lo + k_[static_cast<size_t>(s)].pages;
      seg_page_.clear();
      seg_slot_.clear();
      seg_k_.clear();
      seg_v_.clear();
      for (int64_t r = 0; r < n; ++r) {
        if (row_page[r] < lo || row_page[r] >= hi) continue;
        seg_page_.push_back(static_cast<int32_t>(row_page[r] - lo));
        seg_slot_.push_back(row_slot[r]);
        seg_k_.insert(seg_k_.end(), k_rows + r * row_bytes, k_rows + (r + 1) * row_bytes);
        seg_v_.insert(seg_v_.end(), v_rows + r * row_bytes, v_rows + (r + 1) * row_bytes);
      }
      write_segment(s, static_cast<int64_t>(seg_page_.size()), seg_page_.data(), seg_slot_.data(), seg_k_.data(),
                    seg_v_.data());
    }
  }
  check(dev_sync(rows_->buffer()), "writing rows (sync)");
}

void DeviceKvCache::write_segment(int64_t s, int64_t n, const int32_t* page, const int32_t* slot, const uint8_t* k,
                                  const uint8_t* v) {
  const int64_t elems = shape_.Hkv * shape_.D, row_bytes = elems * dtype_bytes(shape_.dtype);
  // At most kMaxRowsPerCall rows a call: the kernel's grid is one workgroup per (row, head).
  for (int64_t r0 = 0; r0 < n; r0 += kMaxRowsPerCall) {
    const int64_t m = std::min(kMaxRowsPerCall, n - r0);
    halide_buffer_t* rp = row_page_->upload(page + r0, m, {m});
    halide_buffer_t* rs = row_slot_->upload(slot + r0, m, {m});
    halide_buffer_t* rows = rows_->upload(k + r0 * row_bytes, m * elems, {m, shape_.Hkv, shape_.D});
    check(writer_(rows, rp, rs, &k_[static_cast<size_t>(s)].bits), "writing K rows");
    rows = rows_->upload(v + r0 * row_bytes, m * elems, {m, shape_.Hkv, shape_.D});
    check(writer_(rows, rp, rs, &v_[static_cast<size_t>(s)].bits), "writing V rows");
  }
}

void DeviceKvCache::read_pages(const TensorView<const int32_t>& pages, void* k_out, void* v_out) {
  const int64_t n = pages.rank == 1 ? pages.dim(0) : -1;
  if (n < 0) throw InputError("pages", "an [n] array", shape_str(pages));
  const int64_t page_bytes = shape_.Hkv * shape_.page_size * shape_.D * dtype_bytes(shape_.dtype);
  for (int64_t i = 0; i < n; ++i) {
    if (pages.data[i] < 0 || pages.data[i] >= shape_.num_pages) {
      throw InputError("pages[" + std::to_string(i) + "]", "a page id in [0, " + std::to_string(shape_.num_pages) + ")",
                       std::to_string(pages.data[i]));
    }
  }
  std::vector<uint8_t> host;
  for (auto [pool, out] : {std::pair<std::vector<Segment>*, void*>{&k_, k_out}, {&v_, v_out}}) {
    for (int64_t s = 0; s < segments(); ++s) {
      Segment& g = (*pool)[static_cast<size_t>(s)];
      const int64_t lo = s * segment_pages_;
      bool any = false;
      for (int64_t i = 0; i < n; ++i) any |= pages.data[i] >= lo && pages.data[i] < lo + g.pages;
      if (!any) continue;
      host.assign(static_cast<size_t>(round64(g.pages * page_bytes)), 0);
      halide_dimension_t d;
      halide_buffer_t raw = byte_view(host.data(), g.bits, &d, g.pages * page_bytes);
      raw.set_device_dirty(true);
      check(to_host(&raw), "reading a segment back");
      for (int64_t i = 0; i < n; ++i) {
        if (pages.data[i] < lo || pages.data[i] >= lo + g.pages) continue;
        std::memcpy(static_cast<uint8_t*>(out) + i * page_bytes, host.data() + (pages.data[i] - lo) * page_bytes,
                    static_cast<size_t>(page_bytes));
      }
    }
  }
}

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
  // The KV heads planned at once: the step's host work is on the device's critical path.
  o.parallel_heads = true;
  init(o);
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

void DeviceStepRunner::step(const StepInputs& s, bool check_block_tables) {
  Stopwatch t;
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
    check_block_tables = false;  // checked where they were written
  }
  in.cu_seqlens_q = s.cu_seqlens_q;
  in.used_kv_lens = s.used_kv_lens;
  in.block_size = s.block_size;
  in.page_size = cs.page_size;
  in.causal = s.causal;
  in.softmax_scale = s.softmax_scale;
  // On CUDA, q goes up beside the plan and the plan's arrays (a task each on Halide's thread
  // pool): the plan reads no q value, and q's copy is a DMA from page-locked staging that the host
  // only waits for. On Vulkan, a q in the runner's mapping is submitted before the plan (below,
  // start_q_upload); any other q joins the step's one batched submission in prepare_with().
  // A decode step's tiles are built on the device where its tables are (one segment: the
  // device plan addresses one pool).
  const bool on_device = s.resident_tables && decode_plan_on_device_ && cache_.segments() == 1 && cache_.kit().decode_plan;
  if (on_device && is_cuda_target(cache_.target())) {
    // In stream order: the selection's upload and the decode plan ahead of q's DMA, so that q's
    // copy is the only wait before the forward (beside it, the plan would wait for q's copy).
    const Plan& plan = planner_.plan_on_device(in);
    prepare_with(plan, pick_(plan), s.q, true, &in);
    const double arrays_ms = timing_.upload_ms;
    Stopwatch tq;
    upload_q(s.q, nullptr);
    check(dev_sync(q_->buffer()), "uploads (sync)");
    timing_.q_upload_ms = tq.lap_ms();
    const double wall = t.lap_ms();
    timing_.plan_ms = std::min(plan.plan_ms + timing_.device_plan_ms, wall);
    timing_.upload_ms = wall - timing_.plan_ms;
    timing_.arrays_upload_ms = arrays_ms - timing_.device_plan_ms;
    launch();
    return;
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
    bool check_block_tables, upload_q, on_device;
    const Plan* plan = nullptr;
    const Kernels* kernels = nullptr;
    std::exception_ptr error[2];
    double q_ms = 0, arrays_ms = 0;
  } tasks{this, &in, check_block_tables, is_cuda_target(cache_.target()), on_device, nullptr, nullptr, {}, 0, 0};
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
      } else if (c.upload_q) {
        Stopwatch tq;
        c.self->upload_q(c.in->q, nullptr);
        c.q_ms = tq.lap_ms();
      }
    } catch (...) {
      c.error[i] = std::current_exception();
    }
    return 0;
  };
  const int err = tasks.upload_q ? detail::par_for(task, 2, &tasks) : task(nullptr, 0, reinterpret_cast<uint8_t*>(&tasks));
  for (const std::exception_ptr& e : tasks.error) {
    if (e) std::rethrow_exception(e);  // the plan's error first
  }
  if (err != 0) throw std::runtime_error("device step: Halide's thread pool failed with " + std::to_string(err));
  if (tasks.upload_q) {
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
  timing_ = StepTiming{};
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
    if (pidx) bt.pidx.upload(pidx, nq * p.Hkv * ranks, {nq, p.Hkv, ranks}, &uploads_);  // else written on the device
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
  halide_buffer_t* ints = step_ints_->upload(h, count, {count}, &uploads_);
  uploads_.flush();
  Stopwatch t;
  const auto i32 = [](int64_t v) { return static_cast<int32_t>(v); };
  // The partial index as the kernel writes it: flat, padding rows included.
  const halide_buffer_t* pidx = bt.pidx.view({p.Tq, p.Hkv, p.topk});
  halide_buffer_t flat = *pidx;
  halide_dimension_t flat_dim{0, static_cast<int32_t>(pidx->number_of_elements()), 1, 0};
  flat.dim = &flat_dim;
  flat.dimensions = 1;
  check(cache_.kit().decode_plan(ints, tables_->buffer(), i32(p.Tq), i32(p.Hkv), i32(p.topk), i32(p.block_size),
                                 i32(p.page_size), i32(p.num_pages), st.pages.view({n, p.ppb}), st.limit.view({n, 1}),
                                 &flat),
        "the decode plan");
  // On CUDA the kernels run in stream order before q's copy and the forward (step() waits for q):
  // the time here is their issue; their run is in upload_ms. Elsewhere, to their end.
  if (!is_cuda_target(cache_.target())) check(dev_sync(bt.pidx.buffer()), "the decode plan (sync)");
  timing_.device_plan_ms = t.lap_ms();
}

void DeviceStepRunner::launch() {
  if (!plan_) throw BackendError("device step: launch() before prepare()");
  Stopwatch t;
  const Plan& plan = *plan_;
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
  for (int64_t b = 0; b < nb; ++b) {
    Batch& bt = *batches_[static_cast<size_t>(b)];
    check(k.combine(bt.combine_part, bt.pidx.buffer(), bt.out.buffer(), bt.lse.buffer()), "combine of " + k.description());
  }
  if (nb > 0) check(dev_sync(batches_[0]->out.buffer()), "combine (sync)");
  timing_.combine_ms = t.lap_ms();
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

OutputsView DeviceStepRunner::read_outputs() {
  if (!plan_) throw BackendError("device step: read_outputs() before a step");
  const Problem& p = plan_->problem;
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
  OutputsView v(TensorView<float>(base, {p.Tq, p.Hq, p.D}), TensorView<float>(base + n_out, {p.Tq, p.Hq}));
  read_into(v, true);
  return v;
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
  if (!plan_) throw BackendError("device step: read_outputs() before a step");
  check_outputs(out, plan_->problem);
  read_into(out, false);
}

void DeviceStepRunner::read_into(const OutputsView& out, bool direct) {
  Stopwatch t;
  const Problem& p = plan_->problem;
  if (p.Tq == 0) return;
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
