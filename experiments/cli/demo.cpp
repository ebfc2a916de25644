// kvouter demo: a named shape through every backend and schedule, checked against the oracle.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "../../reference/dense_eigen.h"
#include "case_gen.h"
#include "cli/cli.h"
#include "cli_util.h"
#include "kvouter/errors.h"
#include "kvouter/jit.h"
#include "schedule_registry.h"

namespace kvouter::cli {

int cmd_demo(const std::vector<std::string>& args) {
  std::string shape = "tiny";
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--shape" && i + 1 < args.size()) shape = args[++i];
    else throw UsageError("demo: unknown argument '" + args[i] + "'");
  }
  Inputs in = kx::make_case(kx::named_shape(shape));
  const Problem prob = validate(in);
  const Outputs ref = reference::dense_attention<double>(in, prob);
  std::printf("shape %s: Tq=%lld Hq=%lld Hkv=%lld D=%lld block=%lld page=%lld topk=%lld (oracle: Eigen dense, float64)\n",
              shape.c_str(), (long long)prob.Tq, (long long)prob.Hq, (long long)prob.Hkv, (long long)prob.D,
              (long long)prob.block_size, (long long)prob.page_size, (long long)prob.topk);
  std::printf("%-8s %-18s %-10s %12s %12s %10s %12s %s\n", "backend", "schedule", "target", "median_ms",
              "GFLOP/s", "plan_ms", "max|err|", "check");
  bool all_ok = true;
  for (const auto& info : BackendRegistry::instance().all()) {
    for (const auto& sched : info.schedules()) {
      BackendConfig cfg{info.name, sched, {}, ""};
      // Vulkan schedules run on the Vulkan device (lavapipe in CI); the autoscheduled GPU twins
      // have known wrong results on some shapes (docs/vulkan.md) and are left to the gpu tests.
      const pipeline::ScheduleInfo* si = pipeline::find_schedule(sched);
      if (si && si->device == "vulkan") {
        if (!si->autoscheduler.empty()) {
          std::printf("%-8s %-18s skipped: an autoscheduled GPU twin (see the gpu tests)\n", info.name.c_str(), sched.c_str());
          continue;
        }
        cfg.target = "host-vulkan";
      }
      std::unique_ptr<Backend> backend;
      try {
        backend = info.make(cfg);
      } catch (const BackendError& e) {
        std::printf("%-8s %-18s skipped: %s\n", info.name.c_str(), sched.c_str(), e.what());
        continue;
      }
      Plan plan = make_plan(in, backend->plan_options());
      kx::Measurement m;
      try {
        kx::MeasureOptions opt;
        opt.repeats = 5;
        opt.warm_call = false;
        opt.reference = &ref;
        m = kx::measure(*backend, plan, in, opt);
      } catch (const BackendError& e) {
        std::printf("%-8s %-18s skipped: %s\n", info.name.c_str(), sched.c_str(), e.what());
        continue;
      }
      const double ms = m.median();
      const auto& err = m.err;
      all_ok &= err.ok();
      const std::string target = backend->target() == halide::resolve_target("host") ? "host"
                                 : is_vulkan_target(backend->target()) ? "host-vulkan"
                                                                       : backend->target();
      std::printf("%-8s %-18s %-10s %12.3f %12.2f %10.3f %12.2e %s\n", backend->name().c_str(),
                  backend->schedule().c_str(), target.c_str(), ms, plan.flops() / (ms * 1e6),
                  plan.plan_ms, err.max_out_err, err.ok() ? "ok" : "FAIL");
    }
  }
  return all_ok ? 0 : 1;
}

}  // namespace kvouter::cli
