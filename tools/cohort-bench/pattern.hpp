// The data cohort-bench checks with: small integers, so that every reduction over any number of
// ranks, in any order, is exact in every element type (nccl-tests' verifiable/ idea, simplified:
// a result is right when it equals the expected value with ==).
//
//   sum       inputs in [-4, 4]: sums stay far below 2^24, exact in float
//   sum_bf16, sum_fp16
//             the same: up to 64 ranks every partial sum is an integer of at most 256, exact in
//             bfloat16 and float16
//   prod      inputs in {1, -1, 2}, a 2 on one rank in eight at each index: the product is
//             +-2^k with k <= ranks / 8 + 1, exact in float, in int32 up to 240 ranks
//   min, max  inputs in [-6, 6]
// broadcast and all_gather move the sum pattern. Each rank's values differ from its neighbours'
// at most indices, so data from the wrong rank or the wrong place is caught too.
#pragma once

#include <cstddef>
#include <span>

#include "cohort/core/reduce_op.hpp"

namespace cohort::bench {

// Rank `rank`'s input at element `index`.
template <class T>
T input_value(ReduceOp op, int rank, std::size_t index) {
  const std::size_t r = static_cast<std::size_t>(rank);
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kSumBfloat16:
    case ReduceOp::kSumFloat16:
      return static_cast<T>(static_cast<int>((index * 7 + r * 3) % 9) - 4);
    case ReduceOp::kProduct: {
      const std::size_t k = (index + r) % 8;
      return static_cast<T>(k == 0 ? 2 : (k == 3 || k == 6 ? -1 : 1));
    }
    case ReduceOp::kMin:
    case ReduceOp::kMax:
      return static_cast<T>(static_cast<int>((index * 5 + r * 11) % 13) - 6);
  }
  return T{};
}

// The reduction over ranks 0..ranks-1 of their inputs at `index`.
template <class T>
T reduced_value(ReduceOp op, int ranks, std::size_t index) {
  T value = input_value<T>(op, 0, index);
  for (int r = 1; r < ranks; ++r) value = combine(op, value, input_value<T>(op, r, index));
  return value;
}

// A value no pattern produces: what receive buffers hold before a checked call, so that a call
// that writes nothing is caught.
template <class T>
constexpr T sentinel() {
  return static_cast<T>(99);
}

// What the timed iterations start from: values that repeated in-place reductions leave unchanged
// (0 for sum, 1 for prod, the pattern for min and max, which are idempotent), so that no number
// of iterations overflows or slows down on infinities. Only the checked call uses the pattern.
template <class T>
T stable_value(ReduceOp op, int rank, std::size_t index) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kSumBfloat16:
    case ReduceOp::kSumFloat16:
      return T{0};
    case ReduceOp::kProduct:
      return T{1};
    default:
      return input_value<T>(op, rank, index);
  }
}

// Elements of `values` that differ from expected(i) for i = 0, 1, ...
template <class T, class Expected>
std::size_t count_wrong(std::span<const T> values, Expected&& expected) {
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < values.size(); ++i) wrong += values[i] != expected(i) ? 1 : 0;
  return wrong;
}

}  // namespace cohort::bench
