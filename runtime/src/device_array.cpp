// DeviceArray, its page-locked staging, and UploadBatch (kvouter/device_cache.h).
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

}  // namespace kvouter::halide
