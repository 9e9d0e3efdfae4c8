// Sgd: plain stochastic gradient descent, with optional coupled (L2) weight decay.
//
//   g' = g * gradient_scale + weight_decay * p
//   p  = p - learning_rate * g'
//
// State: none (kStateSlots = 0); the state span passed to step() is empty.
#pragma once

#include <cstddef>
#include <span>
#include <string_view>

#include "cohort/core/error.hpp"
#include "cohort/core/host_device.hpp"
#include "cohort/core/options.hpp"
#include "cohort/optimizer/optimizer.hpp"

namespace cohort::optimizer {

// One element of an Sgd step, with the step's constants already in T. The CPU loop below and the
// CUDA kernel both call it, so they compute the same values from one definition. Each operation is
// its own statement and rounds to T. For CPU and GPU bits to agree no compiler may fuse them into
// an FMA: nvcc needs -fmad=false, and GCC -ffp-contract=off (its C++ default, fast, fuses across
// statements whenever the target has FMA, e.g. with -march=native). Clang's default fuses only
// within one expression, which separate statements already prevent.
template <class T>
struct SgdRule {
  T learning_rate;
  T weight_decay;
  T gradient_scale;

  COHORT_HOST_DEVICE void operator()(T& param, T gradient) const {
    const T scaled = gradient * gradient_scale;
    // weight_decay = 0 adds an exact zero, so the rule needs no branch for "no decay".
    const T decay = weight_decay * param;
    const T direction = scaled + decay;
    const T update = learning_rate * direction;
    param = param - update;
  }
};

class Sgd {
 public:
  struct Options {
    // Required: the default 0 is rejected, so a forgotten learning rate is an error, not a no-op.
    double learning_rate = 0.0;
    // Coupled L2 decay: weight_decay * p is added to the scaled gradient.
    double weight_decay = 0.0;
    // Read by the caller, never by step(): 0 = no clipping; otherwise the caller folds
    // clipping_factor(...) into StepContext::gradient_scale.
    double max_gradient_norm = 0.0;
  };

  static constexpr std::string_view kName = "sgd";
  static constexpr std::size_t kStateSlots = 0;

  explicit Sgd(const Options& options) : options_(validated(options)) {}

  const Options& options() const noexcept { return options_; }

  // Each option's name and value (optimizer::describe_options).
  template <class Visit>
  void visit_options(Visit&& visit) const {
    visit("learning_rate", options_.learning_rate);
    visit("weight_decay", options_.weight_decay);
    visit("max_gradient_norm", options_.max_gradient_norm);
  }

  // The per-element rule for one step, constants rounded once to T.
  template <class T>
  SgdRule<T> rule(const StepContext& context) const {
    return {
        .learning_rate = static_cast<T>(options_.learning_rate * context.learning_rate_factor),
        .weight_decay = static_cast<T>(options_.weight_decay),
        .gradient_scale = static_cast<T>(context.gradient_scale),
    };
  }

  template <class T>
  void step(std::span<T> params, std::span<const T> gradients, std::span<T> state,
            StepContext context) const {
    COHORT_ASSERT(gradients.size() == params.size());
    COHORT_ASSERT(state.size() == kStateSlots * params.size());
    const SgdRule<T> update = rule<T>(context);
    for (std::size_t i = 0; i < params.size(); ++i) update(params[i], gradients[i]);
  }

 private:
  static Options validated(const Options& options) {
    cohort::options::require_finite_positive("learning_rate", options.learning_rate);
    cohort::options::require_finite_non_negative("weight_decay", options.weight_decay);
    cohort::options::require_finite_non_negative("max_gradient_norm", options.max_gradient_norm);
    return options;
  }

  Options options_;
};
static_assert(Optimizer<Sgd>);

}  // namespace cohort::optimizer
