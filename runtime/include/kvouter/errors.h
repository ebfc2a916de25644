// Typed errors of the kvouter runtime. Every SPEC §3 violation is an InputError naming the
// field, the expected and the actual value; callers (the CLI) map it to exit status 2.
#pragma once

#include <stdexcept>
#include <string>

namespace kvouter {

class InputError : public std::runtime_error {
 public:
  InputError(std::string field, const std::string& expected, const std::string& actual)
      : std::runtime_error(field + ": expected " + expected + ", got " + actual),
        field_(std::move(field)) {}
  const std::string& field() const { return field_; }

 private:
  std::string field_;
};

// A case file that cannot be read or parsed (missing, truncated, wrong format).
class CaseFileError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A backend, schedule, target or device that cannot serve the request.
class BackendError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace kvouter
