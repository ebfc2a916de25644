// kvouter compare: the AOT variant a case selects against the JIT compile of its configuration.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "case_gen.h"
#include "cli/cli.h"
#include "cli_util.h"
#include "kvouter/aot.h"
#include "kvouter/case_io.h"
#include "registry.h"

namespace kvouter::cli {

// The AOT kernel a plan selects and the JIT compile of the same configuration (schedule, knobs and
// T of that variant), timed in this process the way `kvouter run` times them, in alternating
// rounds. Exit 1 when, in the median over pairs of rounds of their own ratios, the slower is
// more than --max-ratio times the faster, or when the two disagree beyond SPEC's tolerance.
int cmd_compare(const std::vector<std::string>& a) {
  std::string case_dir, shape, schedule, target = "host";
  int repeat = 5;
  double warmup_ms = 0, max_ratio = 1.15;
  for (size_t i = 0; i < a.size(); ++i) {
    auto value = [&] { return option_value(a, i); };
    if (a[i] == "--shape") shape = value();
    else if (a[i] == "--schedule") schedule = value();
    else if (a[i] == "--target") target = value();
    else if (a[i] == "--warmup-ms") warmup_ms = warmup_ms_value(value());
    else if (a[i] == "--repeat") repeat = repeat_value(value());
    else if (a[i] == "--max-ratio") {
      const std::string v = value();
      size_t used = 0;
      try { max_ratio = std::stod(v, &used); } catch (...) { used = 0; }
      if (used != v.size() || !(max_ratio >= 1)) throw UsageError("--max-ratio: expected a number >= 1, got '" + v + "'");
    } else if (!a[i].empty() && a[i][0] == '-') {
      throw UsageError("compare: unknown option '" + a[i] + "'");
    } else if (case_dir.empty()) {
      case_dir = a[i];
    } else {
      throw UsageError("compare: unexpected argument '" + a[i] + "'");
    }
  }
  if (case_dir.empty() == shape.empty()) throw UsageError("compare: expected CASE_DIR or --shape NAME (one of them)");
  const Inputs in = shape.empty() ? load_case(case_dir) : kx::make_case(kx::named_shape(shape));
  // By default the schedule `kvouter run` takes on a machine without a tuned entry.
  if (schedule.empty()) schedule = kx::default_schedule(target, validate(in));

  const Prepared aot = prepare({"aot", schedule, {}, target}, in);
  const halide::AotVariant& v =
      halide::aot_select(schedule, is_vulkan_target(target) ? "host-vulkan" : "host", aot.plan);
  BackendConfig jit_cfg{"jit", schedule, {}, target};
  std::stringstream knobs(v.knobs);
  for (std::string kv; std::getline(knobs, kv, ',');) {
    if (!kv.empty()) add_param(kv, &jit_cfg.params);
  }
  jit_cfg.params["T"] = std::to_string(aot.plan.tiles.T);
  const Prepared jit = prepare(jit_cfg, in);
  // Rounds of one repetition each, in pairs: AOT first in a pair's first round, JIT first in its
  // second (--repeat rounded up to whole pairs); the first round of each starts with an untimed
  // call (the JIT's compile, either's set-up). The guard reads the median over pairs of each
  // pair's ratio (the geometric mean of its two rounds' own ratios): the two halves of a round run
  // back to back, so a slow moment of the machine slows both (the ratio of two medians mixes
  // moments), and each pair weighs both orders alike (a cost of running second cancels).
  kx::Measurement am, jm;
  std::vector<double> pair_ratio;
  const int pairs = (repeat + 1) / 2;
  for (int i = 0; i < 2 * pairs; ++i) {
    kx::MeasureOptions opt;
    opt.repeats = 1;
    opt.warmup_ms = warmup_ms;
    opt.warm_call = i == 0;
    for (int side = 0; side < 2; ++side) {
      const bool aot_now = (side == 0) == (i % 2 == 0);
      const Prepared& now = aot_now ? aot : jit;
      (aot_now ? am : jm).append(kx::measure(*now.backend, now.plan, in, opt));
    }
    const double r = am.ms.back() / jm.ms.back();
    if (i % 2 == 0) pair_ratio.push_back(r);
    else pair_ratio.back() = std::sqrt(pair_ratio.back() * r);
  }
  print_summary(aot, am);
  print_summary(jit, jm);
  const auto err = kx::compare_outputs(am.out, jm.out);
  std::sort(pair_ratio.begin(), pair_ratio.end());
  const size_t n = pair_ratio.size();
  const double paired = n % 2 == 1 ? pair_ratio[n / 2] : std::sqrt(pair_ratio[n / 2 - 1] * pair_ratio[n / 2]);
  const double ratio = std::max(paired, 1.0 / paired);
  const bool ok = ratio <= max_ratio && err.ok();
  std::printf("compare: variant=%s aot_ms=%.3f jit_ms=%.3f aot/jit=%.3f (median of %zu pairs of rounds; of the medians "
              "%.3f) max_ratio=%.2f max_out_err=%.2e %s\n",
              v.name.c_str(), am.median(), jm.median(), paired, n, am.median() / jm.median(), max_ratio, err.max_out_err,
              ok ? "ok" : (err.ok() ? "SLOWER" : "MISMATCH"));
  return ok ? 0 : 1;
}

}  // namespace kvouter::cli
