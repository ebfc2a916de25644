// Small helpers shared by the CLI subcommands: error comparison and timing.
#pragma once

#include <chrono>
#include <cmath>
#include <limits>

#include "kvouter/backend.h"

namespace kvouter::experiments {

// SPEC §2's check: max |out - ref| relative to 2e-4 + 2e-4 * max|ref|, LSE absolute, -inf where
// the reference is -inf. Returns the largest ratio of error to tolerance (<= 1 passes), or +inf
// on a shape mismatch, NaN, or an -inf disagreement.
struct ErrorReport {
  double max_out_err = 0, max_lse_err = 0, tol_ratio = 0;
  bool ok() const { return tol_ratio <= 1.0; }
};

inline ErrorReport compare_outputs(const Outputs& got, const Outputs& ref) {
  ErrorReport r;
  if (got.out.shape != ref.out.shape || got.lse.shape != ref.lse.shape) {
    r.tol_ratio = std::numeric_limits<double>::infinity();
    return r;
  }
  double ref_max = 0;
  for (float x : ref.out.data) ref_max = std::max(ref_max, static_cast<double>(std::fabs(x)));
  for (size_t i = 0; i < got.out.data.size(); ++i) {
    const double e = std::fabs(static_cast<double>(got.out.data[i]) - ref.out.data[i]);
    if (std::isnan(got.out.data[i])) r.max_out_err = std::numeric_limits<double>::infinity();
    r.max_out_err = std::max(r.max_out_err, e);
  }
  for (size_t i = 0; i < got.lse.data.size(); ++i) {
    const float g = got.lse.data[i], w = ref.lse.data[i];
    if (std::isinf(w) || std::isinf(g) || std::isnan(g)) {
      if (!(std::isinf(w) && w < 0 && std::isinf(g) && g < 0)) r.max_lse_err = std::numeric_limits<double>::infinity();
      continue;
    }
    r.max_lse_err = std::max(r.max_lse_err, std::fabs(static_cast<double>(g) - w));
  }
  r.tol_ratio = std::max(r.max_out_err / (2e-4 + 2e-4 * ref_max), r.max_lse_err / 2e-4);
  return r;
}

}  // namespace kvouter::experiments
