#include "tuner.h"

#include <Halide.h>

#include <algorithm>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "../reference/dense_eigen.h"
#include "case_gen.h"
#include "cli_util.h"
#include "measure.h"
#include "provenance.h"
#include "kvouter/errors.h"
#include "kvouter/jit.h"
#include "kvouter/plan.h"
#include "kvouter/vulkan_probe.h"
#include "registry.h"
#include "schedule_registry.h"
#include "kvouter/stats.h"

namespace kvouter::experiments {

namespace {

using json = nlohmann::json;

// A Vulkan target's entries are keyed by the device the kernels run on (the first one the loader
// reports, as Halide picks it), a CPU target's by the host CPU.
std::string db_key(const std::string& shape_class, const std::string& target) {
  std::string machine = machine_fingerprint();
  if (is_vulkan_target(target)) {
    const auto devices = vulkan_devices();
    machine = devices.empty() ? "no Vulkan device" : devices.front().name;
  }
  return shape_class + "|" + target + "|" + machine + "|halide-" + halide_version();
}

json load_json(const std::string& path, json fallback) {
  std::ifstream f(path);
  if (!f) return fallback;
  try {
    return json::parse(f);
  } catch (...) {
    return fallback;
  }
}

}  // namespace

std::string Candidate::key() const {
  std::string s = schedule;
  for (const auto& [k, v] : knobs) s += "," + k + "=" + v;
  return s;
}

ShapeClass ShapeClass::of(const Inputs& in) {
  const Problem p = validate(in);
  ShapeClass c;
  c.D = p.D;
  c.block_size = p.block_size;
  c.page_size = p.page_size;
  c.qhead = p.qhead;
  c.decode = p.B > 0 && p.Tq <= 4 * p.B;
  c.name = "D" + std::to_string(c.D) + "_b" + std::to_string(c.block_size) + "_p" + std::to_string(c.page_size) +
           "_q" + std::to_string(c.qhead) + (c.decode ? "_decode" : "_prefill");
  return c;
}

// A result file as the database names it: relative to the working directory (the source tree, as
// the CLI is run) where it lies inside it.
static std::string source_relative(const std::string& path) {
  std::error_code ec;
  const auto abs = std::filesystem::weakly_canonical(path, ec);
  const auto root = std::filesystem::weakly_canonical(std::filesystem::current_path(), ec);
  const std::string a = abs.string(), r = root.string() + "/";
  return a.rfind(r, 0) == 0 ? a.substr(r.size()) : path;
}

bool keep(const Candidate& c, const ShapeClass& shape, const std::string& target, uint64_t max_shared_bytes) {
  const pipeline::ScheduleInfo* info = pipeline::find_schedule(c.schedule);
  if (!info) return false;
  const bool gpu = info->device == "vulkan";
  if (gpu != is_vulkan_target(target)) return false;  // a schedule runs on its own device only
  if (c.knobs.empty()) return true;                    // an autoscheduled twin
  pipeline::KnobValues k;
  for (const auto& [name, value] : c.knobs) k[name] = std::stol(value);
  // Decode-like shapes have about one query per work unit: large tiles are padding.
  if (shape.decode ? k.at("T") > 2 : (k.at("T") != 0 && k.at("T") < 8)) return false;
  const int registers = gpu ? 0 : pipeline::vector_registers(Halide::Target(halide::resolve_target(target)));
  const pipeline::TuneShape ts{shape.D, shape.block_size, shape.page_size, shape.qhead, shape.decode,
                               static_cast<int64_t>(max_shared_bytes), registers};
  // The block as one chunk where the schedule takes it so; shared memory within the device's.
  if (info->one_chunk && k.at("chunk") != pipeline::kWholeBlock) return false;
  if (info->shared_bytes && info->shared_bytes(k, ts) > ts.max_shared_bytes) return false;
  return !info->keep || info->keep(k, ts);
}

std::vector<Candidate> tuning_space(const ShapeClass& shape, const std::string& target) {
  const bool gpu = is_vulkan_target(target);
  uint64_t shared = kMinSharedBytes;
  if (gpu) {
    const auto devices = vulkan_devices();
    if (!devices.empty() && devices[0].max_shared_bytes > 0) shared = devices[0].max_shared_bytes;
  }
  // Each schedule's own axes crossed with T; keep() (the schedule's rule) prunes the product.
  const std::vector<const char*> Ts = {"0", "1", "2", "8", "16", "32"};
  std::vector<Candidate> out;
  for (const auto& s : pipeline::all_schedules()) {
    if ((s.device == "vulkan") != gpu) continue;
    if (!s.autoscheduler.empty()) {
      out.push_back({s.name, {}});
      continue;
    }
    const auto& ax = s.axes;
    const std::vector<std::string> aheads = s.takes_ahead() ? s.aheads : std::vector<std::string>{""};
    for (const char* T : Ts)
      for (const auto& chunk : ax.chunks)
        for (const auto& r : ax.rows)
          for (const auto& unroll : ax.unrolls)
            for (const auto& vec : ax.vecs)
              for (const auto& ahead : aheads) {
                Candidate c{s.name, {{"T", T}, {"chunk", chunk}, {"rows", r}, {"unroll", unroll}}};
                if (!vec.empty()) c.knobs["vec"] = vec;
                if (!ahead.empty()) c.knobs["ahead"] = ahead;
                if (keep(c, shape, target, shared)) out.push_back(c);
              }
  }
  return out;
}


Candidate untuned_default(const Inputs& in, const ShapeClass& shape, const std::string& target) {
  const std::string schedule = default_schedule(target, validate(in));
  const pipeline::Knobs def = pipeline::resolve_knobs({}, Halide::Target(halide::resolve_target(target)));
  Candidate c{schedule, {{"T", std::to_string(knob_defaults::T)},
                         {"chunk", std::to_string(std::min<int64_t>(def.chunk, shape.block_size))},
                         {"rows", std::to_string(def.rows)},
                         {"unroll", std::to_string(def.unroll)}}};
  const pipeline::ScheduleInfo* info = pipeline::find_schedule(schedule);
  if (info && info->takes_ahead()) c.knobs["ahead"] = std::to_string(knob_defaults::ahead);
  if (info) {
    for (const auto& [k, v] : info->default_params) {
      if (c.knobs.count(k)) c.knobs[k] = v;
    }
  }
  return c;
}

int run_tune(const TuneOptions& opt) {
  register_all_backends();
  if (is_vulkan_target(opt.target)) require_vulkan_device();  // one clear error, not one per candidate
  Inputs in = make_case(named_shape(opt.shape));
  const ShapeClass shape = ShapeClass::of(in);
  const std::string target = halide::resolve_target(opt.target);
  const std::string log_path = !opt.log.empty() ? opt.log
                                                : "experiments/results/tune_" + opt.shape + "_" + opt.target + ".jsonl";
  std::vector<Candidate> space = tuning_space(shape, opt.target);
  // A GPU's clock rises only under load (docs/vulkan.md): warm each candidate's kernels.
  const double warmup_ms = opt.warmup_ms >= 0 ? opt.warmup_ms : is_vulkan_target(opt.target) ? 2000.0 : 0.0;
  if (opt.max_candidates > 0 && static_cast<int>(space.size()) > opt.max_candidates) {
    // The untuned default's own point first (so that a sample never crowns a point slower than
    // what the default already runs; its chunk as the generator takes it, at most the block),
    // every autoscheduled twin, and an even spread over the manual schedules' knob space. On a
    // GPU the default is the tuning database's: no point of its own here.
    const std::string def_key = is_vulkan_target(opt.target) ? "" : untuned_default(in, shape, opt.target).key();
    std::vector<Candidate> manual, picked;
    for (const auto& c : space) {
      if (c.key() == def_key) picked.insert(picked.begin(), c);
      else (c.knobs.empty() ? picked : manual).push_back(c);
    }
    if (static_cast<int>(picked.size()) > opt.max_candidates) picked.resize(static_cast<size_t>(opt.max_candidates));
    const int n = std::max(0, opt.max_candidates - static_cast<int>(picked.size()));
    for (int i = 0; i < n && !manual.empty(); ++i) picked.push_back(manual[i * manual.size() / n]);
    space = picked;
  }

  // Resume: trials already in the log, measured on this machine with this Halide, are not run
  // again (a log carried from another machine is kept, but its trials count for nothing here).
  std::set<std::string> done;
  double best_ms = 1e300;
  json best;
  int trial = 0;
  {
    std::ifstream f(log_path);
    std::string line;
    while (std::getline(f, line)) {
      json r;
      try {
        r = json::parse(line);
      } catch (...) {
        continue;  // a line cut by a kill
      }
      if (r.value("shape_class", "") != shape.name || r.value("target", "") != opt.target) continue;
      if (r.value("machine", "") != machine_fingerprint() || r.value("halide_version", "") != halide_version()) continue;
      done.insert(r.value("candidate", ""));
      trial = std::max(trial, r.value("trial", 0) + 1);
      if (r.value("status", "") == "ok" && record_median_ms(r) < best_ms) {
        best_ms = record_median_ms(r);
        best = r;
      }
    }
  }
  std::filesystem::create_directories(std::filesystem::path(log_path).parent_path());
  std::ofstream log(log_path, std::ios::app);

  const Problem prob = validate(in);
  const Outputs ref = reference::dense_attention<double>(in, prob);
  std::printf("tune %s (%s) on %s: %zu candidates, %zu already in %s\n", opt.shape.c_str(), shape.name.c_str(),
              opt.target.c_str(), space.size(), done.size(), log_path.c_str());
  const Stopwatch t_start;
  int finished = 0;
  const int todo = static_cast<int>(std::count_if(space.begin(), space.end(), [&](const Candidate& c) { return !done.count(c.key()); }));
  for (const Candidate& c : space) {
    if (done.count(c.key())) continue;
    json rec = {{"kind", "tune"}, {"shape", opt.shape}, {"shape_class", shape.name}, {"target", opt.target},
                {"trial", trial++}, {"candidate", c.key()}, {"schedule", c.schedule}, {"knobs", c.knobs},
                {"machine", machine_fingerprint()}, {"halide_version", halide_version()}, {"timestamp", now_iso()}};
    std::string status;
    try {
      // Every candidate's result is compared with the oracle below.
      auto backend = BackendRegistry::instance().make({"jit", c.schedule, c.knobs, opt.target, true});
      const Plan plan = make_plan(in, backend->plan_options());
      MeasureOptions mo;
      mo.repeats = opt.repeats;
      mo.warmup_ms = warmup_ms;
      mo.stop_after_first_ms = best_ms < 1e300 ? opt.drop_factor * best_ms : 0.0;
      mo.reference = &ref;
      const Measurement m = measure(*backend, plan, in, mo);
      rec["compile_ms"] = m.compile_ms;
      if (!m.ok()) {
        rec["max_out_err"] = m.err.max_out_err;
        rec["max_lse_err"] = m.err.max_lse_err;
        status = "rejected: max|out err| " + std::to_string(m.err.max_out_err) + ", max|lse err| " +
                 std::to_string(m.err.max_lse_err) + " beyond SPEC's tolerance";
      } else {
        rec.update(measurement_record(m, plan));
        const double median = m.median();
        if (static_cast<int>(m.ms.size()) < opt.repeats) {
          status = "dropped";
        } else {
          status = "ok";
          if (median < best_ms) {
            best_ms = median;
            best = rec;
          }
        }
      }
    } catch (const std::exception& e) {
      status = std::string("rejected: ") + e.what();
    }
    rec["status"] = status;
    rec["best_ms"] = best_ms < 1e300 ? best_ms : -1.0;
    log << rec.dump() << "\n" << std::flush;
    ++finished;
    const double elapsed = t_start.ms() / 1000.0;
    const double eta = elapsed / finished * (todo - finished);
    std::printf("[%d/%d] %-16s %-40s %-9s %9s  best %8.3f ms  ETA %4.0f s\n", finished, todo, c.schedule.c_str(),
                c.key().substr(c.schedule.size()).c_str(), status.substr(0, 8).c_str(),
                rec.contains("time_ms") ? (std::to_string(record_median_ms(rec)).substr(0, 8) + "ms").c_str() : "-",
                best_ms < 1e300 ? best_ms : 0.0, eta);
    std::fflush(stdout);
  }
  if (best.is_null()) {
    std::printf("no candidate passed; the database is unchanged\n");
    return 1;
  }
  json db = load_json(opt.db, json{{"entries", json::object()}});
  db["entries"][db_key(shape.name, opt.target)] = {{"schedule", best["schedule"]}, {"knobs", best["knobs"]},
                                                   {"median_ms", record_median_ms(best)}, {"shape", opt.shape},
                                                   {"target_string", target}, {"updated", now_iso()},
                                                   {"source", source_relative(log_path)}};
  std::filesystem::create_directories(std::filesystem::path(opt.db).parent_path());
  std::ofstream(opt.db) << db.dump(1) << "\n";
  std::printf("winner for %s on %s: %s (%.3f ms); written to %s, log in %s\n", shape.name.c_str(), opt.target.c_str(),
              best["candidate"].get<std::string>().c_str(), best_ms, opt.db.c_str(), log_path.c_str());
  return 0;
}

std::optional<TunedChoice> lookup_tuned(const Inputs& in, const std::string& target, const std::string& db_path) {
  const json db = load_json(db_path, json::object());
  if (!db.contains("entries")) return std::nullopt;
  const auto it = db["entries"].find(db_key(ShapeClass::of(in).name, target));
  if (it == db["entries"].end()) return std::nullopt;
  TunedChoice c;
  c.schedule = (*it)["schedule"].get<std::string>();
  c.knobs = (*it)["knobs"].get<std::map<std::string, std::string>>();
  c.median_ms = (*it)["median_ms"].get<double>();
  return c;
}

}  // namespace kvouter::experiments
