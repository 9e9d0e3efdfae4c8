// Reduction operators shared by every collective and by the device math.
//
// kSumBfloat16 (kSumFloat16) is the sum of a canonical tree whose every node is rounded to
// bfloat16 (float16; core/narrow_float.hpp): the leaves are values of the format, each merge adds
// two in float and rounds once. Every node is then a value of the format, whichever rank or thread
// computes it, so a job that sends its gradient at half the bytes (collective::Wire) has bits that
// do not depend on its replica count, as a float sum's do not. They reduce float elements only
// (reduces<T>), and the format's own (Bfloat16, Float16) where it travels packed.
#pragma once

#include <algorithm>
#include <string_view>
#include <type_traits>

#include "cohort/core/narrow_float.hpp"

namespace cohort {

enum class ReduceOp { kSum, kProduct, kMin, kMax, kSumBfloat16, kSumFloat16 };

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
    case ReduceOp::kSumFloat16:
      return "sum_fp16";
  }
  return "unknown";
}

// Whether `op` is a sum whose every node is rounded to a 16-bit format.
constexpr bool rounds_nodes(ReduceOp op) {
  return op == ReduceOp::kSumBfloat16 || op == ReduceOp::kSumFloat16;
}

// Whether `op` reduces elements of T: every operator reduces every element type but the rounded
// sums, which reduce float only, and each its own packed format (Bfloat16, Float16).
template <class T>
constexpr bool reduces(ReduceOp op) {
  if (op == ReduceOp::kSumBfloat16) return std::is_same_v<T, float> || std::is_same_v<T, Bfloat16>;
  if (op == ReduceOp::kSumFloat16) return std::is_same_v<T, float> || std::is_same_v<T, Float16>;
  return true;
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
    case ReduceOp::kSumFloat16:
      if constexpr (std::is_same_v<T, float>) {
        return op == ReduceOp::kSumBfloat16 ? round_to_bfloat16(a + b) : round_to_float16(a + b);
      } else {
        return a +
               b;  // a packed format's own addition rounds; other types are refused (reduces<T>)
      }
  }
  return a;
}

}  // namespace cohort
