// DeviceKvCache: the paged K and V pools on the device, in segments, written in place (kvouter/device_cache.h).
#include "kvouter/device_cache.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cstring>
#include <limits>
#include <numeric>

#include "device_detail.h"
#include "kvouter/aot.h"
#include "kvouter/cuda_driver.h"
#include "kvouter/cuda_probe.h"
#include "kvouter/errors.h"
#include "kvouter/host_copy.h"
#include "kvouter/tile_layout.h"
#include "kvouter/vulkan_probe.h"
#include "kvouter/vulkan_readback.h"
#include "thread_pool.h"

namespace kvouter::halide {

using namespace device_detail;

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
                               bool whole_pages, int64_t n_src) const {
  const int64_t n = pages.rank == 1 ? pages.dim(0) : -1;
  if (n < 0 || !pages.row_major()) throw InputError("pages", "a contiguous [n] array", shape_str(pages));
  if (n_src < 0) n_src = n;
  const std::vector<int64_t> want = whole_pages
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
int64_t DeviceKvCache::first_repeat(const int32_t* pages, const int32_t* slots, int64_t n) {
  keys_.resize(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    keys_[static_cast<size_t>(i)] = {int64_t{pages[i]} * shape_.page_size + (slots ? slots[i] : 0), i};
  }
  return first_repeated_key(keys_);
}

void DeviceKvCache::write_pages(const TensorView<const int32_t>& pages, const StorageView& k, const StorageView& v) {
  check_rows(pages, k, v, true, -1);
  write_page_rows(pages, nullptr, k, v);
}

void DeviceKvCache::write_pool_pages(const TensorView<const int32_t>& pages, const StorageView& k_pool,
                                     const StorageView& v_pool) {
  check_rows(pages, k_pool, v_pool, true, shape_.num_pages);
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
  check_rows(pages, k, v, false, -1);
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

}  // namespace kvouter::halide
