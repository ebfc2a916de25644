// One check of a backend on a case kind stored in a 16-bit dtype, shared by the JIT, AOT and Vulkan
// suites: the outputs against the float64 oracle computed from the values (values_only: never the
// bits the backend reads).
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <tuple>
#include <utility>

#include "case_kinds.h"
#include "cli_util.h"
#include "dense_eigen.h"
#include "kvouter/plan.h"

namespace kvouter::testing {

// A (schedule, case kind, 16-bit dtype) test parameter (named by ScheduleKindDtypeName).
using StorageParam = std::tuple<std::string, std::pair<std::string, experiments::CaseSpec>, Dtype>;

inline void expect_storage_matches_oracle(Backend& backend, const std::pair<std::string, experiments::CaseSpec>& kind,
                                          Dtype dtype, const std::string& what) {
  experiments::CaseSpec spec = kind.second;
  spec.dtype = dtype;
  const Inputs in = experiments::make_case(spec);
  const Plan plan = make_plan(in, backend.plan_options());
  ASSERT_EQ(plan.problem.dtype, dtype) << what;
  const Inputs values = values_only(in);
  const auto err = experiments::compare_outputs(backend.run(plan, in),
                                                reference::dense_attention<double>(values, validate(values)));
  EXPECT_TRUE(err.ok()) << what << " on " << kind.first << " in " << dtype_name(dtype) << ": max|out err| "
                        << err.max_out_err << " max|lse err| " << err.max_lse_err;
}

}  // namespace kvouter::testing
