// The schedule interface and its registry. The generators look a schedule up here by name; each
// file in schedules/ registers itself with register_schedule(), so the generators never include
// the schedules. An entry describes itself to every tool: the CLI and the tests list the entries,
// and the tuner crosses each entry's knob axes and keeps what the entry's keep() accepts.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "kvouter_funcs.h"
#include "target_rules.h"

namespace kvouter::pipeline {

// What the tuner knows of a shape and a device when it asks a schedule about a candidate.
struct TuneShape {
  int64_t D = 0, block_size = 0, page_size = 0, qhead = 0;
  bool decode = false;            // about one query per work unit
  int64_t max_shared_bytes = 0;   // per workgroup, of the device tuned on (GPU schedules)
  int64_t vector_registers = 16;  // of the CPU target tuned for (vector_registers(target))
};

// A candidate's knobs by name (T, chunk, rows, unroll, and vec when set), as integers.
using KnobValues = std::map<std::string, int64_t>;

struct ScheduleInfo {
  std::string name;
  std::string device;           // "cpu" or "vulkan"
  ForwardSchedule forward;      // nullptr for autoscheduled twins
  CombineSchedule combine;
  std::string autoscheduler;    // non-empty for autoscheduled twins (Adams2019, ...)
  std::string summary;
  // The forward takes each block as one chunk (the GPU schedules whose shared memory or register
  // arrays hold a whole block): chunk is then kWholeBlock by default and the tuner's only chunk,
  // and the schedule refuses a chunk smaller than the block (vulkan_require_static).
  bool one_chunk = false;
  // Knobs this schedule runs with unless the caller sets them (--param); one_chunk adds chunk.
  std::map<std::string, std::string> default_params = {};
  // The tuner's axes: the values of chunk, rows and unroll it crosses with T (and vec: "" is the
  // knob's default, left out of the candidate); one_chunk sets chunks. Empty for autoscheduled
  // twins.
  struct Axes {
    std::vector<std::string> chunks, rows, unrolls;
    std::vector<std::string> vecs = {""};
  } axes = {};
  // Shared memory of one workgroup for these knobs at this shape, in bytes (GPU schedules that
  // stage in shared memory; the same formula the schedule allocates by), or null. The tuner keeps
  // only candidates within the device's.
  std::function<int64_t(const KnobValues&, const TuneShape&)> shared_bytes = nullptr;
  // Whether a candidate of the axes is a distinct program that fits the shape (knobs the schedule
  // does not read pinned, register budgets). Null: all.
  std::function<bool(const KnobValues&, const TuneShape&)> keep = nullptr;
  // The forward takes the knob ahead (kvouter/knobs.h; CPU schedules): the tuner then crosses
  // its values `aheads` too, and a schedule without it refuses ahead > 0.
  std::vector<std::string> aheads = {};
  bool takes_ahead() const { return !aheads.empty(); }
  // Where the block is one chunk (specialised), the partials are that chunk's (o, m, l) as they
  // are, with no online state: ForwardFuncs::st is left undefined and the schedule computes the
  // per-chunk stages per tile (chunk_level in schedules/schedules.h). CPU schedules.
  bool chunk_partials = false;
};

// The chunk knob's value for "the whole block as one chunk", at any block size (a specialised
// block; the forward's C is then block_size).
inline constexpr int kWholeBlock = 0;

// The knobs a schedule sees: those left 0 (automatic: vec, rows, unroll; kvouter/knobs.h) sized
// to the target. On a CPU, the natural vector width and a register tile of rows 4 x unroll with
// 4 x unroll accumulators = half the vector registers (32 with AVX-512 and on ARM, 16 on other
// x86: 4 x 4 at 16 floats, 4 x 2 at 8). Measured 2026-12-02 on a 2-core AVX2 EPYC (Zen 3),
// cpu_tiled JIT: SPEC decode forward 53-56 ms against 68-70 ms with the AVX-512 sizes, prefill
// 218-282 against 341-346 ms (experiments/results/cpu/2026-12-02/avx2_knobs.md). On a GPU target
// the schedules' own sizes: 16 (vulkan_onepass's automatic width), 4 and 4.
Knobs resolve_knobs(Knobs k, const Halide::Target& target);
// vector_registers and prefill_wide_tile: target_rules.h.

// Every registered schedule: manual schedules before autoscheduled twins, CPU before GPU, then by
// name (registration order across files is not defined, this order is).
const std::vector<ScheduleInfo>& all_schedules();
const ScheduleInfo* find_schedule(const std::string& name);
// Called once per schedule, from a file-scope initialiser of its file in schedules/. Returns true.
bool register_schedule(ScheduleInfo info);

}  // namespace kvouter::pipeline
