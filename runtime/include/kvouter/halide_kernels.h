// Running the Halide pipelines (JIT-compiled or AOT-generated alike) over a Plan: wraps the
// runtime's C-order arrays as Halide buffers (dimensions reversed), calls forward then combine.
#pragma once

#include <HalideRuntime.h>

#include <functional>
#include <map>
#include <memory>
#include <string>

#include "kvouter/backend.h"
#include "kvouter/variant.h"  // Specialization, variant naming and knobs (moved there; included for their users)

namespace kvouter::halide {

// Argument order of the kvouter_forward and kvouter_combine generators.
using ForwardFn = std::function<int(halide_buffer_t* q, halide_buffer_t* k_pages, halide_buffer_t* v_pages,
                                    halide_buffer_t* tile_head, halide_buffer_t* tile_pages,
                                    halide_buffer_t* tile_query, halide_buffer_t* tile_limit, float scale,
                                    halide_buffer_t* partials)>;
using CombineFn = std::function<int(halide_buffer_t* partials, halide_buffer_t* partial_index,
                                    halide_buffer_t* out, halide_buffer_t* lse)>;

// The device cache's in-place writer (generators/kvouter_kv_write): (rows, row_page, row_slot, pool).
using KvWriteFn = std::function<int(halide_buffer_t* rows, halide_buffer_t* row_page, halide_buffer_t* row_slot,
                                    halide_buffer_t* pool)>;

// The step runner's decode plan (generators/kvouter_decode_plan): (step, tables, tq, hkv, topk,
// block_size, page_size, num_pages, tile_pages, tile_limit, partial_index).
using DecodePlanFn = std::function<int(halide_buffer_t* step, halide_buffer_t* tables, int32_t tq, int32_t hkv,
                                       int32_t topk, int32_t block_size, int32_t page_size, int32_t num_pages,
                                       halide_buffer_t* tile_pages, halide_buffer_t* tile_limit,
                                       halide_buffer_t* partial_index)>;

// A GPU target's device, with the device cache's writers compiled for it (AOT-generated or
// JIT-compiled, from the same runtime as the kernels that read the cache).
struct DeviceKit {
  std::string target;  // host-vulkan or host-cuda (with or without features)
  const halide_device_interface_t* dev = nullptr;
  KvWriteFn write32, write16;  // per element size
  DecodePlanFn decode_plan;    // the step runner's decode plan on the device
  const KvWriteFn& writer(int bits) const { return bits == 16 ? write16 : write32; }
};

struct Kernels {
  ForwardFn forward;
  CombineFn combine;
  std::string origin;  // "aot" or "jit"
  // The device the kernels run on (Vulkan, CUDA), or nullptr for host kernels.
  const halide_device_interface_t* device = nullptr;
  // With a device: its kit. The kernels then run through the device cache and step runner
  // (kvouter/device_cache.h), as an engine calls them.
  std::shared_ptr<const DeviceKit> kit;
  // What the kernels are: an AOT variant's name, or the JIT's compile key.
  std::string name;
  // For errors: "aot <variant>" or "jit <key>".
  std::string description() const { return origin + " " + name; }
};

// q, K or V's Halide element type in their storage dtype: float32, float16, or bfloat16 as its
// uint16 bits (the pipelines' input types, generators/kvouter_forward_generator.cpp).
halide_type_t storage_type(Dtype t);

// Kernels emit kMaskedScore (finite) as the LSE of an empty row; this writes SPEC's -inf there.
void finish_lse(const TensorView<float>& lse);

// Runs forward then combine over the plan (on the kernels' device where they have one), timed as
// `kt` asks; fills `timing`.
Outputs run_kernels(const Kernels& kernels, const Plan& plan, const InputsView& in, RunTiming* timing,
                    const KernelTiming& kt = {});
// The same into caller memory (check_outputs first). Host kernels keep their partials in
// `partials` where given: grown to the largest plan run and reused across calls (a backend's own,
// so that an engine's step allocates and faults in nothing; kvouter_bench's call_ms), else in an
// array of this call. (Every pipeline writes its whole partials buffer.)
void run_kernels(const Kernels& kernels, const Plan& plan, const InputsView& in, const OutputsView& out,
                 RunTiming* timing, const KernelTiming& kt = {}, HostArray<float>* partials = nullptr);

}  // namespace kvouter::halide
