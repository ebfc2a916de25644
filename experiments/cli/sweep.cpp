// kvouter sweep: a grid of shapes x runs, one JSONL record per point.
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
#include "sweep.h"

namespace kvouter::cli {

int cmd_sweep(const std::vector<std::string>& a) {
  kx::SweepOptions opt;
  opt.results_dir = std::string(KVOUTER_SOURCE_DIR) + "/experiments/results";
  for (size_t i = 0; i < a.size(); ++i) {
    auto value = [&] { return option_value(a, i); };
    if (a[i] == "--out") opt.out = value();
    else if (a[i] == "--point") opt.point = value();
    else if (a[i] == "--results") opt.results_dir = value();
    else if (a[i] == "--shard") {
      const std::string v = value();
      if (std::sscanf(v.c_str(), "%d/%d", &opt.shard, &opt.shards) != 2 || opt.shards < 1 || opt.shard < 1 ||
          opt.shard > opt.shards) {
        throw UsageError("--shard: expected K/N with 1 <= K <= N, got '" + v + "'");
      }
    } else if (!a[i].empty() && a[i][0] == '-') {
      throw UsageError("sweep: unknown option '" + a[i] + "'");
    } else if (opt.config.empty()) {
      opt.config = a[i];
    } else {
      throw UsageError("sweep: unexpected argument '" + a[i] + "'");
    }
  }
  if (opt.config.empty()) throw UsageError("sweep: expected CONFIG.yaml");
  return kx::run_sweep(opt);
}

}  // namespace kvouter::cli
