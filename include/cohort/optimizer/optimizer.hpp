// Optimizers: how a replica turns the reduced gradient into new parameters.
//
// An optimizer is a small policy type with an Options aggregate (validated in its constructor) and
// an elementwise update rule. Its state is a flat array of kStateSlots * n values of the model's
// value type, slot-major ([slot 0: n values][slot 1: n values]...), zero-initialized. The same
// layout is used by the CUDA kernels, so a state saved on one device restores on another.
//
//   O::kName                       "sgd", "momentum", "adam", "adamw": stored in checkpoints
//   O::kStateSlots                 values of state per parameter
//   o.options()                    the validated Options: learning_rate (which a schedule's
//                                  factor multiplies) and max_gradient_norm among them
//   o.step(params, gradients, state, StepContext)
//       params[i] updated from gradients[i] * context.gradient_scale, with the learning rate
//       times context.learning_rate_factor (the schedule's). The gradients are the raw reduced
//       sums; scaling is fused into the update so the gradient is read once.
//
// Optional, detected where present:
//   o.rule<T>(StepContext)         the per-element rule step() applies (the CUDA kernels and
//                                  device::cpu::step_finite call it, so they fuse other work
//                                  with the update and still compute step()'s bits)
//   o.visit_options(visit)         calls visit(name, double value) for every option, so that a
//                                  job's processes can check that they agree (Trainer::fit);
//                                  without it only max_gradient_norm is compared
//
// Every update is elementwise, so a shard of the parameters (a parameter server's) is updated with
// the same bits as the whole vector.
#pragma once

#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "cohort/core/options.hpp"

namespace cohort::optimizer {

struct StepContext {
  // 1 for the first update, counting every update since training began (Adam's bias correction).
  std::uint64_t step = 1;
  // Multiplies every raw gradient: 1 / global batch, times the clipping factor.
  double gradient_scale = 1.0;
  // Multiplies the learning rate at this step (optimizer/schedule.hpp). Every optimizer applies
  // it, in double, before its constants are rounded to the value type: a factor of 1 gives the
  // bits of no schedule.
  double learning_rate_factor = 1.0;
};

template <class O>
concept Optimizer = requires(const O& o, std::span<float> f, std::span<const float> cf,
                             std::span<double> d, std::span<const double> cd, StepContext c) {
  typename O::Options;
  { O::kName } -> std::convertible_to<std::string_view>;
  { O::kStateSlots } -> std::convertible_to<std::size_t>;
  { o.options() } -> std::convertible_to<const typename O::Options&>;
  { o.options().learning_rate } -> std::convertible_to<double>;
  { o.options().max_gradient_norm } -> std::convertible_to<double>;
  o.step(f, cf, f, c);
  o.step(d, cd, d, c);
};

// The factor that brings the scaled gradient's global norm down to max_norm (0 = no clipping).
// sum_of_squares is of the raw gradient (device::cpu::sum_of_squares or the device's equivalent).
inline double clipping_factor(double sum_of_squares, double gradient_scale, double max_norm) {
  if (max_norm <= 0.0) return 1.0;
  const double norm = std::sqrt(sum_of_squares) * gradient_scale;
  return norm > max_norm ? max_norm / norm : 1.0;
}

// "name=value name=value ...": o's options, each value the shortest text that reads back as the
// same double, so that two texts are equal exactly when the options are.
template <Optimizer O>
std::string describe_options(const O& o) {
  std::string text;
  const auto add = [&](std::string_view name, double value) {
    if (!text.empty()) text += ' ';
    text += name;
    text += '=';
    text += options::shortest(value);
  };
  if constexpr (requires { o.visit_options(add); }) {
    o.visit_options(add);
  } else {
    add("max_gradient_norm", o.options().max_gradient_norm);
  }
  return text;
}

}  // namespace cohort::optimizer
