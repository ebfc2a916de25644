// The one place where backends are registered: adding a backend is a class plus one line here.
#pragma once

#include <string>

#include "kvouter/inputs.h"

namespace kvouter::experiments {

void register_all_backends();

// The backend the CLI uses when --backend is not given: the fastest correct one on this machine.
const char* default_backend();
const char* default_cpu_schedule();
// The CPU schedule for a step on a machine whose tuning database has no entry for its shape class:
// cpu_decode for a decode step (every sequence one query), else default_cpu_schedule() — each
// shape class's winner on every host measured.
const char* default_cpu_schedule(const Problem& p);
// The default schedule of a GPU target (host-vulkan or host-cuda) on the devices present.
const char* default_gpu_schedule(const std::string& target);
// "host-vulkan" where a Vulkan GPU (not a CPU device such as lavapipe) is present, else "host".
std::string default_target();

}  // namespace kvouter::experiments
