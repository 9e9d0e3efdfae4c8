// Validation of Options aggregates. Every policy validates its Options once, in its constructor,
// and every failure is a ConfigError that names the field and the value it was given.
#pragma once

#include <charconv>
#include <cmath>
#include <sstream>
#include <string>
#include <string_view>

#include "cohort/core/error.hpp"

namespace cohort::options {

// The shortest text that reads back as the same double, so that two texts are equal exactly when
// the values are (the settings every process of a job compares).
inline std::string shortest(double value) {
  char digits[32];
  const auto written = std::to_chars(digits, digits + sizeof digits, value);
  return std::string(digits, written.ptr);
}

template <class T>
[[noreturn]] void reject(std::string_view field, const T& value, std::string_view requirement) {
  std::ostringstream message;
  message << field << " = " << value << ": " << requirement;
  throw ConfigError(message.str());
}

template <class T>
void require_positive(std::string_view field, T value) {
  if (!(value > T{0})) reject(field, value, "must be greater than 0");
}

template <class T>
void require_finite(std::string_view field, T value) {
  if (!std::isfinite(static_cast<double>(value))) reject(field, value, "must be a finite number");
}

template <class T>
void require_finite_positive(std::string_view field, T value) {
  require_finite(field, value);
  require_positive(field, value);
}

template <class T>
void require_finite_non_negative(std::string_view field, T value) {
  require_finite(field, value);
  if (value < T{0}) reject(field, value, "must not be negative");
}

template <class T>
void require_in_range(std::string_view field, T value, T low, T high) {
  if (!(value >= low && value <= high)) {
    std::ostringstream requirement;
    requirement << "must lie in [" << low << ", " << high << "]";
    reject(field, value, requirement.str());
  }
}

}  // namespace cohort::options
