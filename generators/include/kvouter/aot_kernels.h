// The kernels generated at build time (generators/CMakeLists.txt, KVOUTER_AOT_CONFIGS).
#pragma once

namespace kvouter::halide {

// Registers every generated variant with the AOT registry (idempotent).
void register_generated_aot_kernels();

}  // namespace kvouter::halide
