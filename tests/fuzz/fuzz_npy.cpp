// fuzz_npy: the .npy loader (case_io). The bytes become a file that is loaded as every dtype the
// loader accepts (f32, i32, i64), and as each 16-bit storage dtype widened to float32 (f16, and
// bf16 bits as u2), whose values must be exactly representable in the narrow type. The loader may only throw the project's typed errors
// (CaseFileError for a malformed file, InputError for a wrong dtype); what it returns must be
// consistent (element count = product of the shape, no more payload than the file holds) and
// must survive a save/load round trip bit for bit.
#include <cmath>
#include <cstring>

#include "fuzz_common.h"
#include "kvouter/case_io.h"
#include "kvouter/errors.h"

namespace {

using namespace kvouter;

template <class T>
void load_as(const std::string& path, const std::string& copy, size_t file_size) {
  Tensor<T> t;
  try {
    t = load_npy<T>(path, "fuzz");
  } catch (const CaseFileError&) {
    return;
  } catch (const InputError&) {
    return;
  }
  int64_t n = 1;
  for (int64_t e : t.shape) {
    FUZZ_CHECK(e >= 0, "negative extent %lld", static_cast<long long>(e));
    FUZZ_CHECK(!__builtin_mul_overflow(n, e, &n), "shape product overflows");
  }
  FUZZ_CHECK(n == t.numel(), "shape product %lld != %lld elements", static_cast<long long>(n),
             static_cast<long long>(t.numel()));
  FUZZ_CHECK(t.data.size() * sizeof(T) <= file_size, "more payload than the file holds");

  try {
    save_npy(copy, t);
  } catch (const CaseFileError&) {
    return;  // shapes the writer cannot represent are refused with a typed error
  }
  const Tensor<T> back = load_npy<T>(copy, "fuzz round trip");
  FUZZ_CHECK(back.shape == t.shape, "round trip changed the shape");
  FUZZ_CHECK(back.data.size() == t.data.size() &&
                 (t.data.empty() ||
                  std::memcmp(back.data.data(), t.data.data(), t.data.size() * sizeof(T)) == 0),
             "round trip changed the data");
}

void load_widened(const std::string& path, Dtype dtype, size_t file_size) {
  Tensor<float> t;
  try {
    t = load_npy_widened(path, "fuzz", dtype);
  } catch (const CaseFileError&) {
    return;
  } catch (const InputError&) {
    return;
  }
  FUZZ_CHECK(t.data.size() * 2 <= file_size, "more 16-bit payload than the file holds");
  for (float v : t.data) {
    uint32_t bits;
    std::memcpy(&bits, &v, 4);
    if (dtype == Dtype::kBFloat16) {
      FUZZ_CHECK((bits & 0xFFFFu) == 0, "bfloat16 widened with low bits %08x", bits);
    } else if (std::isfinite(v)) {
      // Every finite half is a multiple of 2^-24 and at most 65504 in magnitude.
      const double scaled = static_cast<double>(v) * 16777216.0;
      FUZZ_CHECK(std::fabs(v) <= 65504.f && scaled == std::floor(scaled), "not a half value: %g", v);
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const auto dir = fuzz::scratch_dir("fuzz_npy");
  static const std::string path = (dir / "in.npy").string(), copy = (dir / "copy.npy").string();
  fuzz::write_file(path, data, size);
  load_as<float>(path, copy, size);
  load_as<int32_t>(path, copy, size);
  load_as<int64_t>(path, copy, size);
  load_widened(path, Dtype::kFloat16, size);
  load_widened(path, Dtype::kBFloat16, size);
  return 0;
}
