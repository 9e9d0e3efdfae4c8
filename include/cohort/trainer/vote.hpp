// trainer::Vote: what the job decides together while it trains, without a message of its own
// between steps: whether to stop for preemption, and whether a checkpoint is due by time.
//
// Preemption. With Options::preemption.enabled (the default) SIGTERM and SIGUSR1 are latched
// (core/preemption.hpp), and before the first step of a fit, then about every 0.1 s or 256 steps,
// whichever comes first (a number of steps computed alike everywhere from the slowest step time,
// at most doubling from one vote to the next), every replica of every process votes
// in one all-reduce whether any process was signalled (a parameter-server worker also counts its
// servers' marked answers: strategy::ReportsStop). All stop at the same step, within about 0.1 s
// plus a step of the signal; a signal between two fits stops the next before its first step.
// Every process then saves (trainer/periodic_checkpoints.hpp: to preemption.checkpoint, else into
// the checkpoint directory), and fit returns with Report::preempted: the program should exit with
// kExitPreempted (75), and the same command continues the run bit for bit. A process still alive
// preemption.grace (20 s) after the signal is ended with 128 + the signal.
//
// Checkpoints by time (Options::checkpoint.every): the same vote carries whether any process has
// gone that long without a checkpoint (its first replica's word), so that every process
// checkpoints after the same step.
//
// Growth (strategy::Grows): the same vote carries how many processes wait at the chief's door
// to join an elastic job (strategy/elastic.hpp), so that every process takes them in at the same
// step boundary.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>

#include "cohort/core/preemption.hpp"
#include "cohort/core/reduce_op.hpp"
#include "cohort/strategy/strategy.hpp"
#include "cohort/trainer/agreement.hpp"

namespace cohort::trainer {

enum class Decision {
  kGoOn,
  kCheckpoint,  // a checkpoint by time is due: taken here (trainer/periodic_checkpoints.hpp)
  kStop,        // preemption: the fit ends here
  kAdmit,       // processes wait to join: taken in here (admitted(); trainer/elastic.hpp)
};

class Vote {
 public:
  // Votes come about this often, so that the job stops within about this time of a signal and a
  // vote (one all-reduce of three numbers, some microseconds between processes) costs a small
  // model's fast steps nothing measurable.
  static constexpr double kInterval = 0.1;  // seconds

  // A fit that begins at `first_step` votes before it.
  explicit Vote(std::uint64_t first_step)
      : next_(first_step), last_(first_step), last_time_(Clock::now()) {}

  // Before step `step`, on every replica: what the job does here. Where a vote is due, one
  // all-reduce (max) of whether any process was asked to stop, whether a checkpoint is
  // `checkpoint_due` on any, the slowest step time since the last vote, and the `joiners` the
  // chief takes in, so that every replica of every process decides the same way and schedules
  // the same next vote.
  template <class S, class Replica, class D>
  Decision before(std::uint64_t step, bool checkpoint_due, std::size_t joiners, Replica& replica,
                  Agreement<D>& agreement) {
    if (step != next_) return Decision::kGoOn;
    const auto now = Clock::now();
    const double step_seconds = step == last_
                                    ? 0.0
                                    : std::chrono::duration<double>(now - last_time_).count() /
                                          static_cast<double>(step - last_);
    bool asked = preemption::requested() != 0;
    if constexpr (strategy::ReportsStop<S>) asked = asked || replica.stop_requested();
    double values[4] = {asked ? 1.0 : 0.0, checkpoint_due ? 1.0 : 0.0, step_seconds,
                        static_cast<double>(joiners)};
    agreement.all_reduce(replica.communicator(), values, ReduceOp::kMax);
    if (values[0] != 0.0) return Decision::kStop;
    next_ = step + steps_between_votes(values[2], std::max<std::uint64_t>(step - last_, 1));
    last_ = step;
    last_time_ = now;
    admitted_ = static_cast<std::size_t>(values[3]);
    if (admitted_ != 0) return Decision::kAdmit;
    return values[1] != 0.0 ? Decision::kCheckpoint : Decision::kGoOn;
  }

  // After Decision::kAdmit: how many processes the job takes in.
  std::size_t admitted() const { return admitted_; }

  // At most this many steps between two votes, whatever they cost: a job of steps of some
  // microseconds (a small model in threads) votes more often than kInterval, at one all-reduce of
  // four numbers per kMostSteps steps.
  static constexpr std::uint64_t kMostSteps = 256;

  // Steps until the next vote: kInterval's worth at the given step time, at least 1, at most
  // twice `last` (the steps between the last two votes) and kMostSteps. A step time measured over
  // a few fast steps (the first, or before the machine got busy) cannot put the next vote far out:
  // a fit of 3,000 steps of 13 us once scheduled its next vote past its end from its first step,
  // and a signal at step 100 went unheard (tests/strategy/preemption_test.cpp, beside busy loops).
  static std::uint64_t steps_between_votes(double step_seconds, std::uint64_t last) {
    const double most = static_cast<double>(std::min(2 * last, kMostSteps));
    if (!(step_seconds > 0.0)) return 1;
    return static_cast<std::uint64_t>(std::clamp(kInterval / step_seconds, 1.0, most));
  }

 private:
  using Clock = std::chrono::steady_clock;
  std::uint64_t next_;
  std::uint64_t last_;
  Clock::time_point last_time_;
  std::size_t admitted_ = 0;
};

}  // namespace cohort::trainer
