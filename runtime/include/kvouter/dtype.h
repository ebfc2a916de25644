// The storage dtypes of q, k_pages and v_pages (SPEC section 1): float32, float16 (IEEE binary16)
// and bfloat16 (the upper 16 bits of a float32). 16-bit values are held as their bits (uint16_t);
// every value widens to float32 exactly, and all arithmetic is float32.
#pragma once

#include <cstdint>
#include <string>

namespace kvouter {

enum class Dtype : uint8_t { kFloat32, kFloat16, kBFloat16 };

// "float32", "float16", "bfloat16" (SPEC's names); "dtype(N)" for a value outside the three.
std::string dtype_name(Dtype t);
// The three names, and nothing else; false otherwise.
bool parse_dtype(const std::string& name, Dtype* t);
bool dtype_known(Dtype t);
inline int dtype_bytes(Dtype t) { return t == Dtype::kFloat32 ? 4 : 2; }

// Exact widenings (subnormals, infinities and NaN included).
float half_to_float(uint16_t h);
inline float bf16_to_float(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  __builtin_memcpy(&f, &u, sizeof f);
  return f;
}
// Rounding to nearest, ties to even; overflow gives infinity, NaN stays NaN.
uint16_t float_to_half(float f);
uint16_t float_to_bf16(float f);

// n elements of storage dtype t at src, widened into dst (F16C where the CPU has it).
void widen(Dtype t, const void* src, int64_t n, float* dst);

}  // namespace kvouter
