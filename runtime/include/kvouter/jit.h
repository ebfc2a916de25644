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

// The autoscheduler parameters the twins are built with, JIT and `kvouter export` alike (the AOT
// twins of generators/CMakeLists.txt pass the CPU ones for the 2-core build machine):
// parallelism = the host's cores; Adams2019 greedy (beam_size=1: its default beam search exhausted
// 8 GB in 45 s on this pipeline); on a GPU target Mullapudi2016's experimental GPU schedule and
// Anderson2021 with the H200's 132 SMs, greedy.
std::map<std::string, std::string> autoscheduler_params(const std::string& autoscheduler, bool gpu_target);

}  // namespace kvouter::halide
