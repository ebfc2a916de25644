// Configure-time probe (generators/CMakeLists.txt): prints 1 when the AOT target named by the
// argument ("host", "host-<features>" or a full Halide target) takes the SPEC prefill variants'
// wide register tile, else 0. "host" is resolved by Halide's own host detection, as the
// generator resolves it.
#include <cstdio>

#include "target_rules.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: prefill_tile_probe <halide target>\n");
    return 2;
  }
  std::printf("%d\n", kvouter::pipeline::prefill_wide_tile(Halide::Target(argv[1])) ? 1 : 0);
  return 0;
}
