// The one definition of the statistics every timing in the project reports: `kvouter run`, the
// kernels' repetitions, the benchmarks, the sweeps and the tuner all quote these.
#pragma once

#include <vector>

namespace kvouter {

// The median: the middle value, or the mean of the two middle values of an even count; 0 for none.
double median(std::vector<double> v);
// The q-quantile (q in [0, 1]) by linear interpolation between order statistics, so that
// quantile(v, 0.5) == median(v); 0 for none.
double quantile(std::vector<double> v, double q);

}  // namespace kvouter
