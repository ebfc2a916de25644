#include "provenance.h"

#include <HalideRuntime.h>

#include <ctime>
#include <fstream>
#include <thread>

#include "kvouter_git_rev.h"

namespace kvouter::experiments {

std::string halide_version() {
  return std::to_string(HALIDE_VERSION_MAJOR) + "." + std::to_string(HALIDE_VERSION_MINOR) + "." +
         std::to_string(HALIDE_VERSION_PATCH);
}

std::string machine_fingerprint() {
  std::ifstream f("/proc/cpuinfo");
  std::string line, model = "unknown-cpu";
  while (std::getline(f, line)) {
    if (line.rfind("model name", 0) == 0) {
      model = line.substr(line.find(':') + 2);
      break;
    }
  }
  __builtin_cpu_init();
  return model + " x" + std::to_string(std::thread::hardware_concurrency()) +
         (__builtin_cpu_supports("avx512f") ? " avx512" : "");
}

std::string now_iso() {
  std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  return buf;
}

const char* git_revision() { return KVOUTER_GIT_REV; }

}  // namespace kvouter::experiments
