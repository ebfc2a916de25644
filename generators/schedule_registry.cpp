#include "schedule_registry.h"

#include <algorithm>
#include <stdexcept>
#include <tuple>

namespace kvouter::pipeline {

namespace {

std::vector<ScheduleInfo>& registry() {
  static std::vector<ScheduleInfo> list;  // built before main, by the schedules' initialisers
  return list;
}

auto order_key(const ScheduleInfo& s) { return std::make_tuple(!s.autoscheduler.empty(), s.device != "cpu", s.name); }

}  // namespace

Knobs resolve_knobs(Knobs k, const Halide::Target& target) {
  if (target.has_gpu_feature()) {
    if (k.vec == 0) k.vec = 16;
    if (k.rows == 0) k.rows = 4;
    if (k.unroll == 0) k.unroll = 4;
    return k;
  }
  const int registers = vector_registers(target);
  if (k.vec == 0) k.vec = target.natural_vector_size(Halide::Float(32));
  if (k.rows == 0) k.rows = 4;
  if (k.unroll == 0) k.unroll = std::max(1, registers / 2 / k.rows);
  return k;
}

const std::vector<ScheduleInfo>& all_schedules() { return registry(); }

const ScheduleInfo* find_schedule(const std::string& name) {
  for (const auto& s : registry()) {
    if (s.name == name) return &s;
  }
  return nullptr;
}

bool register_schedule(ScheduleInfo info) {
  if (find_schedule(info.name)) throw std::logic_error("schedule '" + info.name + "' registered twice");
  if (info.one_chunk) {
    info.default_params.emplace("chunk", std::to_string(kWholeBlock));
    if (!info.axes.rows.empty()) info.axes.chunks = {std::to_string(kWholeBlock)};
  }
  auto& list = registry();
  const auto at = std::upper_bound(list.begin(), list.end(), info,
                                   [](const ScheduleInfo& a, const ScheduleInfo& b) { return order_key(a) < order_key(b); });
  list.insert(at, std::move(info));
  return true;
}

}  // namespace kvouter::pipeline
