// Reduction operators shared by every collective and by the device math.
#pragma once

#include <algorithm>
#include <string_view>

namespace cohort {

enum class ReduceOp { kSum, kProduct, kMin, kMax };

constexpr std::string_view name(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return "sum";
    case ReduceOp::kProduct:
      return "prod";
    case ReduceOp::kMin:
      return "min";
    case ReduceOp::kMax:
      return "max";
  }
  return "unknown";
}

template <class T>
constexpr T combine(ReduceOp op, T a, T b) {
  switch (op) {
    case ReduceOp::kSum:
      return a + b;
    case ReduceOp::kProduct:
      return a * b;
    case ReduceOp::kMin:
      return std::min(a, b);
    case ReduceOp::kMax:
      return std::max(a, b);
  }
  return a;
}

}  // namespace cohort
