// The schedule knobs and their defaults, stated once: the Generators' GeneratorParams, the
// schedules' Knobs (generators/kvouter_funcs.h) and the runtime's knob checking
// (runtime/src/variant.cpp) all take them from here. No Halide here: the runtime includes it.
#pragma once

namespace kvouter::knob_defaults {

inline constexpr int T = 0;        // edges per tile; 0 = the planner's choice
inline constexpr int chunk = 64;   // positions per chunk (the block is processed chunk by chunk); 0 = the whole block
// vec, rows and unroll: 0 = sized to the target by resolve_knobs (generators/schedule_registry.h):
// on a CPU the target's natural vector width and a register tile of half its vector registers
// (AVX-512: 16 floats, 4 x 4; AVX2: 8 floats, 4 x 2); on a GPU 16, 4 and 4.
inline constexpr int vec = 0;      // vector width in floats
inline constexpr int rows = 0;     // register-tile rows (edge x head-lane rows per inner tile)
inline constexpr int unroll = 0;   // vectors per register-tile row (positions or D)
inline constexpr int grain = 1;    // tiles per parallel task
inline constexpr int slice = 0;    // channels of K staged per step (vulkan_onepass; 0 = its choice)
// Tiles ahead whose K and V rows a tile requests into the L2 while it computes (cpu_decode, which
// then reads K and V in place; 0 = none, the chunks copied per tile).
inline constexpr int ahead = 0;

}  // namespace kvouter::knob_defaults
