#include "kvouter/dtype.h"

#include <cmath>
#include <cstring>

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#endif

namespace kvouter {

std::string dtype_name(Dtype t) {
  switch (t) {
    case Dtype::kFloat32: return "float32";
    case Dtype::kFloat16: return "float16";
    case Dtype::kBFloat16: return "bfloat16";
  }
  return "dtype(" + std::to_string(static_cast<int>(t)) + ")";
}

bool parse_dtype(const std::string& name, Dtype* t) {
  for (Dtype d : {Dtype::kFloat32, Dtype::kFloat16, Dtype::kBFloat16}) {
    if (name == dtype_name(d)) {
      *t = d;
      return true;
    }
  }
  return false;
}

bool dtype_known(Dtype t) { return t == Dtype::kFloat32 || t == Dtype::kFloat16 || t == Dtype::kBFloat16; }

float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1Fu, mant = h & 0x3FFu, bits;
  if (exp == 0x1F) {
    bits = sign | 0x7F800000u | (mant << 13);
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (mant << 13);
  } else if (mant == 0) {
    bits = sign;
  } else {  // subnormal: normalise
    exp = 113;
    while (!(mant & 0x400u)) {
      mant <<= 1;
      --exp;
    }
    bits = sign | (exp << 23) | ((mant & 0x3FFu) << 13);
  }
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

uint16_t float_to_half(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t a = u & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return static_cast<uint16_t>(sign | 0x7E00u | ((a >> 13) & 0x3FFu));  // NaN
  if (a >= 0x477FF000u) return static_cast<uint16_t>(sign | 0x7C00u);  // rounds past 65504: inf
  if (a < 0x38800000u) {  // below the smallest normal half: a subnormal (or zero)
    // a * 2^24 rounded to an integer, ties to even (float arithmetic does exactly that here).
    float v;
    const uint32_t ab = a;
    std::memcpy(&v, &ab, sizeof v);
    return static_cast<uint16_t>(sign | static_cast<uint16_t>(std::nearbyint(v * 16777216.0f)));
  }
  const uint32_t mant_odd = (a >> 13) & 1u;
  const uint32_t r = a + 0xFFFu + mant_odd;  // round to nearest even at bit 13
  return static_cast<uint16_t>(sign | static_cast<uint16_t>(((r >> 13) - (112u << 10)) & 0x7FFFu));
}

uint16_t float_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);  // quiet NaN
  u += 0x7FFFu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

namespace {

#if defined(__x86_64__)
__attribute__((target("avx,f16c"))) void widen_half_f16c(const uint16_t* s, int64_t n, float* d) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(d + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i))));
  }
  for (; i < n; ++i) d[i] = half_to_float(s[i]);
}
#endif

}  // namespace

void widen(Dtype t, const void* src, int64_t n, float* dst) {
  if (t == Dtype::kFloat32) {
    std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
    return;
  }
  const auto* s = static_cast<const uint16_t*>(src);
  if (t == Dtype::kBFloat16) {
    for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_float(s[i]);
    return;
  }
#if defined(__x86_64__)
  static const bool f16c = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    return __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C) && (c & bit_AVX) && (c & bit_OSXSAVE);
  }();
  if (f16c) return widen_half_f16c(s, n, dst);
#endif
  for (int64_t i = 0; i < n; ++i) dst[i] = half_to_float(s[i]);
}

}  // namespace kvouter
