// The AOT kernel registry: kernels generated at build time (CMake's add_halide_library, one per
// configuration) register here, and the 'aot' backend dispatches to them with no compiler at run
// time. Generic variants (no shape specialisation) serve every valid input; specialised ones are
// preferred where they match.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "kvouter/backend.h"
#include "kvouter/halide_kernels.h"
#include "kvouter/variant.h"

namespace kvouter::halide {

using AotForwardFn = int (*)(halide_buffer_t*, halide_buffer_t*, halide_buffer_t*, halide_buffer_t*,
                             halide_buffer_t*, halide_buffer_t*, halide_buffer_t*, float, halide_buffer_t*);
using AotCombineFn = int (*)(halide_buffer_t*, halide_buffer_t*, halide_buffer_t*, halide_buffer_t*);

struct AotVariant {
  std::string name;      // e.g. kvouter_cpu_tiled_d128_p16_b64_q8_t16
  std::string schedule;  // registry name of the schedule
  std::string target;    // the target it was generated for ("host" = the build machine)
  Specialization spec;   // zeros = generic
  std::string knobs;     // "k=v,..." as generated (the knobs not in spec)
  AotForwardFn forward;
  AotCombineFn combine;
  const halide_device_interface_t* (*device)() = nullptr;  // Vulkan variants: the device interface
  // Autoscheduled twins: the autoscheduler's parameters they were generated with ("k=v,...";
  // aot_test checks them against halide::autoscheduler_params, which the JIT and export use).
  std::string autoscheduler_params = {};
  // The GeneratorParams of the forward and the combine as generated ("k=v,..."; aot_test checks
  // them against halide::generator_params, which the JIT and export use).
  std::string forward_params = {};
  std::string combine_params = {};
  // The Halide target it was generated for, with its features (aot_test checks the 16-bit storage
  // features against halide::storage_target, which the JIT and export use).
  std::string halide_target = {};
};

void aot_register(const AotVariant& v);

// The device cache's in-place writer (generators/kvouter_kv_write) for one GPU target and element
// size: (rows, row_page, row_slot, pool).
using AotKvWriteFn = int (*)(halide_buffer_t*, halide_buffer_t*, halide_buffer_t*, halide_buffer_t*);
struct AotKvWriter {
  std::string target;  // host-vulkan or host-cuda
  int bits;            // 32 or 16
  AotKvWriteFn write;
  const halide_device_interface_t* (*device)();
};
void aot_register_kv_writer(const AotKvWriter& w);
// Throws BackendError when none was generated for (target, bits).
const AotKvWriter& aot_kv_writer(const std::string& target, int bits);
// The step runner's decode plan (generators/kvouter_decode_plan) for one target (host-vulkan,
// host-cuda, or host): (step, tables, tq, hkv, topk, block_size, page_size, num_pages, tile_pages,
// tile_limit, partial_index).
using AotDecodePlanFn = int (*)(halide_buffer_t*, halide_buffer_t*, int32_t, int32_t, int32_t, int32_t, int32_t, int32_t,
                                halide_buffer_t*, halide_buffer_t*, halide_buffer_t*);
struct AotDecodePlan {
  std::string target;
  AotDecodePlanFn plan;
  const halide_device_interface_t* (*device)();  // nullptr for the host's
};
void aot_register_decode_plan(const AotDecodePlan& p);
// Throws BackendError when none was generated for the target.
const AotDecodePlan& aot_decode_plan(const std::string& target);
// The generated writers of a GPU target (host-vulkan, host-cuda) as its device kit, after the
// device checks (BackendError without such a device, or for another target).
std::shared_ptr<const DeviceKit> generated_device_kit(const std::string& target);

// A variant as kernels the runtime runs (on a GPU target, with the target's generated device kit).
Kernels aot_kernels(const AotVariant& v);

// On a CPU Vulkan device (lavapipe), refuses a generic Vulkan variant whose loops would pass the
// device's per-invocation limit (its results would be silently wrong).
void check_generic_vulkan_loops(const AotVariant& v, const Plan& plan);
// Where the last Halide runtime error message of this thread can be read (set by the generated
// registry, which owns the Halide runtime's error handler).
void set_aot_error_source(std::string (*source)());
const std::vector<AotVariant>& aot_variants();
// Whether the registered variant of that name is generic (no shape specialised); false for an
// unknown name.
bool aot_variant_is_generic(const std::string& name);

// Best variant for (schedule, target, plan): an exact specialisation, else the generic one; with
// `name`, only the variant of that name. Throws BackendError when none fits.
const AotVariant& aot_select(const std::string& schedule, const std::string& target, const Plan& plan,
                             const std::string& name = "");

// Every variant of (schedule, target) that fits the plan, the one aot_select picks first.
std::vector<std::string> aot_fitting(const std::string& schedule, const std::string& target, const Plan& plan);

std::unique_ptr<Backend> make_aot_backend(const BackendConfig& cfg);

}  // namespace kvouter::halide
