// The message of the ConfigError a call throws, for tests that check what an error names.
#pragma once

#include <cohort/core/error.hpp>
#include <string>

namespace cohort::testing {

// The message of the ConfigError that f throws; "(no error)" if f throws none.
template <class F>
std::string config_error_message(F&& f) {
  try {
    f();
  } catch (const cohort::ConfigError& error) {
    return error.what();
  }
  return "(no error)";
}

inline bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

}  // namespace cohort::testing
