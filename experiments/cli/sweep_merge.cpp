// kvouter sweep-merge OUT.jsonl IN.jsonl...: join sweep shards (a later file's record of a point wins).
#include <string>
#include <vector>

#include "cli/cli.h"
#include "sweep.h"

namespace kvouter::cli {

int cmd_sweep_merge(const std::vector<std::string>& a) {
  if (a.size() < 2) throw UsageError("sweep-merge: expected OUT.jsonl IN.jsonl...");
  return kx::merge_sweeps(a[0], std::vector<std::string>(a.begin() + 1, a.end()));
}

}  // namespace kvouter::cli
