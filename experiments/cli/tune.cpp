// kvouter tune: the autotuner over the JIT schedules.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "cli/cli.h"
#include "tuner.h"

namespace kvouter::cli {

int cmd_tune(const std::vector<std::string>& a) {
  kx::TuneOptions opt;
  bool db_given = false;
  for (size_t i = 0; i < a.size(); ++i) {
    auto value = [&] { return option_value(a, i); };
    auto number = [&](const std::string& v) {
      try {
        return std::stoi(v);
      } catch (...) {
        throw UsageError(a[i - 1] + ": expected an integer, got '" + v + "'");
      }
    };
    if (a[i] == "--shape") opt.shape = value();
    else if (a[i] == "--target") opt.target = value();
    else if (a[i] == "--db") opt.db = value(), db_given = true;
    else if (a[i] == "--log") opt.log = value();
    else if (a[i] == "--repeats") opt.repeats = number(value());
    else if (a[i] == "--max-candidates") opt.max_candidates = number(value());
    else if (a[i] == "--warmup-ms") opt.warmup_ms = warmup_ms_value(value());
    else throw UsageError("tune: unknown argument '" + a[i] + "'");
  }
  if (opt.repeats < 1) throw UsageError("--repeats: expected a positive integer");
  if (!db_given) opt.db = tuning_db_path();
  if (opt.log.empty()) {
    opt.log = std::string(KVOUTER_SOURCE_DIR) + "/experiments/results/tune_" + opt.shape + "_" + opt.target + ".jsonl";
  }
  return kx::run_tune(opt);
}

}  // namespace kvouter::cli
