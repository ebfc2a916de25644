#include "measure.h"

#include <algorithm>

#include "kvouter/stats.h"

namespace kvouter::experiments {

double Measurement::quantile(double q) const { return kvouter::quantile(ms, q); }

Measurement measure(Backend& backend, const Plan& plan, const InputsView& in, const Outputs& ref, int repeats,
                    double stop_after_first_ms, double warmup_ms) {
  Measurement m;
  const Outputs got = backend.run(plan, in);
  m.compile_ms = backend.last_timing().compile_ms;
  m.err = compare_outputs(got, ref);
  if (!m.err.ok()) return m;
  for (int r = 0; r < repeats; ++r) {
    backend.set_kernel_timing({1, r == 0 ? warmup_ms : 0.0});
    backend.run(plan, in);
    const auto& t = backend.last_timing();
    m.ms.push_back(t.forward_ms + t.combine_ms);
    if (r == 0 && stop_after_first_ms > 0 && m.ms[0] > stop_after_first_ms) break;
  }
  backend.set_kernel_timing({});
  std::sort(m.ms.begin(), m.ms.end());
  return m;
}

}  // namespace kvouter::experiments
