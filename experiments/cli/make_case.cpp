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
  std::vector<std::string> pos;
  Dtype dtype = Dtype::kFloat32;
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--dtype") {
      dtype = dtype_value("make-case", args, i);
    } else {
      pos.push_back(args[i]);
    }
  }
  if (pos.size() != 2) throw UsageError("make-case: expected SHAPE DIR [--dtype DTYPE]");
  kx::CaseSpec spec = kx::named_shape(pos[0]);
  spec.dtype = dtype;  // SPEC section 5: the same shape, q, K and V rounded to the dtype
  save_case(pos[1], kx::make_case(spec));
  std::printf("wrote %s (%s) to %s\n", pos[0].c_str(), dtype_name(dtype).c_str(), pos[1].c_str());
  return 0;
}

}  // namespace kvouter::cli
