// A CPU kernel's per-tile scratch comes from kvouter/host_alloc.h's cache once the kernel has run:
// the check that the allocator is installed on the path under test (AOT or JIT). Without it, the
// scratch of every tile is faulted in afresh whenever glibc trims its arena (the AOT slowdown).
#pragma once

#include <gtest/gtest.h>

#include "case_gen.h"
#include "kvouter/backend.h"
#include "kvouter/host_alloc.h"
#include "kvouter/plan.h"

namespace kvouter::testing_scratch {

// D = 128, blocks of 64 tokens, 8 query heads per KV head: the specialised AOT cpu_tiled variant's
// shape, whose tiles allocate their scratch on the heap (past Halide's 16 KB stack limit).
inline experiments::CaseSpec heap_scratch_case() {
  experiments::CaseSpec s;
  s.qo = {48, 16};
  s.kv = {1024, 700};
  s.Hq = 16;
  s.Hkv = 2;
  s.D = 128;
  s.block_size = 64;
  s.page_size = 16;
  s.topk = 4;
  return s;
}

inline void expect_scratch_reused(Backend& backend) {
  const Inputs in = experiments::make_case(heap_scratch_case());
  const Plan plan = make_plan(in, backend.plan_options());
  backend.run(plan, in);  // every thread's cache filled (and a JIT compile)
  const halide::HostAllocCounts before = halide::host_alloc_counts();
  backend.run(plan, in);
  const halide::HostAllocCounts after = halide::host_alloc_counts();
  const int64_t reused = after.reused - before.reused, fresh = after.fresh - before.fresh;
  EXPECT_GT(reused, 0) << "the kernels do not allocate through kvouter's host allocator";
  EXPECT_LE(fresh * 10, reused) << reused << " blocks reused, " << fresh << " from malloc";
}

}  // namespace kvouter::testing_scratch
