// The schedule knobs and their defaults, stated once: the Generators' GeneratorParams, the
// schedules' Knobs (generators/kvouter_funcs.h) and the runtime's knob checking
// (halide_kernels.cpp) all take them from here. No Halide here: the runtime includes it.
#pragma once

namespace kvouter::knob_defaults {

inline constexpr int T = 0;        // edges per tile; 0 = the planner's choice
inline constexpr int chunk = 64;   // positions per chunk (the block is processed chunk by chunk); 0 = the whole block
inline constexpr int vec = 16;     // vector width in floats
inline constexpr int rows = 4;     // register-tile rows (edge x head-lane rows per inner tile)
inline constexpr int unroll = 4;   // vectors per register-tile row (positions or D)
inline constexpr int grain = 1;    // tiles per parallel task
inline constexpr int slice = 0;    // channels of K staged per step (vulkan_onepass; 0 = its choice)

}  // namespace kvouter::knob_defaults
