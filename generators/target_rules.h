// What a CPU target's registers allow, in one place for the generators, the tuner, the tests and
// CMake (cmake/prefill_tile_probe.cpp asks prefill_wide_tile about the AOT target at configure
// time, so that the build and the C++ never disagree about which tile a variant has).
#pragma once

#include "Halide.h"

namespace kvouter::pipeline {

// Any of Halide's AVX-512 features: a target may name a flavour alone ("avx512_skylake"), which
// Halide compiles with zmm registers without the plain "avx512" feature.
inline bool has_avx512(const Halide::Target& target) {
  using T = Halide::Target;
  return target.has_feature(T::AVX512) || target.has_feature(T::AVX512_KNL) || target.has_feature(T::AVX512_Skylake) ||
         target.has_feature(T::AVX512_Cannonlake) || target.has_feature(T::AVX512_SapphireRapids) ||
         target.has_feature(T::AVX512_Zen4) || target.has_feature(T::AVX512_Zen5);
}

// A CPU target's vector registers: 32 with AVX-512 (any of Halide's AVX-512 features) and on ARM,
// 16 on other x86 (resolve_knobs's register tile and the CPU schedules' keep rule,
// TuneShape::vector_registers).
inline int vector_registers(const Halide::Target& target) {
  return target.arch == Halide::Target::X86 && !has_avx512(target) ? 16 : 32;
}

// Whether the SPEC prefill AOT variants of cpu_tiled take the 6 x 4 register tile (the tuned JIT
// default there, schedules/cpu_tiled.cpp) for this target: on x86 with any AVX-512 feature. Not
// every 32-register target: ARM's variants keep resolve_knobs's tile. generators/CMakeLists.txt
// asks this function (through cmake/prefill_tile_probe.cpp) about the AOT host target, resolved
// by Halide as the generator resolves it; aot_test checks every registered variant against it.
inline bool prefill_wide_tile(const Halide::Target& target) {
  return target.arch == Halide::Target::X86 && has_avx512(target);
}

}  // namespace kvouter::pipeline
