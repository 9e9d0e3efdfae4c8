// Adam and AdamW: one implementation, BasicAdam<WeightDecay>, that differs only in how weight decay
// enters (Kingma & Ba 2015; Loshchilov & Hutter 2019). At step t (StepContext::step, 1 for the
// first update), with the bias corrections placed where torch.optim.Adam places them:
//
//   g' = g * gradient_scale + wd * p     Adam  (kCoupled: L2 decay goes through the moments)
//   g' = g * gradient_scale              AdamW (kDecoupled: decay stays outside them)
//   m  = beta1 * m + (1 - beta1) * g'
//   v  = beta2 * v + (1 - beta2) * (g' * g')
//   u  = (lr / bc1) * m / (sqrt(v) / sqrt(bc2) + epsilon)
//   p  = p - u                           Adam
//   p  = p - ((lr * wd) * p + u)         AdamW, with p the value before this step
//
// with bc1 = 1 - beta1^t and bc2 = 1 - beta2^t computed once per step on the host in double, and
// lr / bc1, sqrt(bc2), lr * wd, 1 - beta1, 1 - beta2 rounded once to T. The square root is taken
// of v before dividing by sqrt(bc2), as PyTorch does; sqrt(v / bc2) is the same real number but
// rounds differently. epsilon is added outside the root, and u is evaluated as
// ((lr / bc1) * m) / denominator, as PyTorch's addcdiv does.
//
// AdamW is the same real number as PyTorch's p = p * (1 - lr * wd); p = p - u (u does not depend
// on p), but rounds better in float: 1 - lr * wd rounded to float errs by up to 2^-25 the same way
// at every step, so the parameters drift (3e-6 relative after 100 steps at lr * wd = 5e-4), and
// two updates of p round p twice per step. Here p is rounded once per step, and the float errors
// of lr * wd and of the sum fall on the small terms.
//
// State: kStateSlots = 2, slot-major: [m: n values][v: n values], zero-initialized.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include "cohort/core/error.hpp"
#include "cohort/core/host_device.hpp"
#include "cohort/core/options.hpp"
#include "cohort/optimizer/optimizer.hpp"

namespace cohort::optimizer {

enum class WeightDecay {
  kCoupled,    // Adam: weight_decay * p joins the gradient, so it is normalized with it
  kDecoupled,  // AdamW: p shrinks by learning_rate * weight_decay, outside the moments
};

// One element of an Adam step, with the step's constants already in T. The CPU loop below and the
// CUDA kernel both call it. Each operation is its own statement and rounds to T; as for SgdRule,
// nvcc needs -fmad=false and GCC -ffp-contract=off so that none is fused into an FMA, and nvcc must
// keep its defaults -prec-div=true -prec-sqrt=true -ftz=false (no --use_fast_math) so that the
// division and the square root are correctly rounded, as on the CPU.
template <class T, WeightDecay Decay>
struct AdamRule {
  T gradient_scale;
  T weight_decay;  // kCoupled: joins the gradient. kDecoupled: learning_rate * weight_decay
  T beta1;
  T one_minus_beta1;
  T beta2;
  T one_minus_beta2;
  T step_size;  // learning_rate / bc1
  T sqrt_bc2;
  T epsilon;

  COHORT_HOST_DEVICE void operator()(T& param, T gradient, T& m, T& v) const {
    const T scaled = gradient * gradient_scale;
    const T decay = weight_decay * param;
    T direction = scaled;
    if constexpr (Decay == WeightDecay::kCoupled) direction = scaled + decay;
    const T m_kept = beta1 * m;
    const T m_added = one_minus_beta1 * direction;
    m = m_kept + m_added;
    const T v_kept = beta2 * v;
    const T square = direction * direction;
    const T v_added = one_minus_beta2 * square;
    v = v_kept + v_added;
    const T root = std::sqrt(v);
    const T corrected_root = root / sqrt_bc2;
    const T denominator = corrected_root + epsilon;
    const T numerator = step_size * m;
    const T update = numerator / denominator;
    if constexpr (Decay == WeightDecay::kCoupled) {
      param = param - update;
    } else {
      const T total = decay + update;
      param = param - total;
    }
  }
};

// Use through the aliases Adam and AdamW below (as std::string is std::basic_string<char>).
template <WeightDecay Decay>
class BasicAdam {
 public:
  struct Options {
    // Required: the default 0 is rejected, so a forgotten learning rate is an error, not a no-op.
    double learning_rate = 0.0;
    // In [0, 1): decay rates of the first and second moment averages.
    double beta1 = 0.9;
    double beta2 = 0.999;
    // > 0: added to the bias-corrected root of v, so a parameter with no gradient does not divide
    // by zero.
    double epsilon = 1e-8;
    // Adam: coupled L2 (default 0). AdamW: decoupled decay (default 0.01, PyTorch's).
    double weight_decay = Decay == WeightDecay::kDecoupled ? 0.01 : 0.0;
    // Read by the caller, never by step(): 0 = no clipping; otherwise the caller folds
    // clipping_factor(...) into StepContext::gradient_scale.
    double max_gradient_norm = 0.0;
  };

  static constexpr std::string_view kName = Decay == WeightDecay::kCoupled ? "adam" : "adamw";
  static constexpr std::size_t kStateSlots = 2;

  explicit BasicAdam(const Options& options) : options_(validated(options)) {}

  const Options& options() const noexcept { return options_; }

  // Each option's name and value (optimizer::describe_options).
  template <class Visit>
  void visit_options(Visit&& visit) const {
    visit("learning_rate", options_.learning_rate);
    visit("beta1", options_.beta1);
    visit("beta2", options_.beta2);
    visit("epsilon", options_.epsilon);
    visit("weight_decay", options_.weight_decay);
    visit("max_gradient_norm", options_.max_gradient_norm);
  }

  // The per-element rule for step context.step (>= 1): bias corrections in double, then every
  // constant rounded once to T.
  template <class T>
  AdamRule<T, Decay> rule(const StepContext& context) const {
    COHORT_ASSERT(context.step >= 1);
    const double t = static_cast<double>(context.step);
    const double bc1 = 1.0 - std::pow(options_.beta1, t);
    const double bc2 = 1.0 - std::pow(options_.beta2, t);
    const double learning_rate = options_.learning_rate * context.learning_rate_factor;
    return {
        .gradient_scale = static_cast<T>(context.gradient_scale),
        .weight_decay =
            static_cast<T>(Decay == WeightDecay::kCoupled ? options_.weight_decay
                                                          : learning_rate * options_.weight_decay),
        .beta1 = static_cast<T>(options_.beta1),
        .one_minus_beta1 = static_cast<T>(1.0 - options_.beta1),
        .beta2 = static_cast<T>(options_.beta2),
        .one_minus_beta2 = static_cast<T>(1.0 - options_.beta2),
        .step_size = static_cast<T>(learning_rate / bc1),
        .sqrt_bc2 = static_cast<T>(std::sqrt(bc2)),
        .epsilon = static_cast<T>(options_.epsilon),
    };
  }

  // state = [m: params.size() values][v: params.size() values].
  template <class T>
  void step(std::span<T> params, std::span<const T> gradients, std::span<T> state,
            StepContext context) const {
    COHORT_ASSERT(gradients.size() == params.size());
    COHORT_ASSERT(state.size() == kStateSlots * params.size());
    const AdamRule<T, Decay> update = rule<T>(context);
    T* m = state.data();
    T* v = state.data() + params.size();
    // Compilers vectorize this loop only under -fno-math-errno: otherwise std::sqrt must be able to
    // set errno, and GCC and Clang keep a scalar square root with a branch for every element.
    for (std::size_t i = 0; i < params.size(); ++i) update(params[i], gradients[i], m[i], v[i]);
  }

 private:
  static void require_unit_interval(std::string_view field, double value) {
    // beta = 1 never forgets and makes bc = 0; NaN fails both comparisons.
    if (!(value >= 0.0 && value < 1.0)) cohort::options::reject(field, value, "must lie in [0, 1)");
  }

  static Options validated(const Options& options) {
    cohort::options::require_finite_positive("learning_rate", options.learning_rate);
    require_unit_interval("beta1", options.beta1);
    require_unit_interval("beta2", options.beta2);
    cohort::options::require_finite_positive("epsilon", options.epsilon);
    cohort::options::require_finite_non_negative("weight_decay", options.weight_decay);
    if constexpr (Decay == WeightDecay::kDecoupled) {
      // Beyond that the decay alone would flip or zero every parameter at each step.
      if (!(options.learning_rate * options.weight_decay < 1.0)) {
        cohort::options::reject("weight_decay", options.weight_decay,
                                "learning_rate * weight_decay must be less than 1");
      }
    }
    cohort::options::require_finite_non_negative("max_gradient_norm", options.max_gradient_norm);
    return options;
  }

  Options options_;
};

using Adam = BasicAdam<WeightDecay::kCoupled>;
using AdamW = BasicAdam<WeightDecay::kDecoupled>;
static_assert(Optimizer<Adam>);
static_assert(Optimizer<AdamW>);

}  // namespace cohort::optimizer
