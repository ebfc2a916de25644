// The SPIR-V stage: a rewrite of every Vulkan shader module Halide hands the driver, so that the
// driver's compiler can optimise what Halide 21's SPIR-V does not let it (docs/spirv_stage.md).
//
//   1. NonWritable on each storage buffer the module never writes, NonReadable on each it never
//      reads, derived from the module's own loads, stores and atomics through any access chain.
//   2. Barrier memory semantics narrowed to workgroup memory, where the module proves that no
//      storage buffer is both written and read in it (so a workgroup's invocations cannot
//      exchange data through device memory); an OpMemoryBarrier left ordering nothing beyond its
//      OpControlBarrier is removed. A module that reads and writes one buffer keeps every fence.
//   3. On a device that can keep float32 subnormals (shaderDenormPreserveFloat32), the
//      DenormPreserve 32 execution mode on each compute entry point (SPV_KHR_float_controls), so
//      that the driver does not flush subnormal inputs and results to zero, as the CPU and CUDA
//      kernels do not (the NVIDIA driver flushes them without it).
//
// Anything the analysis does not understand (a pointer passed to a call, a phi of pointers, an
// image write) counts as both a read and a write: the stage only ever leaves a module unchanged
// where it cannot prove a rewrite safe. The rewrite keeps every id, binding and specialisation id.
//
// The runtime installs it for JIT and AOT Vulkan pipelines alike (vulkan_probe.h,
// install_spirv_stage). It is on by default; KVOUTER_SPIRV_STAGE=off turns it off for comparison
// runs, and KVOUTER_SPIRV_DUMP=DIR writes every module before (N.in.spv) and after (N.out.spv).
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace kvouter::spirv {

// A module that is not well-formed SPIR-V (bad magic, an instruction past the end).
class SpirvError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// What one rewrite did.
struct RewriteReport {
  int storage_buffers = 0;    // storage-buffer variables in the module
  int non_writable = 0;       // decorated NonWritable by the stage
  int non_readable = 0;       // decorated NonReadable by the stage
  int barriers = 0;           // OpControlBarrier + OpMemoryBarrier seen
  int barriers_narrowed = 0;  // semantics narrowed to workgroup memory
  int barriers_removed = 0;   // OpMemoryBarrier removed (covered by its OpControlBarrier)
  int denorm_preserve = 0;     // entry points given DenormPreserve 32
  // Why the device-memory fences were kept (empty when they were narrowed or there were none).
  std::string fence_kept_because;
  bool changed() const {
    return non_writable + non_readable + barriers_narrowed + barriers_removed + denorm_preserve > 0;
  }
};

// What the device allows beyond the analysis' own rewrites.
struct RewriteOptions {
  // Give each GLCompute entry point without a float32 denormal mode DenormPreserve 32 (with the
  // DenormPreserve capability and, below SPIR-V 1.4, the SPV_KHR_float_controls extension).
  // Only for a device whose shaderDenormPreserveFloat32 is true.
  bool denorm_preserve_32 = false;
};

// Rewrites one module (words, host byte order). Throws SpirvError on a malformed module.
std::vector<uint32_t> rewrite(const uint32_t* words, size_t count, RewriteReport* report = nullptr,
                              const RewriteOptions& options = {});
inline std::vector<uint32_t> rewrite(const std::vector<uint32_t>& m, RewriteReport* r = nullptr,
                                     const RewriteOptions& options = {}) {
  return rewrite(m.data(), m.size(), r, options);
}

// False when KVOUTER_SPIRV_STAGE is "off" or "0" (read once per process).
bool stage_enabled();

// Whether Halide's Vulkan devices keep robustBufferAccess (Halide 21 enables every feature a
// device offers). KVOUTER_VK_ROBUST_ACCESS=off creates them without it: an out-of-range access
// is then undefined instead of reading 0. Read once per process; on by default.
bool robust_access();

// KVOUTER_SPIRV_DENORMS (read once per process) picks which devices' modules get DenormPreserve
// 32: unset, those that report shaderDenormPreserveFloat32; "driver", none (the driver's own
// float32 denormal behaviour, for comparison runs; also with the stage off); "force", every
// Vulkan 1.2 device, also one that does not report it. Forcing is outside the Vulkan
// specification (the validation layer rejects it): an experiment switch, to learn what a driver
// does with the mode. This is the one rule the device hook applies and the tests expect.
bool asks_denorm_preserve(bool device_is_vulkan_1_2, bool device_reports_preserve);

// What the installed stage has done in this process, summed over modules.
struct StageStats {
  int64_t modules = 0;       // modules that reached vkCreateShaderModule through the stage
  int64_t rewritten = 0;     // of which changed
  int64_t fences_kept = 0;   // of which kept their device-memory fences
  int64_t errors = 0;        // of which could not be parsed (passed on unchanged)
  int64_t non_writable = 0, non_readable = 0, barriers_narrowed = 0, barriers_removed = 0;
  int64_t devices_without_robust_access = 0;  // devices created with robustBufferAccess cleared
  int64_t devices_created = 0;                 // devices created through the stage's vkCreateDevice
  int64_t devices_preserving_denorms = 0;      // of which their modules get DenormPreserve 32
  int64_t denorm_preserve = 0;                 // modules given DenormPreserve 32
};
StageStats stage_stats();

// Halide's library-symbol lookup with the stage in front of the Vulkan loader: the same symbol
// as dlsym(lib, name), except that "vkGetInstanceProcAddr" comes back wrapped so that the
// modules given to vkCreateShaderModule pass through rewrite(). Installed into Halide's runtimes
// with halide_set_custom_get_library_symbol (AOT) and JITSharedRuntime's default handlers (JIT).
void* get_library_symbol(void* lib, const char* name);

}  // namespace kvouter::spirv
