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
#pragma once

#include <cstdint>
#include <string_view>

#include "cohort/core/options.hpp"
#include "cohort/core/reduce_op.hpp"

namespace cohort::collective {

enum class Wire : std::uint8_t { kFloat32, kBfloat16 };

inline constexpr std::string_view name(Wire wire) {
  return wire == Wire::kBfloat16 ? "bf16" : "fp32";
}

// The reduction a gradient sum in this format is.
inline constexpr ReduceOp gradient_sum(Wire wire) {
  return wire == Wire::kBfloat16 ? ReduceOp::kSumBfloat16 : ReduceOp::kSum;
}

// Refuses a gradient sum that a model of T values cannot take (kSumBfloat16 sums float only): a
// ConfigError naming the option, before the first step.
template <class T>
void require_gradient_sum_fits(ReduceOp gradient_sum) {
  if (!reduces<T>(gradient_sum)) {
    options::reject("wire", "bf16",
                    "sums float gradients only, and this model's values are double");
  }
}

}  // namespace cohort::collective
