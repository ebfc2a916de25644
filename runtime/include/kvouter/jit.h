// The JIT: compiles the registered kvouter_forward / kvouter_combine Generators on demand for a
// (schedule, knobs, target, shape specialisation), and caches the compiled pipelines in process.
// Thread-safe: concurrent requests for one key compile once. Compile time is reported apart and
// never counted in run time.
#pragma once

#include <map>
#include <memory>
#include <string>

#include "kvouter/backend.h"
#include "kvouter/halide_kernels.h"
#include "kvouter/variant.h"

namespace kvouter::halide {

struct JitRequest {
  std::string schedule;
  std::string autoscheduler;  // non-empty: an autoscheduled twin (Adams2019, Mullapudi2016, Li2018)
  std::map<std::string, std::string> knobs;
  std::string target;         // Halide target string; "host" = this machine
  Specialization spec;
  std::string key() const;
};

struct CompiledKernels {
  Kernels kernels;
  double compile_ms = 0;
  std::string target;  // the resolved target string
};

// Throws BackendError naming the schedule and knobs when compiling fails.
std::shared_ptr<const CompiledKernels> jit_compile(const JitRequest& req);
size_t jit_cache_size();

// The 'jit' backend. The autoscheduler name comes from the schedule registry (experiments layer).
// device: "cpu" or "vulkan" (the schedule's); it must agree with the target.
std::unique_ptr<Backend> make_jit_backend(const BackendConfig& cfg, const std::string& autoscheduler,
                                          const std::string& device);

// The resolved Halide target string for a user's --target ("" or "host" = this machine).
std::string resolve_target(const std::string& target);

// The autoscheduler parameters the twins are built with, JIT and `kvouter export` alike: the row of
// schedules/autoscheduler_params.txt (which the AOT twins of generators/CMakeLists.txt read too)
// for this autoscheduler and device, CORES = this machine's logical cores. Throws BackendError
// when the table has no row for them.
std::map<std::string, std::string> autoscheduler_params(const std::string& autoscheduler, bool gpu_target);

}  // namespace kvouter::halide
