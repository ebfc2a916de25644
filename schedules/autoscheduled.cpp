// The autoscheduled twins: the same pipelines with no manual schedule, scheduled by one of
// Halide's autoschedulers when compiled (their parameters: autoscheduler_params.txt here, read by
// the AOT build and the JIT alike).
#include "schedule_registry.h"

namespace kvouter::pipeline {

namespace {

[[maybe_unused]] const bool registered = [] {
  register_schedule({"auto_adams2019", "cpu", nullptr, nullptr, "Adams2019", "Adams2019 autoscheduler twin"});
  register_schedule({"auto_mullapudi2016", "cpu", nullptr, nullptr, "Mullapudi2016", "Mullapudi2016 autoscheduler twin"});
  register_schedule({"auto_li2018", "cpu", nullptr, nullptr, "Li2018", "Li2018 autoscheduler twin"});
  register_schedule({"auto_anderson2021", "vulkan", nullptr, nullptr, "Anderson2021", "Anderson2021 (GPU) autoscheduler twin"});
  return register_schedule({"auto_mullapudi2016_gpu", "vulkan", nullptr, nullptr, "Mullapudi2016",
                            "Mullapudi2016 autoscheduler twin with its experimental GPU schedules"});
}();

}  // namespace

}  // namespace kvouter::pipeline
