// The kvouter command line's shared pieces: usage errors, option parsing, help, the tuning
// database's path, and the one timed run that `run` and `compare` share. One file per subcommand
// beside this one (run, compare, demo, export, tune, sweep, make_case); kvouter_main.cpp dispatches.
#pragma once

#include "kvouter/stats.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <memory>
#include <ostream>
#include <stdexcept>
#include <string>
#include <vector>

#include "kvouter/backend.h"
#include "kvouter/plan.h"

namespace kvouter::experiments {}

namespace kvouter::cli {

namespace kx = kvouter::experiments;

inline constexpr int kExitBadInput = 2;

struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

std::string option_value(const std::vector<std::string>& a, size_t& i);
// The value after a --dtype at a[i] as a storage dtype (advances i); UsageError naming the command.
Dtype dtype_value(const std::string& command, const std::vector<std::string>& a, size_t& i);
void add_param(const std::string& kv, std::map<std::string, std::string>* params);
std::string join(const std::vector<std::string>& v);
void print_backends(std::ostream& os);
void main_help();
bool command_help(const std::string& cmd);
void run_help();
double warmup_ms_value(const std::string& v);
int repeat_value(const std::string& v);
std::string tuning_db_path();
std::string params_str(const std::map<std::string, std::string>& p);

// One configuration timed as `kvouter run` times it: the plan outside, compile time apart, the
// median of the repeats' forward + combine.
struct TimedRun {
  std::unique_ptr<Backend> backend;
  Plan plan;
  Outputs out;
  std::vector<double> times;
  double compile_ms = 0;

  double median() const { return kvouter::median(times); }
  void run_once(const InputsView& in) {
    out = backend->run(plan, in);
    const auto& t = backend->last_timing();
    compile_ms += t.compile_ms;
    times.push_back(t.forward_ms + t.combine_ms);
  }
  void print_summary() const {
    const double ms = median();
    std::printf("backend=%s schedule=%s params=%s target=%s time_ms=%.3f gflops=%.2f plan_ms=%.3f compile_ms=%.1f\n",
                backend->name().c_str(), backend->schedule().c_str(), params_str(backend->params()).c_str(),
                backend->target().c_str(), ms, ms > 0 ? plan.flops() / (ms * 1e6) : 0.0, plan.plan_ms, compile_ms);
  }
};

TimedRun prepare_run(const BackendConfig& cfg, const InputsView& in, double warmup_ms);

int cmd_run(const std::vector<std::string>& args);
int cmd_compare(const std::vector<std::string>& args);
int cmd_demo(const std::vector<std::string>& args);
int cmd_export(const std::vector<std::string>& args);
int cmd_tune(const std::vector<std::string>& args);
int cmd_sweep(const std::vector<std::string>& args);
int cmd_make_case(const std::vector<std::string>& args);

}  // namespace kvouter::cli
