// Non-finite gradients. Every step checks its reduced gradient, which every replica holds alike,
// so that every replica of every process decides the same way with no message between them. The
// check rides on a pass that reads the gradient anyway: the optimizer's update under kRaise, or
// the norm when clipping (max_gradient_norm > 0); only kSkipStep without clipping reads the
// gradient once more, before the update (docs/benchmarks.md has the cost).
//   kRaise      fit throws NumericError (core/error.hpp) on every process, after every replica
//               has finished the step: step() and index() name the step and the first non-finite
//               element of the reduced gradient. Without clipping the update was applied with the
//               check, so the replicas hold non-finite parameters: restore a checkpoint.
//   kSkipStep   every replica leaves its parameters and optimizer state as they were; the step
//               still counts (the data order, Adam's bias correction), and Report::skipped_steps
//               counts it.
// Under a strategy whose replicas do not check the gradient (not strategy::ChecksGradient: a
// parameter server, whose servers hold the reduced gradient, each a shard of it) every worker
// checks the parameters it pulls after each step instead (NumericError with where() ==
// kParameters; under Sync every worker pulls the same ones), and kSkipStep, which would need the
// servers to agree before they apply a step, is refused with a ConfigError on every process.
// Trainer::save never writes a state holding an infinity or NaN (trainer/checkpoints.hpp).
#pragma once

#include <span>
#include <string>

#include "cohort/core/error.hpp"
#include "cohort/core/options.hpp"
#include "cohort/strategy/strategy.hpp"

namespace cohort::trainer {

// Refuses an on_nonfinite that is not a policy, or that S cannot follow.
template <class S, class T, class O>
void validate_nonfinite_policy(NonFinite policy) {
  if (policy != NonFinite::kRaise && policy != NonFinite::kSkipStep) {
    options::reject("on_nonfinite", static_cast<int>(policy),
                    "must be NonFinite::kRaise or NonFinite::kSkipStep");
  }
  if (!strategy::ChecksGradient<S, T, O> && policy == NonFinite::kSkipStep) {
    options::reject("on_nonfinite", name(policy),
                    std::string("is not available under ") + std::string(S::kName) +
                        ": its servers hold the reduced gradient and would first have to agree "
                        "to skip a step; use NonFinite::kRaise (the default)");
  }
}

// Before a NumericError that every replica raises alike: a barrier, so that each finishes this
// step (its collectives, its update, a parameter-server worker's pulls) before the first error
// releases the others or its process exits. Then they all hold the same state, and every
// process reports this error rather than the release's or a lost peer's.
template <class Replica>
void finish_together(Replica& replica) {
  try {
    replica.communicator().barrier();
  } catch (const CommError&) {
  }
}

// replica.finish_step(update), and what the step found: false for a step whose reduced gradient
// is finite, true for one that every replica skipped (NonFinite::kSkipStep); a NumericError for
// one that raises. Where the strategy checks no gradient, the step's parameters are checked.
template <class S, class D, class Replica, class T, class O>
bool finish_and_check(Replica& replica, strategy::Update<T, O>& update,
                      const typename D::Place& place) {
  if constexpr (strategy::ChecksGradient<S, T, O>) {
    const strategy::StepResult result = replica.finish_step(update);
    if (result.first_nonfinite == strategy::StepResult::kFinite) return false;
    if (update.on_nonfinite == NonFinite::kSkipStep) return true;
    finish_together(replica);
    throw NumericError(
        NumericError::Where::kGradient, update.step, result.first_nonfinite,
        std::string("fit stopped (on_nonfinite = raise); ") +
            (result.applied ? "every replica applied the step, so its parameters are no longer "
                              "finite"
                            : "no replica applied the step") +
            ": restore a checkpoint to go on, or train with on_nonfinite = skip_step");
  } else {
    replica.finish_step(update);
    const std::span<const T> parameters(update.parameters);
    if (const std::size_t first = D::first_nonfinite(place, parameters);
        first != parameters.size()) {
      finish_together(replica);
      throw NumericError(NumericError::Where::kParameters, update.step, first,
                         std::string("fit stopped (on_nonfinite = raise): under ") +
                             std::string(S::kName) +
                             " the servers apply the reduced gradient, so the worker checks the "
                             "parameters it receives; restore a checkpoint to go on");
    }
    return false;
  }
}

}  // namespace cohort::trainer
