// kvouter roofline: this machine's measured FP32 FMA peak and read bandwidth, one JSON line.
#include <iostream>
#include <string>
#include <vector>

#include "cli/cli.h"
#include "roofline.h"

namespace kvouter::cli {

int cmd_roofline(const std::vector<std::string>& a) {
  if (!a.empty()) throw UsageError("roofline: unexpected argument '" + a[0] + "'");
  std::cout << kx::roofline_json(kx::measure_roofline()) << std::endl;
  return 0;
}

}  // namespace kvouter::cli
