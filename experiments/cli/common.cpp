// kvouter CLI: option parsing, help text, and the timed run shared by run and compare.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "cli/cli.h"
#include "kvouter/jit.h"
#include "registry.h"

namespace kvouter::cli {

// The value after option a[i] (advancing i), or a usage error naming the option.
std::string option_value(const std::vector<std::string>& a, size_t& i) {
  if (i + 1 >= a.size()) throw UsageError(a[i] + ": expected a value");
  return a[++i];
}

Dtype dtype_value(const std::string& command, const std::vector<std::string>& a, size_t& i) {
  if (i + 1 >= a.size()) throw UsageError(command + ": --dtype needs a value (float32, float16, bfloat16)");
  Dtype t;
  if (!parse_dtype(a[++i], &t)) {
    throw UsageError(command + ": --dtype: expected float32, float16 or bfloat16, got '" + a[i] + "'");
  }
  return t;
}

// --param KEY=VALUE into a knob map.
void add_param(const std::string& kv, std::map<std::string, std::string>* params) {
  const auto eq = kv.find('=');
  if (eq == std::string::npos || eq == 0) throw UsageError("--param: expected KEY=VALUE, got '" + kv + "'");
  (*params)[kv.substr(0, eq)] = kv.substr(eq + 1);
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

void print_backends(std::ostream& os) {
  os << "backends (--backend), their schedules (--schedule) and targets (--target):\n";
  for (const auto& b : BackendRegistry::instance().all()) {
    os << "  " << b.name << (b.name == kx::default_backend() ? " (default)" : "") << ": " << b.description
       << "\n      schedules: " << join(b.schedules()) << "\n      targets:   " << join(b.targets())
       << "\n";
  }
}

void main_help() {
  std::cout << "usage: kvouter <command> [args]\n\n"
               "commands:\n"
               "  run CASE_DIR [--out DIR] [--backend NAME] [--schedule NAME] [--param K=V]...\n"
               "               [--target HALIDE_TARGET] [--repeat N] [--warmup-ms MS] [--json FILE]\n"
               "      run one case folder (SPEC section 4), write out.npy and lse.npy\n"
               "  demo [--shape NAME]   run a named shape through every backend, print a table\n"
               "  compare (CASE_DIR | --shape NAME) [--schedule S] [--target T] [--repeat N] [--warmup-ms MS]\n"
               "          [--max-ratio R]   time the AOT kernel a case selects against the JIT compile of\n"
               "      the same configuration, as run times them, in pairs of rounds (N rounded up to\n"
               "      whole pairs); exit 1 past R (default 1.15) in the median of the pairs' ratios\n"
               "  roofline [--paged [KIB] [--ahead N]]  measure this machine's FP32 FMA peak and read bandwidth (JSON);\n"
               "      --paged: random KIB-sized chunks (default 8) read from pools of 256 MiB to 4 GiB\n"
               "  make-case SHAPE DIR [--dtype D]  write a SPEC section 5 shape as a case folder\n"
               "  export --out DIR [--schedule S] [--param K=V]... [--target T] [--from-case DIR] [--name N]\n"
               "         [--tuned]   AOT-generate one configuration (generic, or specialised to a case's\n"
               "                     shape; --tuned takes the tuning database's winner for that case)\n"
               "  sweep CONFIG.yaml [--shard K/N] [--out FILE] [--point ID] [--results DIR]\n"
               "      run a grid of shapes x runs, checked and timed, one JSONL record per point\n"
               "  sweep-merge OUT.jsonl IN.jsonl...   join sweep shards\n"
               "  tune --shape NAME [--target T] [--repeats N] [--max-candidates N] [--db FILE] [--log FILE]\n"
               "       [--warmup-ms MS]\n"
               "      autotune the JIT schedules against the Eigen oracle (the CPU ones for host, the\n"
               "      Vulkan ones for host-vulkan, whose candidates warm up 2000 ms by default); resumable;\n"
               "      winners go to the database that `run` reads for its default choice\n\n";
  print_backends(std::cout);
}

// `kvouter COMMAND --help` for the commands other than run (whose help lists the backends): the
// command's lines of the main help.
bool command_help(const std::string& cmd) {
  static const std::map<std::string, std::string> help = {
      {"demo", "usage: kvouter demo [--shape NAME]\n  run a named shape (SPEC section 5; default tiny) through "
               "every backend, checked against the oracle, and print a table\n"},
      {"compare", "usage: kvouter compare (CASE_DIR | --shape NAME) [--schedule S] [--target T] [--repeat N]\n"
                  "                       [--warmup-ms MS] [--max-ratio R]\n  time the AOT kernel the case "
                  "selects against the JIT compile of the same configuration (its knobs and T), in one "
                  "process and alternating rounds, timed as `kvouter run` times them; exit 1 when, in the "
                  "median over pairs of rounds (AOT first, then JIT first; N rounded up to whole pairs) of "
                  "their own ratios, the slower takes more than R times the faster (default "
                  "1.15), or when the outputs disagree. The default schedule is the one `kvouter run` takes "
                  "without a tuned entry (a GPU target's default; on the CPU cpu_decode for a decode step, cpu_tiled otherwise)\n"},
      {"roofline", "usage: kvouter roofline [--paged [KIB] [--ahead N]]\n  measure this machine's FP32 FMA peak and read "
                   "bandwidth; prints one JSON line. --paged: instead, the read rate of random KIB-sized chunks "
                   "(default 8, a SPEC decode K page of one head) from pools of 256 MiB, 1 GiB and 4 GiB in huge-page "
                   "memory, all threads: where it falls as the pool grows, TLB reach bounds a paged decode's reads. "
                   "--ahead N: each chunk's lines requested into the L2 (prefetcht1) while the reader reads the "
                   "chunk N before it (cpu_decode's knob ahead)\n"},
      {"make-case", "usage: kvouter make-case SHAPE DIR [--dtype float32|float16|bfloat16]\n  write a SPEC section 5 "
                    "shape (tiny, prefill, decode, gpu-prefill, gpu-decode) as a case folder, q, K and V stored in "
                    "the dtype (default float32)\n"},
      {"export", "usage: kvouter export --out DIR [--schedule S] [--param K=V]... [--target T] [--from-case DIR]\n"
                 "                      [--name N] [--tuned] [--dtype float32|float16|bfloat16]\n  AOT-generate one configuration (generic, or "
                 "specialised to a case's shape, in the case's storage dtype or --dtype's; --tuned takes the tuning "
                 "database's winner for that case; without --schedule, the schedule kvouter run takes untuned: for a case "
                 "its shape class's, cpu_decode for a decode step)\n"},
      {"sweep", "usage: kvouter sweep CONFIG.yaml [--shard K/N] [--out FILE] [--point ID] [--results DIR]\n"
                "  run a grid of shapes x runs, checked and timed, one JSONL record per point\n"},
      {"sweep-merge", "usage: kvouter sweep-merge OUT.jsonl IN.jsonl...\n  join sweep shards\n"},
      {"tune", "usage: kvouter tune --shape NAME [--target T] [--repeats N] [--max-candidates N] [--db FILE]\n"
               "                    [--log FILE] [--warmup-ms MS]\n  autotune the JIT schedules against the "
               "Eigen oracle (the CPU ones for host, the Vulkan ones for host-vulkan); resumable; winners go to "
               "the database that `run` reads for its default choice\n"},
  };
  const auto it = help.find(cmd);
  if (it == help.end()) return false;
  std::cout << it->second;
  return true;
}

void run_help() {
  std::cout << "usage: kvouter run CASE_DIR [--out DIR] [--backend NAME] [--schedule NAME]\n"
               "                  [--param KEY=VALUE]... [--target HALIDE_TARGET] [--repeat N] [--warmup-ms MS]\n"
               "                  [--json FILE]\n\n"
               "Reads q, k_pages, v_pages, selected, block_tables, cu_seqlens_q[, used_kv_lens] (.npy)\n"
               "and case.json from CASE_DIR; writes out.npy and lse.npy into --out (default CASE_DIR).\n"
               "Prints one summary line. Bad input: one line on stderr, nothing written, exit 2.\n"
               "--repeat N runs N times and reports the median (compile time is never counted).\n"
               "--json FILE writes the measurement's record (experiments/measure.h: every repetition,\n"
               "the forward/combine split, plan and compile times, the revision and machine).\n"
               "--warmup-ms MS (Halide backends): before each timed run, the kernels run untimed for MS\n"
               "on the uploaded inputs. GPU figures need it: the H200's driver keeps a Vulkan-only load\n"
               "at its idle clock until the GPU has been busy a while (docs/vulkan.md).\n";
  std::cout << "--param KEY=VALUE sets a schedule knob (jit; aot takes T and variant):";
  for (const auto& k : halide::knob_names()) std::cout << " " << k;
  std::cout << " (README \"CLI\").\n\n";
  print_backends(std::cout);
}

double warmup_ms_value(const std::string& v) {
  size_t used = 0;
  double ms = -1;
  try { ms = std::stod(v, &used); } catch (...) { used = 0; }
  if (used != v.size() || !(ms >= 0 && ms <= 600000)) {
    throw UsageError("--warmup-ms: expected milliseconds in [0, 600000], got '" + v + "'");
  }
  return ms;
}

int repeat_value(const std::string& v) {
  int n = 0;
  try { n = std::stoi(v); } catch (...) { n = 0; }
  if (n < 1) throw UsageError("--repeat: expected a positive integer, got '" + v + "'");
  return n;
}

// The tuning database the default choice reads ($KVOUTER_TUNING_DB, else the repository's).
std::string tuning_db_path() {
  if (const char* p = std::getenv("KVOUTER_TUNING_DB")) return p;
  return std::string(KVOUTER_SOURCE_DIR) + "/experiments/results/tuning_db.json";
}

std::string params_str(const std::map<std::string, std::string>& p) {
  std::string s;
  for (const auto& [k, v] : p) s += (s.empty() ? "" : ",") + k + "=" + v;
  return s.empty() ? "-" : s;
}

Prepared prepare(const BackendConfig& cfg, const InputsView& in) {
  Prepared p;
  p.backend = BackendRegistry::instance().make(cfg);
  p.plan = make_plan(in, p.backend->plan_options());
  return p;
}

void print_summary(const Prepared& p, const kx::Measurement& m) {
  const Backend& b = *p.backend;
  const double ms = m.median();
  std::printf("backend=%s schedule=%s params=%s target=%s time_ms=%.3f gflops=%.2f plan_ms=%.3f compile_ms=%.1f\n",
              b.name().c_str(), b.schedule().c_str(), params_str(b.params()).c_str(), b.target().c_str(), ms,
              ms > 0 ? p.plan.flops() / (ms * 1e6) : 0.0, p.plan.plan_ms, m.compile_ms);
}

}  // namespace kvouter::cli
