#include "registry.h"

#include "../reference/dense_eigen.h"
#include "../reference/direct.h"
#include "kvouter/backend.h"

namespace kvouter::experiments {

void register_all_backends() {
  auto& r = BackendRegistry::instance();
  auto host = [] { return std::vector<std::string>{"host"}; };
  r.add({"direct", "seed-style KV-outer C++ (8-lane SIMD, threads over work units): the baseline",
         [] { return std::vector<std::string>{"seed-simd8"}; }, host, reference::make_direct_backend});
  r.add({"dense", "Eigen dense masked attention (float): the oracle's algorithm as a baseline",
         [] { return std::vector<std::string>{"eigen-f32"}; }, host, reference::make_dense_backend});
}

const char* default_backend() { return "direct"; }

}  // namespace kvouter::experiments
