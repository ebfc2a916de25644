// Where a Vulkan device must be there: KVOUTER_REQUIRE_VULKAN=1 (CI sets it: lavapipe is
// installed) turns every "no Vulkan device" skip into a failure, so that a CI machine whose Vulkan
// went missing fails instead of passing with the gpu tests skipped.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

namespace kvouter::testing_vulkan {

inline bool required() {
  const char* v = std::getenv("KVOUTER_REQUIRE_VULKAN");
  return v && std::string(v) == "1";
}

}  // namespace kvouter::testing_vulkan

// Skips the test without a Vulkan device (`why`: the reason), or fails it where one is required.
#define KVOUTER_NO_VULKAN(why)                                                                    \
  do {                                                                                            \
    if (::kvouter::testing_vulkan::required()) FAIL() << "KVOUTER_REQUIRE_VULKAN=1, but " << why; \
    GTEST_SKIP() << why;                                                                          \
  } while (0)
