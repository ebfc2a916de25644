// What every result record carries so it can be reproduced: the Halide version, the machine, the
// time, and the git revision the experiments were built from.
#pragma once

#include <string>

namespace kvouter::experiments {

std::string halide_version();       // "21.0.0"
std::string machine_fingerprint();  // CPU model, cores, widest vector ISA
std::string now_iso();              // UTC, ISO 8601
const char* git_revision();         // short hash of the tree built, "-dirty" with uncommitted changes

}  // namespace kvouter::experiments
