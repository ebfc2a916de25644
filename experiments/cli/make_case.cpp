// kvouter make-case: a SPEC section 5 shape as a case folder.
#include <algorithm>
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
#include "kvouter/case_io.h"

namespace kvouter::cli {

int cmd_make_case(const std::vector<std::string>& args) {
  if (args.size() != 2) throw UsageError("make-case: expected SHAPE DIR");
  save_case(args[1], kx::make_case(kx::named_shape(args[0])));
  std::printf("wrote %s to %s\n", args[0].c_str(), args[1].c_str());
  return 0;
}

}  // namespace kvouter::cli
