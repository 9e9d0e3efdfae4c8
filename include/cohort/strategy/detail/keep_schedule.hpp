// How often an elastic job's worker keeps its own copy of the whole state (kept_stripes.hpp: over
// TCP and by host, where the optimizer state is gathered and copied). Kept every
// KeptStripes::kEvery steps, the copy took 2.7% of the step time of the examples' MLP sharing its
// update over TCP, and 3.6% for a model of 20M parameters (docs/benchmarks.md, "Elastic jobs"),
// where a job without failures should lose at most kShare. So the workers time the copy and their
// steps, and keep as often as kShare of the step time allows, at most once every kEvery steps: the
// interval a checkpoint takes under CheckFreq's rule (the snapshot's cost bounded as a share of the
// step, measured as the job runs). A loss then computes again at most the interval's steps since
// the newest copy, about 1/kShare copies' time: for that model, every 67 steps of 0.24 s. The
// stripes kept through shared memory cost 0.9% every kEvery steps, and keep that interval.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <optional>
#include <span>

#include "cohort/core/reduce_op.hpp"
#include "cohort/strategy/detail/kept_stripes.hpp"

namespace cohort::strategy::detail {

// The interval, in steps, at which a copy of `keep_seconds` costs at most `share` of steps of
// `step_seconds`, and at least `fewest`.
inline std::uint64_t keep_interval(double keep_seconds, double step_seconds, double share,
                                   std::uint64_t fewest) {
  constexpr double kMost = 1e9;  // steps: a copy that costs no more than the steps never bounds it
  const double steps = step_seconds > 0.0 ? std::ceil(keep_seconds / (share * step_seconds)) : 0.0;
  return std::max(fewest, static_cast<std::uint64_t>(std::min(steps, kMost)));
}

// One replica's schedule of its own copies in a segment (a replica lives for one segment, so the
// interval is agreed again in each).
class KeepSchedule {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr double kShare = 0.01;
  // The steps timed before the interval is agreed: the first steps of a segment vary most.
  static constexpr std::uint64_t kTimedSteps = 8;

  // Each step's end, before its copy.
  void step_finished(Clock::time_point now) {
    if (first_)
      ++timed_;
    else
      first_ = now;
    last_ = now;
  }

  // Whether the state after `steps` steps is kept: every kEvery steps until the interval is
  // agreed, then the interval after the copy that agreed it, and after each since.
  bool keeps(std::uint64_t steps) const {
    return agreed_ ? steps >= next_ : steps % KeptStripes::kEvery == 0;
  }

  // The copy of the state after `steps` steps took `seconds`. The first copy after kTimedSteps
  // steps sets the interval, the longest any worker needs: a collective over `communicator` (every
  // worker has timed as many steps of the segment, so all of them call it at the same copy).
  template <class Communicator>
  void kept(std::uint64_t steps, double seconds, Communicator& communicator) {
    if (!agreed_ && timed_ >= kTimedSteps) {
      const double step_seconds =
          std::chrono::duration<double>(last_ - *first_).count() / static_cast<double>(timed_);
      std::int64_t every[] = {static_cast<std::int64_t>(
          keep_interval(seconds, step_seconds, kShare, KeptStripes::kEvery))};
      communicator.all_reduce(std::span<std::int64_t>(every), ReduceOp::kMax);
      every_ = static_cast<std::uint64_t>(every[0]);
      agreed_ = true;
    }
    next_ = steps + every_;
  }

  std::uint64_t every() const { return every_; }

 private:
  std::uint64_t every_ = KeptStripes::kEvery;
  bool agreed_ = false;
  std::uint64_t next_ = 0;                    // the next copy's steps, once agreed
  std::optional<Clock::time_point> first_{};  // the segment's first step's end
  Clock::time_point last_{};
  std::uint64_t timed_ = 0;  // steps ended since first_
};

}  // namespace cohort::strategy::detail
