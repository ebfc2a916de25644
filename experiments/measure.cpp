#include "measure.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "kvouter/stats.h"

namespace kvouter::experiments {

double Measurement::median() const { return kvouter::median(ms); }
double Measurement::quantile(double q) const { return kvouter::quantile(ms, q); }

void Measurement::append(const Measurement& o) {
  ms.insert(ms.end(), o.ms.begin(), o.ms.end());
  forward_ms.insert(forward_ms.end(), o.forward_ms.begin(), o.forward_ms.end());
  combine_ms.insert(combine_ms.end(), o.combine_ms.begin(), o.combine_ms.end());
  compile_ms += o.compile_ms;
  transfer_ms = o.transfer_ms;
  if (o.checked) {
    checked = true;
    err.max_out_err = std::max(err.max_out_err, o.err.max_out_err);
    err.max_lse_err = std::max(err.max_lse_err, o.err.max_lse_err);
    err.tol_ratio = std::max(err.tol_ratio, o.err.tol_ratio);
  }
  out = o.out;
}

namespace {

// One call's compile and transfer times, and its repetitions (forward_all, combine_all), or its
// one timed run where the backend does not repeat its kernels.
void add_call(const RunTiming& t, Measurement* m) {
  m->compile_ms += t.compile_ms;
  m->transfer_ms = t.transfer_ms;
  const bool reps = !t.forward_all.empty() && t.combine_all.size() == t.forward_all.size();
  for (size_t i = 0; i < (reps ? t.forward_all.size() : 1); ++i) {
    const double f = reps ? t.forward_all[i] : t.forward_ms, c = reps ? t.combine_all[i] : t.combine_ms;
    m->forward_ms.push_back(f);
    m->combine_ms.push_back(c);
    m->ms.push_back(f + c);
  }
}

// `n` timed repetitions: inside one call where the backend repeats its kernels (forward_all),
// else one call each.
void timed_calls(Backend& backend, const Plan& plan, const InputsView& in, int n, double warmup_ms, Measurement* m) {
  backend.set_kernel_timing({n, warmup_ms});
  const size_t before = m->ms.size();
  m->out = backend.run(plan, in);
  add_call(backend.last_timing(), m);
  backend.set_kernel_timing({1, 0});
  while (m->ms.size() - before < static_cast<size_t>(n)) {
    m->out = backend.run(plan, in);
    add_call(backend.last_timing(), m);
  }
}

}  // namespace

Measurement measure(Backend& backend, const Plan& plan, const InputsView& in, const MeasureOptions& opt) {
  Measurement m;
  int reps = std::max(opt.repeats, 1);
  if (opt.warm_call) {
    backend.set_kernel_timing({});
    m.out = backend.run(plan, in);
    const RunTiming& t = backend.last_timing();
    m.compile_ms = t.compile_ms;
    m.first_call_ms = t.forward_ms + t.combine_ms;
    if (opt.reference) {
      m.checked = true;
      m.err = compare_outputs(m.out, *opt.reference);
      if (!m.ok()) return m;
    }
    if (opt.min_total_ms > 0 && m.first_call_ms > 0) {
      const double want = std::ceil(opt.min_total_ms / m.first_call_ms);
      reps = static_cast<int>(std::clamp(want, static_cast<double>(reps), static_cast<double>(std::max(opt.max_repeats, reps))));
    }
  }
  if (opt.stop_after_first_ms > 0) {
    timed_calls(backend, plan, in, 1, opt.warmup_ms, &m);
    if (reps > 1 && m.ms[0] <= opt.stop_after_first_ms) timed_calls(backend, plan, in, reps - 1, 0, &m);
  } else {
    timed_calls(backend, plan, in, reps, opt.warmup_ms, &m);
  }
  backend.set_kernel_timing({});
  if (!opt.warm_call && opt.reference) {
    m.checked = true;
    m.err = compare_outputs(m.out, *opt.reference);
  }
  return m;
}

nlohmann::json measurement_record(const Measurement& m, const Plan& plan) {
  nlohmann::json r;
  const double med = m.median();
  r["time_ms"] = {{"median", med},
                  {"p10", m.quantile(0.1)},
                  {"p90", m.quantile(0.9)},
                  {"min", m.ms.empty() ? 0.0 : *std::min_element(m.ms.begin(), m.ms.end())},
                  {"max", m.ms.empty() ? 0.0 : *std::max_element(m.ms.begin(), m.ms.end())},
                  {"n", m.ms.size()},
                  {"all", m.ms}};
  r["forward_ms"] = kvouter::median(m.forward_ms);
  r["combine_ms"] = kvouter::median(m.combine_ms);
  r["compile_ms"] = m.compile_ms;
  r["first_call_ms"] = m.first_call_ms;
  r["transfer_ms"] = m.transfer_ms;
  r["plan_ms"] = plan.plan_ms;
  r["T"] = plan.tiles.T;
  const double flops = plan.flops(), kv = plan.kv_unit_bytes();
  r["flops"] = flops;
  r["kv_bytes"] = kv;
  if (med > 0) {
    r["gflops"] = flops / (med * 1e6);
    r["kv_gbps"] = kv / (med * 1e6);
  }
  if (m.checked) {
    r["ok"] = m.ok();
    r["max_out_err"] = m.err.max_out_err;
    r["max_lse_err"] = m.err.max_lse_err;
  }
  return r;
}

double record_median_ms(const nlohmann::json& rec) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  if (rec.contains("time_ms") && rec["time_ms"].is_object()) return rec["time_ms"].value("median", nan);
  for (const char* key : {"median_ms", "kernel_ms"}) {
    if (rec.contains(key) && rec[key].is_number()) return rec[key].get<double>();
  }
  return nan;
}

const GpuDatasheet* gpu_datasheet(const std::string& device_name) {
  static constexpr GpuDatasheet kSheets[] = {
      {"H200 NVL", 60.0, 4.8}, {"H200", 67.0, 4.8},  {"H100 NVL", 60.0, 3.9},
      {"H100 PCIe", 51.0, 2.0}, {"H100", 67.0, 3.35},
  };
  for (const auto& d : kSheets) {
    if (device_name.find(d.name_contains) != std::string::npos) return &d;
  }
  return nullptr;
}

nlohmann::json pct_of_datasheet(const GpuDatasheet* sheet, double rate, double GpuDatasheet::*figure) {
  return sheet ? nlohmann::json(100.0 * rate / (sheet->*figure)) : nlohmann::json(nullptr);
}

}  // namespace kvouter::experiments
