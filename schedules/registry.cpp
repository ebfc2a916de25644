// One line per schedule. A manual schedule names its functions; an autoscheduled twin names the
// autoscheduler (the generator then leaves scheduling to it).
#include "schedules.h"

namespace kvouter::pipeline {

const std::vector<ScheduleInfo>& all_schedules() {
  static const std::vector<ScheduleInfo> list = {
      {"cpu_simple", "cpu", cpu_simple_forward, cpu_simple_combine, "",
       "plain: vectorised over the innermost dimension, parallel over tiles"},
      {"cpu_tiled", "cpu", cpu_tiled_forward, cpu_simple_combine, "",
       "per tile: K chunk staged transposed once, register-blocked Q.K^T and P.V"},
      {"cpu_rowstream", "cpu", cpu_rowstream_forward, cpu_simple_combine, "",
       "per tile: K/V chunk staged once, rows streamed in register blocks (scores never stored)"},
      {"vulkan_tiled", "vulkan", vulkan_tiled_forward, vulkan_combine, "",
       "GEMM stages per tile (one workgroup per tile each): K staged transposed, register-tiled "
       "scores and P.V through device memory; the block is one chunk",
       {{"chunk", "4096"}}},
      {"vulkan_rows", "vulkan", vulkan_rows_forward, vulkan_combine, "",
       "vulkan_tiled's stages with workgroups of one edge's rows (qhead) each",
       {{"chunk", "4096"}}},
      {"vulkan_fused", "vulkan", vulkan_fused_forward, vulkan_combine, "",
       "one kernel per (row group, tile): K/V chunk staged in shared memory, online softmax over "
       "chunks, state in shared memory",
       {{"chunk", "8"}, {"rows", "8"}}},
      {"vulkan_onepass", "vulkan", vulkan_onepass_forward, vulkan_combine, "",
       "one kernel per (row group, tile), the block as one chunk: K/V read from their pages once "
       "per workgroup, register-tiled scores and P.V, every intermediate in shared memory",
       {{"chunk", "4096"}, {"rows", "8"}}},
      {"auto_adams2019", "cpu", nullptr, nullptr, "Adams2019", "Adams2019 autoscheduler twin"},
      {"auto_mullapudi2016", "cpu", nullptr, nullptr, "Mullapudi2016", "Mullapudi2016 autoscheduler twin"},
      {"auto_li2018", "cpu", nullptr, nullptr, "Li2018", "Li2018 autoscheduler twin"},
      {"auto_anderson2021", "vulkan", nullptr, nullptr, "Anderson2021", "Anderson2021 (GPU) autoscheduler twin"},
      {"auto_mullapudi2016_gpu", "vulkan", nullptr, nullptr, "Mullapudi2016",
       "Mullapudi2016 autoscheduler twin with its experimental GPU schedules"},
  };
  return list;
}

const ScheduleInfo* find_schedule(const std::string& name) {
  for (const auto& s : all_schedules()) {
    if (s.name == name) return &s;
  }
  return nullptr;
}

}  // namespace kvouter::pipeline
