// The one definition of the statistics every timing in the project reports: `kvouter run`, the
// kernels' repetitions, the benchmarks, the sweeps and the tuner all quote these, timed by one clock
// (the roofline's hardware probes keep their own).
#pragma once

#include <chrono>
#include <vector>

namespace kvouter {

// The median: the middle value, or the mean of the two middle values of an even count; 0 for none.
double median(std::vector<double> v);
// The q-quantile (q in [0, 1]) by linear interpolation between order statistics, so that
// quantile(v, 0.5) == median(v); 0 for none.
double quantile(std::vector<double> v, double q);

// The one clock of those timings: milliseconds of std::chrono::steady_clock since the start (or the
// last lap).
class Stopwatch {
 public:
  Stopwatch() : t0_(std::chrono::steady_clock::now()) {}
  void restart() { t0_ = std::chrono::steady_clock::now(); }
  double ms() const { return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0_).count(); }
  // ms(), then restart at that instant.
  double lap_ms() {
    const auto now = std::chrono::steady_clock::now();
    const double v = std::chrono::duration<double, std::milli>(now - t0_).count();
    t0_ = now;
    return v;
  }

 private:
  std::chrono::steady_clock::time_point t0_;
};

}  // namespace kvouter
