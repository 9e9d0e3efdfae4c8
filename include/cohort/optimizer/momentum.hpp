// Momentum: SGD with heavy-ball or Nesterov momentum, in PyTorch's convention (torch.optim.SGD
// with dampening 0): the velocity accumulates the gradient itself, not learning_rate * gradient as
// in Sutskever et al.'s form; the two agree while the learning rate is constant.
//
//   g' = g * gradient_scale + weight_decay * p
//   v  = momentum * v + g'
//   p  = p - learning_rate * v                       (nesterov = false)
//   p  = p - learning_rate * (g' + momentum * v)     (nesterov = true)
//
// State: kStateSlots = 1, slot 0 = v (n values). Zero-initialized, so the first step gives v = g',
// exactly as PyTorch's first step does.
#pragma once

#include <cstddef>
#include <span>
#include <string_view>

#include "cohort/core/error.hpp"
#include "cohort/core/host_device.hpp"
#include "cohort/core/options.hpp"
#include "cohort/optimizer/optimizer.hpp"

namespace cohort::optimizer {

// One element of a Momentum step, with the step's constants already in T. The CPU loop below and
// the CUDA kernel both call it. Each operation is its own statement and rounds to T; as for
// SgdRule, nvcc needs -fmad=false and GCC -ffp-contract=off so that none is fused into an FMA.
template <class T>
struct MomentumRule {
  T learning_rate;
  T weight_decay;
  T gradient_scale;
  T momentum;
  bool nesterov;

  COHORT_HOST_DEVICE void operator()(T& param, T gradient, T& velocity) const {
    const T scaled = gradient * gradient_scale;
    // weight_decay = 0 adds an exact zero, so the rule needs no branch for "no decay".
    const T decay = weight_decay * param;
    const T direction = scaled + decay;
    const T carried = momentum * velocity;
    velocity = carried + direction;
    T applied = velocity;
    if (nesterov) {
      const T look_ahead = momentum * velocity;
      applied = direction + look_ahead;
    }
    const T update = learning_rate * applied;
    param = param - update;
  }
};

class Momentum {
 public:
  struct Options {
    // Required: the default 0 is rejected, so a forgotten learning rate is an error, not a no-op.
    double learning_rate = 0.0;
    // In [0, 1): the fraction of the velocity kept from one step to the next.
    double momentum = 0.9;
    bool nesterov = false;
    // Coupled L2 decay: weight_decay * p is added to the scaled gradient before the velocity.
    double weight_decay = 0.0;
    // Read by the caller, never by step(): 0 = no clipping; otherwise the caller folds
    // clipping_factor(...) into StepContext::gradient_scale.
    double max_gradient_norm = 0.0;
  };

  static constexpr std::string_view kName = "momentum";
  static constexpr std::size_t kStateSlots = 1;

  explicit Momentum(const Options& options) : options_(validated(options)) {}

  const Options& options() const noexcept { return options_; }

  // Each option's name and value (optimizer::describe_options); nesterov as 0 or 1.
  template <class Visit>
  void visit_options(Visit&& visit) const {
    visit("learning_rate", options_.learning_rate);
    visit("momentum", options_.momentum);
    visit("nesterov", options_.nesterov ? 1.0 : 0.0);
    visit("weight_decay", options_.weight_decay);
    visit("max_gradient_norm", options_.max_gradient_norm);
  }

  // The per-element rule for one step, constants rounded once to T.
  template <class T>
  MomentumRule<T> rule(const StepContext& context) const {
    return {
        .learning_rate = static_cast<T>(options_.learning_rate * context.learning_rate_factor),
        .weight_decay = static_cast<T>(options_.weight_decay),
        .gradient_scale = static_cast<T>(context.gradient_scale),
        .momentum = static_cast<T>(options_.momentum),
        .nesterov = options_.nesterov,
    };
  }

  // state = [v: params.size() values].
  template <class T>
  void step(std::span<T> params, std::span<const T> gradients, std::span<T> state,
            StepContext context) const {
    COHORT_ASSERT(gradients.size() == params.size());
    COHORT_ASSERT(state.size() == kStateSlots * params.size());
    const MomentumRule<T> update = rule<T>(context);
    T* velocity = state.data();
    for (std::size_t i = 0; i < params.size(); ++i) update(params[i], gradients[i], velocity[i]);
  }

 private:
  static Options validated(const Options& options) {
    cohort::options::require_finite_positive("learning_rate", options.learning_rate);
    // momentum >= 1 makes the velocity grow without bound; NaN fails both comparisons.
    if (!(options.momentum >= 0.0 && options.momentum < 1.0)) {
      cohort::options::reject("momentum", options.momentum, "must lie in [0, 1)");
    }
    cohort::options::require_finite_non_negative("weight_decay", options.weight_decay);
    cohort::options::require_finite_non_negative("max_gradient_norm", options.max_gradient_norm);
    return options;
  }

  Options options_;
};
static_assert(Optimizer<Momentum>);

}  // namespace cohort::optimizer
