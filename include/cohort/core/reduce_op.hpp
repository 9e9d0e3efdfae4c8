// Reduction operators shared by every collective and by the device math.
//
// kSumBfloat16 is the sum of a canonical tree whose every node is rounded to bfloat16
// (core/bfloat16.hpp): the leaves are bfloat16 values, each merge adds two in float and rounds
// once. Every node is then a bfloat16, whichever rank or thread computes it, so a job that sends
// its gradient at half the bytes (collective::Wire::kBfloat16) has bits that do not depend on its
// replica count, as a float sum's do not. It reduces float elements only (reduces<T>).
#pragma once

#include <algorithm>
#include <string_view>
#include <type_traits>

#include "cohort/core/bfloat16.hpp"

namespace cohort {

enum class ReduceOp { kSum, kProduct, kMin, kMax, kSumBfloat16 };

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
    case ReduceOp::kSumBfloat16:
      return "sum_bf16";
  }
  return "unknown";
}

// Whether `op` reduces elements of T: every operator reduces every element type but
// kSumBfloat16, which reduces float (and its packed form, Bfloat16) only.
template <class T>
constexpr bool reduces(ReduceOp op) {
  return op != ReduceOp::kSumBfloat16 || std::is_same_v<T, float> || std::is_same_v<T, Bfloat16>;
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
    case ReduceOp::kSumBfloat16:
      if constexpr (std::is_same_v<T, float>) {
        return round_to_bfloat16(a + b);
      } else {
        return a + b;  // Bfloat16's own addition rounds; other types are refused (reduces<T>)
      }
  }
  return a;
}

}  // namespace cohort
