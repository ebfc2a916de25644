// The kvouter command line's shared pieces: usage errors, option parsing, help, the tuning
// database's path, and the configuration `run` and `compare` prepare. One file per subcommand
// beside this one (run, compare, demo, export, tune, sweep, sweep_merge, make_case, roofline);
// kvouter_main.cpp dispatches.
#pragma once

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
#include "measure.h"

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

// One configuration as `kvouter run` and `compare` time it (through the measurement core,
// experiments/measure.h): the backend, and its plan, made outside the clock.
struct Prepared {
  std::unique_ptr<Backend> backend;
  Plan plan;
};
Prepared prepare(const BackendConfig& cfg, const InputsView& in);
// `kvouter run`'s summary line: the median of the repetitions, compile time apart.
void print_summary(const Prepared& p, const kx::Measurement& m);

int cmd_run(const std::vector<std::string>& args);
int cmd_compare(const std::vector<std::string>& args);
int cmd_demo(const std::vector<std::string>& args);
int cmd_export(const std::vector<std::string>& args);
int cmd_tune(const std::vector<std::string>& args);
int cmd_sweep(const std::vector<std::string>& args);
int cmd_make_case(const std::vector<std::string>& args);
int cmd_roofline(const std::vector<std::string>& args);
int cmd_sweep_merge(const std::vector<std::string>& args);

}  // namespace kvouter::cli
