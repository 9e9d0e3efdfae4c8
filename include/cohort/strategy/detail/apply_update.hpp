// The update of a step on its reduced gradient sum, shared by every path of MirroredReplica
// (mirrored_replica.hpp): the checks and clipping that every replica decides alike, then the
// optimizer applied to the whole, or to the part a replica owns in a sharded update (step_run,
// least_over_processes).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>

#include "cohort/core/reduce_op.hpp"
#include "cohort/core/trace.hpp"
#include "cohort/device/cpu.hpp"
#include "cohort/device/device.hpp"
#include "cohort/optimizer/optimizer.hpp"
#include "cohort/strategy/strategy.hpp"

namespace cohort::strategy::detail {

// Clipping, the non-finite check and the optimizer step on a reduced gradient sum, at the
// replica's place. Every replica holds the same reduced gradient, so every replica decides the
// same way without a word to the others. The check rides on a pass that reads the gradient anyway:
//   clipping        the sum of squares, finite when every element is (for float, half and
//                   bfloat16 always; a double gradient whose squares overflow is looked into);
//                   nothing is applied to a non-finite gradient, under either policy
//   kRaise          the optimizer's update (D::step_finite), which is applied; the Trainer throws
//   kSkipStep       one read of the gradient before the update (D::first_nonfinite): the only
//                   case with a pass of its own, as the decision must precede every write
// apply(context, checked) applies the update with `context` and returns the gradient's first
// non-finite element, or its size where it has none or `checked` says it was checked before: the
// whole update (MirroredReplica::finish_step), or this worker's part of it (the sharded update).
// checks.sum_of_squares() and checks.first_nonfinite() read the reduced gradient as every
// replica agrees: its sum of squares, and its first non-finite element (or its size). Where every
// replica holds the whole gradient, passes over it (WholeChecks); where each holds only its own
// part of the sum (the sharded update over TCP), passes over that part and a few collectives.
// Out of line on purpose, as the Trainer's fold addition (trainer/step_fold.hpp, AddInto): inlined
// into the step's loop it changes how GCC compiles the model's forward_backward inlined there. Hot,
// because out of line GCC guesses its frequency from the one call in the replica's loop, which
// follows the model's loops: guessed never executed, it was compiled for size, the optimizer's loop
// scalar, and Adam took 5.5 ms of an 11 ms step of the examples' MLP (1.4 ms vectorized;
// docs/benchmarks.md, "The examples' Eigen MLP").
template <device::Device D, class T, class O, class Apply, class Checks>
[[gnu::noinline, gnu::hot]] StepResult apply_update(const Update<T, O>& update, Apply&& apply,
                                                    const Checks& checks) {
  const trace::Span span(trace::current(), trace::Phase::kOptimizer, {.step = update.step});
  const std::span<const T> gradient(update.gradient_sum);
  double scale = update.inverse_batch;
  bool checked = false;
  if (const double max_norm = update.optimizer.options().max_gradient_norm; max_norm > 0.0) {
    const double squares = checks.sum_of_squares();
    if (!std::isfinite(squares)) {
      if (const std::size_t first = checks.first_nonfinite(); first != gradient.size()) {
        return {.first_nonfinite = first, .applied = false};
      }
    }
    checked = true;
    scale *= optimizer::clipping_factor(squares, update.inverse_batch, max_norm);
  } else if (update.on_nonfinite == NonFinite::kSkipStep) {
    if (const std::size_t first = checks.first_nonfinite(); first != gradient.size()) {
      return {.first_nonfinite = first, .applied = false};
    }
    checked = true;
  }
  const optimizer::StepContext context{.step = update.step + 1,
                                       .gradient_scale = scale,
                                       .learning_rate_factor = update.learning_rate_factor};
  const std::size_t first = apply(context, checked);
  if (first == gradient.size()) return {};
  return {.first_nonfinite = first, .applied = true};
}

// apply_update's checks where every replica holds the whole reduced gradient.
template <device::Device D, class T>
struct WholeChecks {
  const typename D::Place& place;
  std::span<const T> gradient;
  double sum_of_squares() const { return D::sum_of_squares(place, gradient); }
  std::size_t first_nonfinite() const { return D::first_nonfinite(place, gradient); }
};

// The optimizer's update of the run [begin, begin + count) of the parameters and state (this
// process's part of a sharded update). Where the gradient was not checked before and the run's
// is not finite, `first` becomes the least of it and the run's first non-finite element.
template <class T, class O>
void step_run(Update<T, O>& update, const optimizer::StepContext& context, bool checked,
              std::size_t begin, std::size_t count, std::size_t& first) {
  const std::span<const T> part = std::span<const T>(update.gradient_sum).subspan(begin, count);
  const bool finite =
      device::cpu::step_part(update.optimizer, update.parameters.subspan(begin, count), part,
                             update.optimizer_state, begin, context);
  if (!checked && !finite) first = std::min(first, begin + device::cpu::first_nonfinite(part));
}

// The least over every process of `communicator` of the first non-finite element each holds
// (`mine`, or the gradient's size where it holds none) of its part: the whole gradient's. A
// collective.
template <class Communicator>
std::size_t least_over_processes(Communicator& communicator, std::size_t mine) {
  std::int64_t first[] = {static_cast<std::int64_t>(mine)};
  communicator.all_reduce(std::span<std::int64_t>(first), ReduceOp::kMin);
  return static_cast<std::size_t>(first[0]);
}

}  // namespace cohort::strategy::detail
