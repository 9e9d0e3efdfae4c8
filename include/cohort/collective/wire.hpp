// Wire: the format a job's gradient crosses between processes in, the value of
// MultiWorkerMirrored's and ParameterServer's Options::wire (or COHORT_WIRE). A header of its own,
// as thread_priority.hpp is, so that what only reads the option does not parse a collective.
//
//   kFloat32   every gradient sum in float: the canonical tree of float nodes (the default)
//   kBfloat16  half the bytes: the canonical tree whose every node is rounded to bfloat16
//              (ReduceOp::kSumBfloat16, core/reduce_op.hpp), folded that way inside every replica,
//              between the replicas of a process and between processes, so that the bits still
//              do not depend on the replica count. They are other bits than kFloat32's: each sum
//              keeps 8 significant bits, as PyTorch's bf16_compress_hook's does, whose result
//              changes with the world size.
//   kFloat16   half the bytes the same way, every node rounded to IEEE float16
//              (ReduceOp::kSumFloat16): 11 significant bits, but a sum beyond 65504 in magnitude
//              becomes infinity (the Trainer's non-finite check names the step) and one below
//              6.0e-8 becomes zero; bfloat16 keeps float's range
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include "cohort/core/narrow_float.hpp"
#include "cohort/core/options.hpp"
#include "cohort/core/reduce_op.hpp"

namespace cohort::collective {

enum class Wire : std::uint8_t { kFloat32, kBfloat16, kFloat16 };

inline constexpr std::string_view name(Wire wire) {
  switch (wire) {
    case Wire::kBfloat16:
      return "bf16";
    case Wire::kFloat16:
      return "fp16";
    case Wire::kFloat32:
      break;
  }
  return "fp32";
}

// The reduction a gradient sum in this format is.
inline constexpr ReduceOp gradient_sum(Wire wire) {
  switch (wire) {
    case Wire::kBfloat16:
      return ReduceOp::kSumBfloat16;
    case Wire::kFloat16:
      return ReduceOp::kSumFloat16;
    case Wire::kFloat32:
      break;
  }
  return ReduceOp::kSum;
}

// The format whose gradient sum `op` is (kFloat32 for any other op).
inline constexpr Wire wire_of(ReduceOp op) {
  if (op == ReduceOp::kSumBfloat16) return Wire::kBfloat16;
  if (op == ReduceOp::kSumFloat16) return Wire::kFloat16;
  return Wire::kFloat32;
}

// The bytes an element of a gradient sum of `value_bytes` values crosses in: 2 in a narrow format.
inline constexpr std::size_t element_bytes(Wire wire, std::size_t value_bytes) {
  return wire == Wire::kFloat32 ? value_bytes : sizeof(std::uint16_t);
}

// Calls body(N{}) with N the type of the narrow format `wire` is: Bfloat16 or Float16.
template <class Body>
void with_narrow_format(Wire wire, Body&& body) {
  if (wire == Wire::kBfloat16) {
    body(Bfloat16{});
  } else {
    body(Float16{});
  }
}

// `values` in the 2 bytes each of a narrow format (kBfloat16, kFloat16): exact for the nodes of
// that format's tree, which every value of its gradient sum is.
inline void pack(Wire wire, std::span<const float> values, std::span<std::uint16_t> bits) {
  with_narrow_format(wire, [&]<class Narrow>(Narrow) {
    std::ranges::transform(values, bits.begin(), [](float v) { return Narrow::round(v).bits; });
  });
}

// The values `bits` (pack's) stand for.
template <class T>
void widen(Wire wire, std::span<const std::uint16_t> bits, std::span<T> values) {
  with_narrow_format(wire, [&]<class Narrow>(Narrow) {
    std::ranges::transform(bits, values.begin(),
                           [](std::uint16_t b) { return static_cast<T>(Narrow{b}.widen()); });
  });
}

// Refuses a gradient sum that a model of T values cannot take (the rounded sums sum float only):
// a ConfigError naming the option, before the first step.
template <class T>
void require_gradient_sum_fits(ReduceOp gradient_sum) {
  if (!reduces<T>(gradient_sum)) {
    options::reject("wire", name(wire_of(gradient_sum)),
                    "sums float gradients only, and this model's values are double");
  }
}

}  // namespace cohort::collective
