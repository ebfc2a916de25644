// kvouter export: AOT-generate one configuration.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "cli/cli.h"
#include "kvouter/case_io.h"
#include "kvouter/errors.h"
#include "kvouter/jit.h"
#include "kvouter/variant.h"
#include "registry.h"
#include "schedule_registry.h"
#include "tuner.h"

namespace kvouter::cli {

// AOT-generates one configuration (e.g. a tuned one) for a target: a static library, its header,
// the .stmt and the schedule, through the same registered Generators the build uses.
int cmd_export(const std::vector<std::string>& a) {
  std::string schedule, target = "host", out, name, from_case;
  bool tuned = false;
  std::optional<Dtype> dtype;
  std::map<std::string, std::string> params;
  for (size_t i = 0; i < a.size(); ++i) {
    auto value = [&] { return option_value(a, i); };
    if (a[i] == "--schedule") schedule = value();
    else if (a[i] == "--target") target = value();
    else if (a[i] == "--out") out = value();
    else if (a[i] == "--name") name = value();
    else if (a[i] == "--from-case") from_case = value();
    else if (a[i] == "--tuned") tuned = true;
    else if (a[i] == "--dtype") dtype = dtype_value("export", a, i);
    else if (a[i] == "--param") add_param(value(), &params);
    else {
      throw UsageError("export: unknown argument '" + a[i] + "'");
    }
  }
  if (out.empty()) throw UsageError("export: expected --out DIR");
  if (tuned) {
    if (from_case.empty()) throw UsageError("export --tuned: expected --from-case DIR (whose shape class to look up)");
    auto choice = kx::lookup_tuned(load_case(from_case), target, tuning_db_path());
    if (!choice) throw BackendError("export --tuned: the tuning database " + tuning_db_path() + " has no entry for this case's shape class on this machine");
    schedule = choice->schedule;
    params = choice->knobs;
  }
  // Without --schedule, what `kvouter run` would take untuned: the case's shape class's default,
  // or for a generic variant the target's (cpu_tiled on the CPU, the GPU default on a GPU target).
  if (schedule.empty()) {
    schedule = from_case.empty() ? kx::default_schedule(target)
                                 : kx::default_schedule(target, validate(load_case(from_case)));
  }
  const pipeline::ScheduleInfo* info = pipeline::find_schedule(schedule);
  if (!info) throw BackendError("--schedule: unknown schedule '" + schedule + "'");
  // A variant specialised to a case takes the schedule's defaults (the block as one chunk), as run
  // and the JIT give them; a generic Vulkan variant keeps its chunk in registers.
  if (!from_case.empty()) {
    for (const auto& [k, v] : info->default_params) params.emplace(k, v);
  }
  auto knobs = halide::checked_knobs(params);
  halide::Specialization spec;  // generic unless a case fixes the shape
  if (!from_case.empty()) {
    Inputs in = load_case(from_case);
    const Plan plan = make_plan(in, {halide::tile_edges_of(knobs)});
    spec = halide::Specialization::of(plan);
    // Autoscheduled twins are generated for the case's real extents (as the JIT does).
    if (!info->autoscheduler.empty()) spec = spec.with_extents(plan);
  }
  if (dtype) {
    if (!from_case.empty() && *dtype != spec.dtype) {
      throw UsageError("export: --dtype " + dtype_name(*dtype) + " contradicts the case's " + dtype_name(spec.dtype));
    }
    spec.dtype = *dtype;
  }
  // The build's naming rule (halide::variant_name), with the knobs given on the command line.
  if (name.empty()) name = halide::variant_name(schedule, target, spec, {params.begin(), params.end()});
  target = halide::storage_target(target, spec.dtype);
  std::filesystem::create_directories(out);
  std::string autos;
  if (!info->autoscheduler.empty()) {
    std::string lower = info->autoscheduler;
    for (auto& ch : lower) ch = static_cast<char>(std::tolower(ch));
    autos = std::string(" -p ") + KVOUTER_HALIDE_LIBDIR + "/libautoschedule_" + lower + ".so autoscheduler=" +
            info->autoscheduler;
    for (const auto& [k, v] : halide::autoscheduler_params(info->autoscheduler, is_vulkan_target(target) || is_cuda_target(target))) {
      autos += " autoscheduler." + k + "=" + v;
    }
  }
  // The GeneratorParams as the JIT compiles with them (halide::generator_params).
  const halide::GeneratorParams params_of = halide::generator_params(schedule, knobs, spec);
  auto gen = [&](const std::string& generator, const std::string& fn, const std::map<std::string, std::string>& gp) {
    std::string cmd = std::string(KVOUTER_GENERATOR_PATH) + " -g " + generator + " -f " + fn + " -o " + out +
                      " -e static_library,c_header,stmt,schedule target=" + target;
    for (const auto& [k, v] : gp) cmd += " " + k + "=" + v;
    cmd += autos;
    std::printf("%s\n", cmd.c_str());
    if (std::system(cmd.c_str()) != 0) throw BackendError("export: the generator failed for " + fn);
  };
  gen("kvouter_forward", name + "_fwd", params_of.forward);
  gen("kvouter_combine", name + "_comb", params_of.combine);
  std::printf("exported %s_fwd and %s_comb (static library, header, .stmt, schedule) to %s\n", name.c_str(),
              name.c_str(), out.c_str());
  return 0;
}

}  // namespace kvouter::cli
