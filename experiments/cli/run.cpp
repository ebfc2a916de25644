// kvouter run CASE_DIR: one case folder through one backend (SPEC section 4).
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "cli/cli.h"
#include "kvouter/case_io.h"
#include "kvouter/errors.h"
#include "provenance.h"
#include "registry.h"
#include "tuner.h"

namespace kvouter::cli {

struct RunArgs {
  std::string case_dir, out_dir, json_path;
  BackendConfig cfg;
  int repeat = 1;
  double warmup_ms = 0;
};

RunArgs parse_run(const std::vector<std::string>& a) {
  RunArgs r;
  for (size_t i = 0; i < a.size(); ++i) {
    auto value = [&] { return option_value(a, i); };
    if (a[i] == "--out") r.out_dir = value();
    else if (a[i] == "--json") r.json_path = value();
    else if (a[i] == "--backend") r.cfg.backend = value();
    else if (a[i] == "--schedule") r.cfg.schedule = value();
    else if (a[i] == "--target") r.cfg.target = value();
    else if (a[i] == "--param") add_param(value(), &r.cfg.params);
    else if (a[i] == "--repeat") r.repeat = repeat_value(value());
    else if (a[i] == "--warmup-ms") {
      r.warmup_ms = warmup_ms_value(value());
    } else if (!a[i].empty() && a[i][0] == '-') {
      throw UsageError("unknown option '" + a[i] + "' (see kvouter run --help)");
    } else if (r.case_dir.empty()) {
      r.case_dir = a[i];
    } else {
      throw UsageError("unexpected argument '" + a[i] + "'");
    }
  }
  if (r.case_dir.empty()) throw UsageError("run: expected CASE_DIR (see kvouter run --help)");
  if (r.out_dir.empty()) r.out_dir = r.case_dir;
  return r;
}

int cmd_run(const std::vector<std::string>& args) {
  RunArgs ra = parse_run(args);
  Inputs in = load_case(ra.case_dir);
  // The default: the tuned winner for this shape class on this machine (jit, no --param), else the
  // shape class's schedule (kx::default_schedule: cpu_decode for a decode step); without
  // --backend, the default backend on a GPU when one is present (kx::default_target). A Halide
  // backend named without --schedule chooses the same way, never one schedule for every shape.
  const bool backend_named = !ra.cfg.backend.empty();
  if (!backend_named) {
    ra.cfg.backend = kx::default_backend();
    if (ra.cfg.target.empty() && ra.cfg.schedule.empty()) ra.cfg.target = kx::default_target();
  }
  const bool halide = ra.cfg.backend == "jit" || ra.cfg.backend == "aot";
  if (ra.cfg.schedule.empty() && (backend_named ? halide : ra.cfg.params.empty())) {
    const Problem problem = validate(in);  // bad input is reported as such, before any look-up
    const std::string target = ra.cfg.target.empty() ? "host" : ra.cfg.target;
    const auto tuned = ra.cfg.backend == "jit" && ra.cfg.params.empty()
                           ? kx::lookup_tuned(in, target, tuning_db_path())
                           : std::nullopt;
    if (tuned) {
      ra.cfg.schedule = tuned->schedule;
      ra.cfg.params = tuned->knobs;
    } else {
      ra.cfg.schedule = kx::default_schedule(target, problem);
    }
  }
  const Prepared p = prepare(ra.cfg, in);
  kx::MeasureOptions opt;
  opt.repeats = ra.repeat;
  opt.warmup_ms = ra.warmup_ms;
  opt.warm_call = false;  // a case runs once unless --repeat asks for more
  const kx::Measurement m = kx::measure(*p.backend, p.plan, in, opt);
  save_outputs(ra.out_dir, m.out);
  print_summary(p, m);
  if (!ra.json_path.empty()) {
    nlohmann::json rec = kx::measurement_record(m, p.plan);
    rec.update({{"kind", "run"}, {"case", ra.case_dir}, {"backend", p.backend->name()},
                {"schedule", p.backend->schedule()}, {"knobs", p.backend->params()}, {"target", p.backend->target()},
                {"git_rev", kx::git_revision()}, {"halide_version", kx::halide_version()},
                {"machine", kx::machine_fingerprint()}, {"timestamp", kx::now_iso()}});
    std::ofstream f(ra.json_path);
    if (!(f << rec.dump(1) << "\n")) throw CaseFileError("--json: cannot write " + ra.json_path);
  }
  return 0;
}

}  // namespace kvouter::cli
