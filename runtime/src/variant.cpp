#include "kvouter/variant.h"

#include <algorithm>
#include <cctype>
#include <sstream>

#include "kvouter/errors.h"
#include "kvouter/knobs.h"

namespace kvouter::halide {

Specialization Specialization::of(const Plan& plan) {
  const Problem& p = plan.problem;
  return {static_cast<int>(p.D), static_cast<int>(p.page_size), static_cast<int>(p.block_size),
          static_cast<int>(p.qhead), static_cast<int>(plan.tiles.T), p.dtype};
}

Specialization Specialization::with_extents(const Plan& plan) const {
  Specialization s = *this;
  const Problem& p = plan.problem;
  s.tq = std::max<int64_t>(p.Tq, 1);
  s.hq = p.Hq;
  // Mullapudi2016 fails (with an empty message) on an input estimate of extent 1; inputs only
  // need an estimate of the right order, so these never drop below 2.
  s.hkv = std::max<int64_t>(p.Hkv, 2);
  s.pages = std::max<int64_t>(p.num_pages, 2);
  s.tiles = std::max<int64_t>(plan.tiles.num_tiles, 1);
  s.topk = std::max<int64_t>(p.topk, 2);
  return s;
}

std::string Specialization::str() const {
  std::ostringstream os;
  os << "D=" << D << ",page_size=" << page_size << ",block_size=" << block_size << ",qhead=" << qhead << ",T=" << T;
  if (dtype != Dtype::kFloat32) os << ",storage=" << dtype_name(dtype);
  if (tq) os << ",est_tq=" << tq << ",est_hq=" << hq << ",est_hkv=" << hkv << ",est_pages=" << pages << ",est_tiles=" << tiles << ",est_topk=" << topk;
  return os.str();
}

std::string variant_name(const std::string& schedule, const std::string& target, const Specialization& spec,
                         const std::vector<std::pair<std::string, std::string>>& knobs) {
  std::string name = "kvouter_" + schedule;
  if (spec.D == 0 && spec.page_size == 0 && spec.block_size == 0 && spec.qhead == 0 && spec.T == 0) {
    name += "_generic";
  } else {
    name += "_d" + std::to_string(spec.D) + "_p" + std::to_string(spec.page_size) + "_b" + std::to_string(spec.block_size) +
            "_q" + std::to_string(spec.qhead) + "_t" + std::to_string(spec.T);
  }
  std::string suffix;
  if (target != "host") suffix += "_" + target;
  for (const auto& [k, v] : knobs) suffix += "_" + k + "_" + v;
  if (spec.dtype != Dtype::kFloat32) suffix += "_storage_" + dtype_name(spec.dtype);
  for (char& c : suffix) {
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  }
  return name + suffix;
}

std::string storage_target(const std::string& target, Dtype dtype) {
  if (!is_vulkan_target(target) || dtype == Dtype::kFloat32) return target;
  return target + (dtype == Dtype::kFloat16 ? "-vk_float16-vk_int16" : "-vk_int16");
}

const std::vector<std::string>& knob_names() {
  static const std::vector<std::string> names = {"T", "chunk", "vec", "rows", "unroll", "grain", "slice", "ahead"};
  return names;
}

std::map<std::string, std::string> checked_knobs(const std::map<std::string, std::string>& params) {
  namespace kd = knob_defaults;
  std::map<std::string, std::string> k = {{"T", std::to_string(kd::T)},         {"chunk", std::to_string(kd::chunk)},
                                          {"vec", std::to_string(kd::vec)},     {"rows", std::to_string(kd::rows)},
                                          {"unroll", std::to_string(kd::unroll)}, {"grain", std::to_string(kd::grain)},
                                          {"slice", std::to_string(kd::slice)}, {"ahead", std::to_string(kd::ahead)}};
  for (const auto& [name, value] : params) {
    if (!k.count(name)) {
      std::string known;
      for (const auto& n : knob_names()) known += (known.empty() ? "" : ", ") + n;
      throw BackendError("--param " + name + ": unknown knob (known: " + known + ")");
    }
    long v = 0;
    try {
      size_t used = 0;
      v = std::stol(value, &used);
      if (used != value.size()) v = 0;
    } catch (...) {
      v = 0;
    }
    // 0: chosen by the planner / schedule (T, slice), the whole block (chunk), or sized to the
    // target (vec, rows, unroll).
    const long lowest = name == "grain" ? 1 : 0;
    if (value.empty() || v < lowest || v > 4096 || (v == 0 && value != "0")) {
      throw BackendError("--param " + name + ": expected an integer in [" + std::to_string(lowest) +
                         ", 4096], got '" + value + "'");
    }
    k[name] = std::to_string(v);
  }
  return k;
}

int64_t tile_edges_of(const std::map<std::string, std::string>& knobs) { return std::stol(knobs.at("T")); }

const std::vector<std::string>& combine_knob_names() {
  static const std::vector<std::string> names = {"vec", "grain"};
  return names;
}

GeneratorParams generator_params(const std::string& schedule, const std::map<std::string, std::string>& knobs,
                                 const Specialization& spec) {
  GeneratorParams g;
  const std::string T = std::to_string(spec.T);
  g.forward = {{"schedule", schedule},
               {"D", std::to_string(spec.D)},
               {"page_size", std::to_string(spec.page_size)},
               {"block_size", std::to_string(spec.block_size)},
               {"qhead", std::to_string(spec.qhead)},
               {"storage", dtype_name(spec.dtype)}};
  for (const auto& [k, v] : knobs) g.forward[k] = v;
  g.forward["T"] = T;  // the plan's T (the knob may say 0 = automatic)
  g.combine = {{"schedule", schedule}, {"D", std::to_string(spec.D)}, {"qhead", std::to_string(spec.qhead)}, {"T", T}};
  for (const auto& k : combine_knob_names()) {
    if (knobs.count(k)) g.combine[k] = knobs.at(k);
  }
  if (spec.tq) {
    for (auto* m : {&g.forward, &g.combine}) {
      (*m)["est_tq"] = std::to_string(spec.tq);
      (*m)["est_hq"] = std::to_string(spec.hq);
      (*m)["est_hkv"] = std::to_string(spec.hkv);
    }
    g.forward["est_pages"] = std::to_string(spec.pages);
    g.forward["est_tiles"] = std::to_string(spec.tiles);
    g.combine["est_topk"] = std::to_string(spec.topk);
    g.combine["est_partials"] = std::to_string(spec.tiles * spec.T);
  }
  return g;
}

}  // namespace kvouter::halide
