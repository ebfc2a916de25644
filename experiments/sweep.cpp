#include "sweep.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "../reference/dense_eigen.h"
#include "case_gen.h"
#include "kvouter/errors.h"
#include "kvouter/jit.h"
#include "kvouter/plan.h"
#include "measure.h"
#include "registry.h"
#include "roofline.h"
#include "provenance.h"
#include "kvouter/stats.h"

namespace kvouter::experiments {

namespace {

using json = nlohmann::json;

struct ShapePoint {
  std::string base;
  std::map<std::string, long> overrides;  // key -> value
  std::string id() const {
    std::string s = base;
    for (const auto& [k, v] : overrides) s += "," + k + "=" + std::to_string(v);
    return s;
  }
};

struct RunSpec {
  BackendConfig cfg;
  std::string id() const {
    std::string s = cfg.backend + "/" + (cfg.schedule.empty() ? "-" : cfg.schedule);
    for (const auto& [k, v] : cfg.params) s += "," + k + "=" + v;
    return s + "@" + (cfg.target.empty() ? "host" : cfg.target);
  }
};

const std::set<std::string> kShapeKeys = {"B", "qo", "kv", "Hq", "Hkv", "D", "block_size", "page_size", "topk", "causal"};

CaseSpec spec_of(const ShapePoint& p) {
  CaseSpec s = named_shape(p.base);
  for (const auto& [k, v] : p.overrides) {
    if (k == "B") {
      s.qo.assign(static_cast<size_t>(v), s.qo.empty() ? 1 : s.qo[0]);
      s.kv.assign(static_cast<size_t>(v), s.kv.empty() ? 1 : s.kv[0]);
    }
  }
  for (const auto& [k, v] : p.overrides) {
    if (k == "qo") std::fill(s.qo.begin(), s.qo.end(), v);
    else if (k == "kv") std::fill(s.kv.begin(), s.kv.end(), v);
    else if (k == "Hq") s.Hq = v;
    else if (k == "Hkv") s.Hkv = v;
    else if (k == "D") s.D = v;
    else if (k == "block_size") s.block_size = v;
    else if (k == "page_size") s.page_size = v;
    else if (k == "topk") s.topk = v;
    else if (k == "causal") s.causal = v != 0;
  }
  return s;
}

json shape_json(const ShapePoint& p, const CaseSpec& s) {
  return {{"name", p.id()}, {"base", p.base}, {"B", s.qo.size()}, {"qo", s.qo.empty() ? 0 : s.qo[0]},
          {"kv", s.kv.empty() ? 0 : s.kv[0]}, {"Hq", s.Hq}, {"Hkv", s.Hkv}, {"D", s.D},
          {"block_size", s.block_size}, {"page_size", s.page_size}, {"topk", s.topk}, {"causal", s.causal}};
}

// The grid of a config, in a fixed order (shards and resumes rely on it).
void parse_config(const std::string& path, std::string* name, int* repeats, std::vector<ShapePoint>* shapes,
                  std::vector<RunSpec>* runs) {
  YAML::Node cfg;
  try {
    cfg = YAML::LoadFile(path);
  } catch (const std::exception& e) {
    throw CaseFileError("sweep config " + path + ": " + e.what());
  }
  *name = cfg["name"] ? cfg["name"].as<std::string>() : std::filesystem::path(path).stem().string();
  *repeats = cfg["repeats"] ? cfg["repeats"].as<int>() : 5;
  if (*repeats < 1) throw InputError("sweep config repeats", "a positive integer", std::to_string(*repeats));
  if (!cfg["shapes"] || !cfg["shapes"].IsSequence()) throw InputError("sweep config shapes", "a list", "nothing");
  if (!cfg["runs"] || !cfg["runs"].IsSequence()) throw InputError("sweep config runs", "a list", "nothing");
  for (const auto& entry : cfg["shapes"]) {
    const std::string base = entry["base"] ? entry["base"].as<std::string>() : "tiny";
    named_shape(base);  // validates the name
    std::vector<std::pair<std::string, std::vector<long>>> axes;
    if (entry["grid"]) {
      for (const auto& kv : entry["grid"]) {
        const std::string key = kv.first.as<std::string>();
        if (!kShapeKeys.count(key)) throw InputError("sweep config grid key", "one of B, qo, kv, Hq, Hkv, D, block_size, page_size, topk, causal", key);
        std::vector<long> values;
        if (kv.second.IsSequence()) {
          for (const auto& v : kv.second) values.push_back(v.as<long>());
        } else {
          values.push_back(kv.second.as<long>());
        }
        axes.emplace_back(key, values);
      }
    }
    std::sort(axes.begin(), axes.end());
    std::vector<ShapePoint> points = {{base, {}}};
    for (const auto& [key, values] : axes) {
      std::vector<ShapePoint> next;
      for (const auto& p : points) {
        for (long v : values) {
          ShapePoint q = p;
          q.overrides[key] = v;
          next.push_back(q);
        }
      }
      points = next;
    }
    shapes->insert(shapes->end(), points.begin(), points.end());
  }
  for (const auto& r : cfg["runs"]) {
    RunSpec run;
    run.cfg.backend = r["backend"].as<std::string>();
    if (r["schedule"]) run.cfg.schedule = r["schedule"].as<std::string>();
    if (r["target"]) run.cfg.target = r["target"].as<std::string>();
    if (r["params"]) {
      for (const auto& kv : r["params"]) run.cfg.params[kv.first.as<std::string>()] = kv.second.as<std::string>();
    }
    runs->push_back(run);
  }
}

}  // namespace

int run_sweep(const SweepOptions& opt) {
  register_all_backends();
  std::string name;
  int repeats = 5;
  std::vector<ShapePoint> shapes;
  std::vector<RunSpec> runs;
  parse_config(opt.config, &name, &repeats, &shapes, &runs);
  std::string out = opt.out;
  if (out.empty()) {
    out = opt.results_dir + "/sweep_" + name +
          (opt.shards > 1 ? ".shard" + std::to_string(opt.shard) + "-of-" + std::to_string(opt.shards) : "") + ".jsonl";
  }
  // The full grid, then this shard's share, minus what the output file already has.
  std::vector<std::pair<size_t, size_t>> points;  // (shape, run)
  for (size_t s = 0; s < shapes.size(); ++s)
    for (size_t r = 0; r < runs.size(); ++r) points.emplace_back(s, r);
  std::set<std::string> done;
  {
    std::ifstream f(out);
    for (std::string line; std::getline(f, line);) {
      try {
        done.insert(json::parse(line).value("point", ""));
      } catch (...) {
      }
    }
  }
  std::vector<std::pair<size_t, size_t>> todo;
  for (size_t i = 0; i < points.size(); ++i) {
    if (static_cast<int>(i % opt.shards) != opt.shard - 1) continue;
    const std::string id = shapes[points[i].first].id() + "|" + runs[points[i].second].id();
    if (!opt.point.empty() && id != opt.point) continue;
    if (!done.count(id)) todo.push_back(points[i]);
  }
  std::printf("sweep %s: %zu points (%zu shapes x %zu runs), shard %d/%d: %zu to run, %zu already in %s\n",
              name.c_str(), points.size(), shapes.size(), runs.size(), opt.shard, opt.shards, todo.size(),
              done.size(), out.c_str());
  if (todo.empty()) return 0;
  std::filesystem::create_directories(std::filesystem::path(out).parent_path());
  std::ofstream log(out, std::ios::app);
  const Roofline roof = measure_roofline(0.3);
  const Stopwatch t0;
  std::string cached_shape;
  Inputs in;
  Outputs ref;
  int n = 0;
  for (const auto& [si, ri] : todo) {
    const ShapePoint& sp = shapes[si];
    const RunSpec& run = runs[ri];
    const std::string id = sp.id() + "|" + run.id();
    const CaseSpec cs = spec_of(sp);
    if (cached_shape != sp.id()) {  // the oracle once per shape (points are shape-major)
      in = make_case(cs);
      ref = reference::dense_attention<double>(in, validate(in));
      cached_shape = sp.id();
    }
    json rec = {{"kind", "sweep"}, {"sweep", name}, {"point", id}, {"shape", shape_json(sp, cs)},
                {"backend", run.cfg.backend}, {"schedule", run.cfg.schedule}, {"knobs", run.cfg.params},
                {"target", run.cfg.target.empty() ? "host" : run.cfg.target},
                {"git_rev", git_revision()}, {"halide_version", halide_version()},
                {"machine", machine_fingerprint()}, {"peak_gflops", roof.fma_gflops}, {"read_gbps", roof.read_gbps},
                {"repro", "build/bin/kvouter sweep " + opt.config + " --point '" + id + "'"},
                {"timestamp", now_iso()}};
    try {
      BackendConfig cfg = run.cfg;
      cfg.caller_checks_results = true;  // every point is compared with the oracle (measure)
      auto backend = BackendRegistry::instance().make(cfg);
      rec["schedule"] = backend->schedule();
      rec["knobs"] = backend->params();
      rec["target"] = backend->target();
      const Plan plan = make_plan(in, backend->plan_options());
      MeasureOptions mo;
      mo.repeats = repeats;
      mo.reference = &ref;
      const Measurement m = measure(*backend, plan, in, mo);
      if (m.ok()) {
        rec.update(measurement_record(m, plan));
        const double med = m.median();
        rec["pct_peak"] = 100.0 * plan.flops() / (med * 1e6) / roof.fma_gflops;
        rec["pct_roofline"] = 100.0 * roofline_bound_ms(plan, in, roof) / med;
      } else {
        rec["ok"] = false;
        rec["max_out_err"] = m.err.max_out_err;
        rec["max_lse_err"] = m.err.max_lse_err;
        rec["error"] = "result beyond SPEC's tolerance";
      }
    } catch (const std::exception& e) {
      rec["ok"] = false;
      rec["error"] = e.what();
    }
    log << rec.dump() << "\n" << std::flush;
    ++n;
    const double el = t0.ms() / 1000.0;
    std::printf("[%d/%zu] %-44s %-34s %s  ETA %4.0f s\n", n, todo.size(), sp.id().c_str(), run.id().c_str(),
                rec.contains("time_ms") ? (std::to_string(rec["time_ms"]["median"].get<double>()).substr(0, 8) + " ms").c_str()
                                        : ("FAILED: " + rec.value("error", std::string("?")).substr(0, 60)).c_str(),
                el / n * static_cast<double>(todo.size() - n));
    std::fflush(stdout);
  }
  std::printf("wrote %d records to %s\n", n, out.c_str());
  return 0;
}

int merge_sweeps(const std::string& out, const std::vector<std::string>& inputs) {
  std::map<std::string, std::string> by_point;  // later files win
  std::vector<std::string> order;
  for (const auto& path : inputs) {
    std::ifstream f(path);
    if (!f) throw CaseFileError("sweep-merge: cannot read " + path);
    for (std::string line; std::getline(f, line);) {
      std::string id;
      try {
        id = json::parse(line).value("point", "");
      } catch (...) {
        continue;  // a line cut by a kill
      }
      if (!by_point.count(id)) order.push_back(id);
      by_point[id] = line;
    }
  }
  std::ofstream o(out);
  for (const auto& id : order) o << by_point[id] << "\n";
  std::printf("merged %zu records from %zu files into %s\n", order.size(), inputs.size(), out.c_str());
  return 0;
}

}  // namespace kvouter::experiments
