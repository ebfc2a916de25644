// kvouter roofline: this machine's measured FP32 FMA peak and read bandwidth, one JSON line; with
// --paged, the read rate of random page-sized chunks against the size of the pool they lie in.
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "cli/cli.h"
#include "roofline.h"

namespace kvouter::cli {

int cmd_roofline(const std::vector<std::string>& a) {
  if (a.empty()) {
    std::cout << kx::roofline_json(kx::measure_roofline()) << std::endl;
    return 0;
  }
  if (a[0] != "--paged") throw UsageError("roofline: unexpected argument '" + a[0] + "'");
  auto integer = [](const std::string& s, long lo, long hi, const std::string& what) {
    size_t used = 0;
    long v = 0;
    try { v = std::stol(s, &used); } catch (...) { used = 0; }
    if (used != s.size() || v < lo || v > hi) {
      throw UsageError("roofline --paged: expected " + what + ", got '" + s + "'");
    }
    return v;
  };
  size_t chunk_kib = 8;
  int ahead = 0;
  size_t at = 1;
  if (at < a.size() && a[at] != "--ahead") {
    chunk_kib = static_cast<size_t>(integer(a[at++], 1, 64 << 10, "a chunk of 1 to 65536 KiB"));
  }
  if (at < a.size() && a[at] == "--ahead") {
    if (at + 1 >= a.size()) throw UsageError("roofline --paged --ahead: expected a count of chunks");
    ahead = static_cast<int>(integer(a[at + 1], 0, 64, "--ahead of 0 to 64 chunks"));
    at += 2;
  }
  if (at < a.size()) throw UsageError("roofline: unexpected argument '" + a[at] + "'");
  // Pools past this machine's caches, 2 MiB-aligned and advised for huge pages as the K/V pools
  // are (kvouter/pool_memory.h): where the rate falls as the pool grows, TLB reach (or a guest's
  // nested paging), not the bytes, bounds a paged decode's reads.
  std::printf("{\"chunk_kib\": %zu, \"ahead\": %d, \"paged_read_gbps\": {", chunk_kib, ahead);
  const size_t mib[] = {256, 1024, 4096};
  for (size_t i = 0; i < 3; ++i) {
    const double g = kx::paged_read_gbps(chunk_kib << 10, mib[i] << 20, 7, ahead);
    std::printf("%s\"%zu MiB\": %.2f", i ? ", " : "", mib[i], g);
    std::fflush(stdout);
  }
  std::printf("}}\n");
  return 0;
}

}  // namespace kvouter::cli
