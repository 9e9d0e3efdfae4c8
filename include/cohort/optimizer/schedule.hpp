// Learning-rate schedules: the factor that multiplies the optimizer's learning_rate at each step.
//
//   cohort::Trainer trainer(model, strategy, cohort::optimizer::Adam({.learning_rate = 1e-3}),
//                           {.schedule = {.warmup_steps = 500,
//                                         .decay = cohort::optimizer::Decay::kCosine,
//                                         .decay_steps = 9'500}});
//
// The factor is a function of the run's step only (the update's index from 0, counted since the
// run began, restores included), never of time or of who computes it, so that the parameters are
// the same bits on any replica count and strategy, and after a restore. It reaches the update
// through StepContext::learning_rate_factor (optimizer.hpp), on every device, and on parameter
// servers, which evaluate it at their own count of updates (under Sync the run's step).
//
// factor(step), with s = step - warmup_steps once the warm-up is over:
//   warm-up      step < warmup_steps: (step + 1) / warmup_steps, rising linearly to 1 at the last
//                warm-up step
//   kConstant    1
//   kCosine      final_factor + (1 - final_factor) * (1 + cos(pi * min(s, decay_steps) /
//                decay_steps)) / 2: from 1 to final_factor over decay_steps, then final_factor
//                (PyTorch's CosineAnnealingLR with eta_min = final_factor * learning_rate)
//   kLinear      1 - (1 - final_factor) * min(s, decay_steps) / decay_steps
//   kStep        step_factor ^ floor(s / decay_steps) (PyTorch's StepLR, gamma = step_factor)
//   custom       custom(step), replacing all of the above: any callable from the step to a
//                factor, which must be finite and not negative (a ConfigError names the step
//                otherwise)
// Every process of a job must use the same schedule: its description() is part of the job's
// settings check and of the checkpoint. A custom schedule is described by its factors at the steps
// 0, 1, 10, 100, ... 10^9 (custom_name names it for people).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <numbers>
#include <string>

#include "cohort/core/options.hpp"

namespace cohort::optimizer {

enum class Decay {
  kConstant,
  kCosine,
  kLinear,
  kStep,
};

struct Schedule {
  std::uint64_t warmup_steps = 0;
  Decay decay = Decay::kConstant;
  std::uint64_t decay_steps = 0;  // kCosine, kLinear: the decay's length; kStep: between drops
  double final_factor = 0.0;      // kCosine, kLinear: the factor once the decay is over
  double step_factor = 0.1;       // kStep: what each drop multiplies the factor by
  std::function<double(std::uint64_t)> custom{};
  std::string custom_name = "custom";

  // Refuses fields that make no schedule (ConfigError naming the field, "schedule.decay_steps").
  void validate() const {
    if (custom) return;
    if (decay != Decay::kConstant && decay_steps == 0) {
      options::reject("schedule.decay_steps", decay_steps,
                      "must be positive for a decaying schedule");
    }
    if (!(final_factor >= 0.0 && final_factor <= 1.0)) {
      options::reject("schedule.final_factor", final_factor, "must lie in [0, 1]");
    }
    if (!(step_factor > 0.0 && step_factor <= 1.0)) {
      options::reject("schedule.step_factor", step_factor, "must lie in (0, 1]");
    }
  }

  double factor(std::uint64_t step) const {
    if (custom) {
      const double value = custom(step);
      if (!(value >= 0.0 && std::isfinite(value))) {
        options::reject("schedule.custom", value,
                        "returned at step " + std::to_string(step) +
                            ": a factor must be finite and not negative");
      }
      return value;
    }
    if (step < warmup_steps) {
      return static_cast<double>(step + 1) / static_cast<double>(warmup_steps);
    }
    const std::uint64_t since = step - warmup_steps;
    const double progress = decay_steps == 0 ? 1.0
                                             : static_cast<double>(std::min(since, decay_steps)) /
                                                   static_cast<double>(decay_steps);
    switch (decay) {
      case Decay::kConstant:
        return 1.0;
      case Decay::kCosine:
        return final_factor +
               (1.0 - final_factor) * (1.0 + std::cos(std::numbers::pi * progress)) / 2.0;
      case Decay::kLinear:
        return 1.0 - (1.0 - final_factor) * progress;
      case Decay::kStep:
        return std::pow(step_factor, static_cast<double>(since / decay_steps));
    }
    return 1.0;
  }

  // One line that is equal for two schedules exactly when they give the same factors (for a
  // custom one: the same at the sampled steps).
  std::string description() const {
    if (custom) {
      std::string text = custom_name + ":";
      for (std::uint64_t step = 0, i = 0; i < 11; ++i, step = step == 0 ? 1 : step * 10) {
        text += ' ' + std::to_string(step) + '=' + options::shortest(factor(step));
      }
      return text;
    }
    static constexpr const char* kDecayNames[] = {"constant", "cosine", "linear", "step"};
    std::string text = "warmup_steps=" + std::to_string(warmup_steps) +
                       " decay=" + kDecayNames[static_cast<int>(decay)];
    if (decay == Decay::kConstant) return text;
    text += " decay_steps=" + std::to_string(decay_steps);
    if (decay == Decay::kStep) return text + " step_factor=" + options::shortest(step_factor);
    return text + " final_factor=" + options::shortest(final_factor);
  }
};

}  // namespace cohort::optimizer
