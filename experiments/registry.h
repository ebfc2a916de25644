// The one place where backends are registered: adding a backend is a class plus one line here.
#pragma once

#include <string>

#include "kvouter/inputs.h"

namespace kvouter::experiments {

void register_all_backends();

// The backend the CLI uses when --backend is not given: the fastest correct one on this machine.
const char* default_backend();
const char* default_cpu_schedule();
// The default schedule of a GPU target (host-vulkan or host-cuda) on the devices present.
const char* default_gpu_schedule(const std::string& target);
// The schedule for a step on `target` where the tuning database has no entry for its shape class
// on this machine: a GPU target's default_gpu_schedule; on the CPU cpu_decode for a decode step
// (every sequence one query), else default_cpu_schedule().
const char* default_schedule(const std::string& target, const Problem& p);
// The same without a step (a generic variant): a GPU target's default_gpu_schedule, else
// default_cpu_schedule().
const char* default_schedule(const std::string& target);
// "host-vulkan" where a Vulkan GPU (not a CPU device such as lavapipe) is present, else "host".
std::string default_target();

}  // namespace kvouter::experiments
