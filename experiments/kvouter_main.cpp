// kvouter: the command line (SPEC §4). Subcommands: run, compare, demo, roofline, make-case, export,
// sweep, sweep-merge, tune.
#include <algorithm>
#include <cstdio>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <filesystem>
#include <thread>

#include "../reference/dense_eigen.h"
#include "kvouter/aot.h"
#include "kvouter/halide_kernels.h"
#include "kvouter/jit.h"
#include "schedules.h"
#include "case_gen.h"
#include "cli_util.h"
#include "kvouter/case_io.h"
#include "kvouter/errors.h"
#include "registry.h"
#include "roofline.h"
#include "sweep.h"
#include "tuner.h"

namespace kx = kvouter::experiments;
using namespace kvouter;

namespace {

constexpr int kExitBadInput = 2;

struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// The value after option a[i] (advancing i), or a usage error naming the option.
std::string option_value(const std::vector<std::string>& a, size_t& i) {
  if (i + 1 >= a.size()) throw UsageError(a[i] + ": expected a value");
  return a[++i];
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
               "               [--target HALIDE_TARGET] [--repeat N] [--warmup-ms MS]\n"
               "      run one case folder (SPEC section 4), write out.npy and lse.npy\n"
               "  demo [--shape NAME]   run a named shape through every backend, print a table\n"
               "  compare (CASE_DIR | --shape NAME) [--schedule S] [--target T] [--repeat N] [--warmup-ms MS]\n"
               "          [--max-ratio R]   time the AOT kernel a case selects against the JIT compile of\n"
               "      the same configuration, as run times them; exit 1 past R (default 1.15)\n"
               "  roofline              measure this machine's FP32 FMA peak and read bandwidth (JSON)\n"
               "  make-case SHAPE DIR   write a SPEC section 5 shape as a case folder\n"
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
                  "process and alternating rounds, timed as `kvouter run` times them; exit 1 when the slower "
                  "takes more than R times the faster (default 1.15) or the outputs disagree\n"},
      {"roofline", "usage: kvouter roofline\n  measure this machine's FP32 FMA peak and read bandwidth; prints "
                   "one JSON line\n"},
      {"make-case", "usage: kvouter make-case SHAPE DIR\n  write a SPEC section 5 shape (tiny, prefill, decode, "
                    "gpu-prefill, gpu-decode) as a case folder\n"},
      {"export", "usage: kvouter export --out DIR [--schedule S] [--param K=V]... [--target T] [--from-case DIR]\n"
                 "                      [--name N] [--tuned]\n  AOT-generate one configuration (generic, or "
                 "specialised to a case's shape; --tuned takes the tuning database's winner for that case)\n"},
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
               "                  [--param KEY=VALUE]... [--target HALIDE_TARGET] [--repeat N] [--warmup-ms MS]\n\n"
               "Reads q, k_pages, v_pages, selected, block_tables, cu_seqlens_q[, used_kv_lens] (.npy)\n"
               "and case.json from CASE_DIR; writes out.npy and lse.npy into --out (default CASE_DIR).\n"
               "Prints one summary line. Bad input: one line on stderr, nothing written, exit 2.\n"
               "--repeat N runs N times and reports the median (compile time is never counted).\n"
               "--warmup-ms MS (Halide backends): before each timed run, the kernels run untimed for MS\n"
               "on the uploaded inputs. GPU figures need it: the H200's driver keeps a Vulkan-only load\n"
               "at its idle clock until the GPU has been busy a while (docs/vulkan.md).\n";
  std::cout << "--param KEY=VALUE sets a schedule knob (jit; aot takes T and variant):";
  for (const auto& k : halide::knob_names()) std::cout << " " << k;
  std::cout << " (README \"CLI\").\n\n";
  print_backends(std::cout);
}

struct RunArgs {
  std::string case_dir, out_dir;
  BackendConfig cfg;
  int repeat = 1;
  double warmup_ms = 0;
};

double warmup_ms_value(const std::string& v) {
  size_t used = 0;
  double ms = -1;
  try { ms = std::stod(v, &used); } catch (...) { used = 0; }
  if (used != v.size() || !(ms >= 0 && ms <= 600000)) {
    throw UsageError("--warmup-ms: expected milliseconds in [0, 600000], got '" + v + "'");
  }
  return ms;
}

RunArgs parse_run(const std::vector<std::string>& a) {
  RunArgs r;
  for (size_t i = 0; i < a.size(); ++i) {
    auto value = [&] { return option_value(a, i); };
    if (a[i] == "--out") r.out_dir = value();
    else if (a[i] == "--backend") r.cfg.backend = value();
    else if (a[i] == "--schedule") r.cfg.schedule = value();
    else if (a[i] == "--target") r.cfg.target = value();
    else if (a[i] == "--param") add_param(value(), &r.cfg.params);
    else if (a[i] == "--repeat") {
      const std::string v = value();
      try { r.repeat = std::stoi(v); } catch (...) { r.repeat = 0; }
      if (r.repeat < 1) throw UsageError("--repeat: expected a positive integer, got '" + v + "'");
    } else if (a[i] == "--warmup-ms") {
      r.warmup_ms = warmup_ms_value(value());
    } else if (!a[i].empty() && a[i][0] == '-') {
      throw UsageError("unknown option '" + a[i] + "' (see kvouter run --help)");
    } else if (r.case_dir.empty()) {
      r.case_dir = a[i];
    } else {
      throw UsageError("unexpected argument '" + a[i] + "'");
    }
  }
  if (r.case_dir.empty()) throw UsageError("run: expected CASE_DIR (see kvouter run --help)");
  if (r.out_dir.empty()) r.out_dir = r.case_dir;
  return r;
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

// One configuration timed as `kvouter run` times it: the plan outside, compile time apart, the
// median of the repeats' forward + combine.
struct TimedRun {
  std::unique_ptr<Backend> backend;
  Plan plan;
  Outputs out;
  std::vector<double> times;
  double compile_ms = 0;

  double median() const {
    std::vector<double> t = times;
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
  }
  void run_once(const Inputs& in) {
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

TimedRun prepare_run(const BackendConfig& cfg, const Inputs& in, double warmup_ms) {
  TimedRun r;
  r.backend = BackendRegistry::instance().make(cfg);
  r.plan = make_plan(in, r.backend->plan_options());
  r.backend->set_kernel_timing({1, warmup_ms});
  return r;
}

int cmd_run(const std::vector<std::string>& args) {
  RunArgs ra = parse_run(args);
  Inputs in = load_case(ra.case_dir);
  if (ra.cfg.backend.empty()) {
    // The default: the tuned winner for this shape class on this machine, else the default backend,
    // on a GPU when one is present (kx::default_target).
    ra.cfg.backend = kx::default_backend();
    if (ra.cfg.target.empty() && ra.cfg.schedule.empty()) ra.cfg.target = kx::default_target();
    if (ra.cfg.schedule.empty() && ra.cfg.params.empty()) {
      validate(in);  // bad input is reported as such, before any look-up
      if (auto tuned = kx::lookup_tuned(in, ra.cfg.target.empty() ? "host" : ra.cfg.target, tuning_db_path())) {
        ra.cfg.backend = "jit";
        ra.cfg.schedule = tuned->schedule;
        ra.cfg.params = tuned->knobs;
      }
    }
  }
  TimedRun r = prepare_run(ra.cfg, in, ra.warmup_ms);
  for (int i = 0; i < ra.repeat; ++i) r.run_once(in);
  save_outputs(ra.out_dir, r.out);
  r.print_summary();
  return 0;
}

// The AOT kernel a plan selects and the JIT compile of the same configuration (schedule, knobs and
// T of that variant), timed in this process the way `kvouter run` times them, in alternating
// rounds. Exit 1 when the slower is more than --max-ratio times the faster, or when the two
// disagree beyond SPEC's tolerance.
int cmd_compare(const std::vector<std::string>& a) {
  std::string case_dir, shape, schedule = kx::default_cpu_schedule(), target = "host";
  int repeat = 5;
  double warmup_ms = 0, max_ratio = 1.15;
  for (size_t i = 0; i < a.size(); ++i) {
    auto value = [&] { return option_value(a, i); };
    if (a[i] == "--shape") shape = value();
    else if (a[i] == "--schedule") schedule = value();
    else if (a[i] == "--target") target = value();
    else if (a[i] == "--warmup-ms") warmup_ms = warmup_ms_value(value());
    else if (a[i] == "--repeat") {
      const std::string v = value();
      try { repeat = std::stoi(v); } catch (...) { repeat = 0; }
      if (repeat < 1) throw UsageError("--repeat: expected a positive integer, got '" + v + "'");
    } else if (a[i] == "--max-ratio") {
      const std::string v = value();
      size_t used = 0;
      try { max_ratio = std::stod(v, &used); } catch (...) { used = 0; }
      if (used != v.size() || !(max_ratio >= 1)) throw UsageError("--max-ratio: expected a number >= 1, got '" + v + "'");
    } else if (!a[i].empty() && a[i][0] == '-') {
      throw UsageError("compare: unknown option '" + a[i] + "'");
    } else if (case_dir.empty()) {
      case_dir = a[i];
    } else {
      throw UsageError("compare: unexpected argument '" + a[i] + "'");
    }
  }
  if (case_dir.empty() == shape.empty()) throw UsageError("compare: expected CASE_DIR or --shape NAME (one of them)");
  const Inputs in = shape.empty() ? load_case(case_dir) : kx::make_case(kx::named_shape(shape));

  TimedRun aot = prepare_run({"aot", schedule, {}, target}, in, warmup_ms);
  const halide::AotVariant& v =
      halide::aot_select(schedule, is_vulkan_target(target) ? "host-vulkan" : "host", aot.plan);
  BackendConfig jit_cfg{"jit", schedule, {}, target};
  std::stringstream knobs(v.knobs);
  for (std::string kv; std::getline(knobs, kv, ',');) {
    if (!kv.empty()) add_param(kv, &jit_cfg.params);
  }
  jit_cfg.params["T"] = std::to_string(aot.plan.tiles.T);
  TimedRun jit = prepare_run(jit_cfg, in, warmup_ms);
  jit.run_once(in);  // the compile, outside the rounds
  jit.times.clear();
  jit.compile_ms = 0;
  for (int i = 0; i < repeat; ++i) {
    aot.run_once(in);
    jit.run_once(in);
  }
  aot.print_summary();
  jit.print_summary();
  const auto err = kx::compare_outputs(aot.out, jit.out);
  const double ratio = std::max(aot.median(), jit.median()) / std::min(aot.median(), jit.median());
  const bool ok = ratio <= max_ratio && err.ok();
  std::printf("compare: variant=%s aot_ms=%.3f jit_ms=%.3f aot/jit=%.3f max_ratio=%.2f max_out_err=%.2e %s\n",
              v.name.c_str(), aot.median(), jit.median(), aot.median() / jit.median(), max_ratio, err.max_out_err,
              ok ? "ok" : (err.ok() ? "SLOWER" : "MISMATCH"));
  return ok ? 0 : 1;
}

int cmd_demo(const std::vector<std::string>& args) {
  std::string shape = "tiny";
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--shape" && i + 1 < args.size()) shape = args[++i];
    else throw UsageError("demo: unknown argument '" + args[i] + "'");
  }
  Inputs in = kx::make_case(kx::named_shape(shape));
  const Problem prob = validate(in);
  const Outputs ref = reference::dense_attention<double>(in, prob);
  std::printf("shape %s: Tq=%lld Hq=%lld Hkv=%lld D=%lld block=%lld page=%lld topk=%lld (oracle: Eigen dense, float64)\n",
              shape.c_str(), (long long)prob.Tq, (long long)prob.Hq, (long long)prob.Hkv, (long long)prob.D,
              (long long)prob.block_size, (long long)prob.page_size, (long long)prob.topk);
  std::printf("%-8s %-18s %-10s %12s %12s %10s %12s %s\n", "backend", "schedule", "target", "median_ms",
              "GFLOP/s", "plan_ms", "max|err|", "check");
  bool all_ok = true;
  for (const auto& info : BackendRegistry::instance().all()) {
    for (const auto& sched : info.schedules()) {
      BackendConfig cfg{info.name, sched, {}, ""};
      // Vulkan schedules run on the Vulkan device (lavapipe in CI); the autoscheduled GPU twins
      // have known wrong results on some shapes (docs/vulkan.md) and are left to the gpu tests.
      const pipeline::ScheduleInfo* si = pipeline::find_schedule(sched);
      if (si && si->device == "vulkan") {
        if (!si->autoscheduler.empty()) {
          std::printf("%-8s %-18s skipped: an autoscheduled GPU twin (see the gpu tests)\n", info.name.c_str(), sched.c_str());
          continue;
        }
        cfg.target = "host-vulkan";
      }
      std::unique_ptr<Backend> backend;
      try {
        backend = info.make(cfg);
      } catch (const BackendError& e) {
        std::printf("%-8s %-18s skipped: %s\n", info.name.c_str(), sched.c_str(), e.what());
        continue;
      }
      Plan plan = make_plan(in, backend->plan_options());
      std::vector<double> times;
      Outputs out;
      try {
        for (int i = 0; i < 5; ++i) {
          out = backend->run(plan, in);
          times.push_back(backend->last_timing().forward_ms + backend->last_timing().combine_ms);
        }
      } catch (const BackendError& e) {
        std::printf("%-8s %-18s skipped: %s\n", info.name.c_str(), sched.c_str(), e.what());
        continue;
      }
      std::sort(times.begin(), times.end());
      const double ms = times[2];
      const auto err = kx::compare_outputs(out, ref);
      all_ok &= err.ok();
      const std::string target = backend->target() == halide::resolve_target("host") ? "host"
                                 : is_vulkan_target(backend->target()) ? "host-vulkan"
                                                                       : backend->target();
      std::printf("%-8s %-18s %-10s %12.3f %12.2f %10.3f %12.2e %s\n", backend->name().c_str(),
                  backend->schedule().c_str(), target.c_str(), ms, plan.flops() / (ms * 1e6),
                  plan.plan_ms, err.max_out_err, err.ok() ? "ok" : "FAIL");
    }
  }
  return all_ok ? 0 : 1;
}

// AOT-generates one configuration (e.g. a tuned one) for a target: a static library, its header,
// the .stmt and the schedule, through the same registered Generators the build uses.
int cmd_export(const std::vector<std::string>& a) {
  std::string schedule = kx::default_cpu_schedule(), target = "host", out, name, from_case;
  bool tuned = false;
  std::map<std::string, std::string> params;
  for (size_t i = 0; i < a.size(); ++i) {
    auto value = [&] { return option_value(a, i); };
    if (a[i] == "--schedule") schedule = value();
    else if (a[i] == "--target") target = value();
    else if (a[i] == "--out") out = value();
    else if (a[i] == "--name") name = value();
    else if (a[i] == "--from-case") from_case = value();
    else if (a[i] == "--tuned") tuned = true;
    else if (a[i] == "--param") add_param(value(), &params);
    else {
      throw UsageError("export: unknown argument '" + a[i] + "'");
    }
  }
  if (out.empty()) throw UsageError("export: expected --out DIR");
  if (tuned) {
    if (from_case.empty()) throw UsageError("export --tuned: expected --from-case DIR (whose shape class to look up)");
    auto choice = kx::lookup_tuned(load_case(from_case), target, tuning_db_path());
    if (!choice) throw BackendError("export --tuned: the tuning database " + tuning_db_path() + " has no entry for this case's shape class on this machine");
    schedule = choice->schedule;
    params = choice->knobs;
  }
  const pipeline::ScheduleInfo* info = pipeline::find_schedule(schedule);
  if (!info) throw BackendError("--schedule: unknown schedule '" + schedule + "'");
  auto knobs = halide::checked_knobs(params);
  halide::Specialization spec;  // generic unless a case fixes the shape
  if (!from_case.empty()) {
    Inputs in = load_case(from_case);
    const Plan plan = make_plan(in, {halide::tile_edges_of(knobs)});
    spec = halide::Specialization::of(plan);
    // Autoscheduled twins are generated for the case's real extents (as the JIT does).
    if (!info->autoscheduler.empty()) spec = spec.with_extents(plan);
  }
  if (name.empty()) {
    name = "kvouter_" + schedule + (spec.D ? "_d" + std::to_string(spec.D) + "_p" + std::to_string(spec.page_size) +
                                                 "_b" + std::to_string(spec.block_size) + "_q" +
                                                 std::to_string(spec.qhead) + "_t" + std::to_string(spec.T)
                                           : std::string("_generic"));
  }
  std::filesystem::create_directories(out);
  std::string autos;
  if (!info->autoscheduler.empty()) {
    std::string lower = info->autoscheduler;
    for (auto& ch : lower) ch = static_cast<char>(std::tolower(ch));
    autos = std::string(" -p ") + KVOUTER_HALIDE_LIBDIR + "/libautoschedule_" + lower + ".so autoscheduler=" +
            info->autoscheduler + " autoscheduler.parallelism=" + std::to_string(std::thread::hardware_concurrency());
    // Adams2019's default beam search exhausts memory on this pipeline (see jit.cpp).
    if (info->autoscheduler == "Adams2019") autos += " autoscheduler.beam_size=1";
  }
  std::string est_fwd, est_comb;
  if (spec.tq) {
    const std::string common = " est_tq=" + std::to_string(spec.tq) + " est_hq=" + std::to_string(spec.hq) +
                               " est_hkv=" + std::to_string(spec.hkv);
    est_fwd = common + " est_pages=" + std::to_string(spec.pages) + " est_tiles=" + std::to_string(spec.tiles);
    est_comb = common + " est_topk=" + std::to_string(spec.topk) + " est_partials=" + std::to_string(spec.tiles * spec.T);
  }
  auto gen = [&](const std::string& generator, const std::string& fn, const std::string& extra) {
    const std::string cmd = std::string(KVOUTER_GENERATOR_PATH) + " -g " + generator + " -f " + fn + " -o " + out +
                            " -e static_library,c_header,stmt,schedule target=" + target + " schedule=" + schedule +
                            " D=" + std::to_string(spec.D) + " qhead=" + std::to_string(spec.qhead) + extra + autos;
    std::printf("%s\n", cmd.c_str());
    if (std::system(cmd.c_str()) != 0) throw BackendError("export: the generator failed for " + fn);
  };
  std::string fwd_extra = " page_size=" + std::to_string(spec.page_size) + " block_size=" + std::to_string(spec.block_size);
  for (const auto& [k, v] : knobs) fwd_extra += " " + k + "=" + (k == "T" ? std::to_string(spec.T) : v);
  gen("kvouter_forward", name + "_fwd", fwd_extra + est_fwd);
  gen("kvouter_combine", name + "_comb", " vec=" + knobs.at("vec") + " grain=" + knobs.at("grain") + est_comb);
  std::printf("exported %s_fwd and %s_comb (static library, header, .stmt, schedule) to %s\n", name.c_str(),
              name.c_str(), out.c_str());
  return 0;
}

int cmd_tune(const std::vector<std::string>& a) {
  kx::TuneOptions opt;
  bool db_given = false;
  for (size_t i = 0; i < a.size(); ++i) {
    auto value = [&] { return option_value(a, i); };
    auto number = [&](const std::string& v) {
      try {
        return std::stoi(v);
      } catch (...) {
        throw UsageError(a[i - 1] + ": expected an integer, got '" + v + "'");
      }
    };
    if (a[i] == "--shape") opt.shape = value();
    else if (a[i] == "--target") opt.target = value();
    else if (a[i] == "--db") opt.db = value(), db_given = true;
    else if (a[i] == "--log") opt.log = value();
    else if (a[i] == "--repeats") opt.repeats = number(value());
    else if (a[i] == "--max-candidates") opt.max_candidates = number(value());
    else if (a[i] == "--warmup-ms") opt.warmup_ms = warmup_ms_value(value());
    else throw UsageError("tune: unknown argument '" + a[i] + "'");
  }
  if (opt.repeats < 1) throw UsageError("--repeats: expected a positive integer");
  if (!db_given) opt.db = tuning_db_path();
  if (opt.log.empty()) {
    opt.log = std::string(KVOUTER_SOURCE_DIR) + "/experiments/results/tune_" + opt.shape + "_" + opt.target + ".jsonl";
  }
  return kx::run_tune(opt);
}

int cmd_sweep(const std::vector<std::string>& a) {
  kx::SweepOptions opt;
  opt.results_dir = std::string(KVOUTER_SOURCE_DIR) + "/experiments/results";
  for (size_t i = 0; i < a.size(); ++i) {
    auto value = [&] { return option_value(a, i); };
    if (a[i] == "--out") opt.out = value();
    else if (a[i] == "--point") opt.point = value();
    else if (a[i] == "--results") opt.results_dir = value();
    else if (a[i] == "--shard") {
      const std::string v = value();
      if (std::sscanf(v.c_str(), "%d/%d", &opt.shard, &opt.shards) != 2 || opt.shards < 1 || opt.shard < 1 ||
          opt.shard > opt.shards) {
        throw UsageError("--shard: expected K/N with 1 <= K <= N, got '" + v + "'");
      }
    } else if (!a[i].empty() && a[i][0] == '-') {
      throw UsageError("sweep: unknown option '" + a[i] + "'");
    } else if (opt.config.empty()) {
      opt.config = a[i];
    } else {
      throw UsageError("sweep: unexpected argument '" + a[i] + "'");
    }
  }
  if (opt.config.empty()) throw UsageError("sweep: expected CONFIG.yaml");
  return kx::run_sweep(opt);
}

int cmd_make_case(const std::vector<std::string>& args) {
  if (args.size() != 2) throw UsageError("make-case: expected SHAPE DIR");
  save_case(args[1], kx::make_case(kx::named_shape(args[0])));
  std::printf("wrote %s to %s\n", args[0].c_str(), args[1].c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  kx::register_all_backends();
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty() || args[0] == "--help" || args[0] == "-h" || args[0] == "help") {
    main_help();
    return args.empty() ? kExitBadInput : 0;
  }
  const std::string cmd = args[0];
  args.erase(args.begin());
  const bool wants_help = std::find(args.begin(), args.end(), "--help") != args.end() ||
                          std::find(args.begin(), args.end(), "-h") != args.end();
  if (wants_help && cmd != "run" && command_help(cmd)) return 0;
  try {
    if (cmd == "run") {
      if (std::find(args.begin(), args.end(), "--help") != args.end()) {
        run_help();
        return 0;
      }
      return cmd_run(args);
    }
    if (cmd == "demo") return cmd_demo(args);
    if (cmd == "compare") return cmd_compare(args);
    if (cmd == "roofline") {
      std::cout << kx::roofline_json(kx::measure_roofline()) << std::endl;
      return 0;
    }
    if (cmd == "make-case") return cmd_make_case(args);
    if (cmd == "export") return cmd_export(args);
    if (cmd == "tune") return cmd_tune(args);
    if (cmd == "sweep") return cmd_sweep(args);
    if (cmd == "sweep-merge") {
      if (args.size() < 2) throw UsageError("sweep-merge: expected OUT.jsonl IN.jsonl...");
      return kx::merge_sweeps(args[0], std::vector<std::string>(args.begin() + 1, args.end()));
    }
    throw UsageError("unknown command '" + cmd + "' (see kvouter --help)");
  } catch (const UsageError& e) {
    std::cerr << "kvouter: usage error: " << e.what() << std::endl;
  } catch (const InputError& e) {
    std::cerr << "kvouter: invalid input: " << e.what() << std::endl;
  } catch (const CaseFileError& e) {
    std::cerr << "kvouter: case file error: " << e.what() << std::endl;
  } catch (const BackendError& e) {
    std::cerr << "kvouter: backend error: " << e.what() << std::endl;
  } catch (const std::exception& e) {
    std::cerr << "kvouter: error: " << e.what() << std::endl;
  }
  return kExitBadInput;
}
