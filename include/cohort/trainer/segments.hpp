// trainer::fit_segments: a fit as the replicas run it, segment by segment
// (trainer/periodic_checkpoints.hpp: one segment between two checkpoints, the whole fit without
// them). Each segment runs every local replica's ReplicaLoop on the strategy's threads; between
// two, the checkpoint; after a preemption, its save; after a lost worker of an elastic job, the
// regroup (trainer/elastic.hpp), and the fit goes on. The Report sums the segments.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "cohort/core/error.hpp"
#include "cohort/core/sharding.hpp"
#include "cohort/strategy/strategy.hpp"
#include "cohort/trainer/elastic.hpp"
#include "cohort/trainer/metrics_log.hpp"
#include "cohort/trainer/options.hpp"
#include "cohort/trainer/periodic_checkpoints.hpp"
#include "cohort/trainer/replica_loop.hpp"
#include "cohort/trainer/validation.hpp"

namespace cohort::trainer {

// Each local replica's state across the segments of a fit that began at first_step and goes on
// from run.step.
template <class R>
std::vector<ReplicaCarry> carries_for(const R& run, const sharding::Plan& plan,
                                      std::uint64_t first_step) {
  std::vector<ReplicaCarry> carries;
  for (std::size_t local = 0; local < run.strategy.local_replicas(); ++local) {
    // The chief's first replica keeps the Report and prints.
    const bool reports = local == 0 && run.strategy.is_chief();
    carries.push_back({.window = LossWindow(reports, run.options.progress, plan.steps_per_epoch(),
                                            run.options.global_batch),
                       .vote = Vote(run.step),
                       .first_step = first_step,
                       .applied = run.step});
  }
  return carries;
}

// The fit from run.step to `target` (run.step advances with it). `metrics`: the chief's log, which
// a worker that becomes the chief opens.
template <class R, class D, class V>
Report fit_segments(R& run, PeriodicCheckpoints<R>& checkpoints,
                    std::unique_ptr<MetricsLog>& metrics, const D& data,
                    const Validation<V>* validation, sharding::Plan plan, std::uint64_t target) {
  using Clock = std::chrono::steady_clock;
  const auto seconds_since = [](Clock::time_point start) {
    return std::chrono::duration<double>(Clock::now() - start).count();
  };
  Report report;
  const auto start = Clock::now();
  const std::uint64_t first_step = run.step;
  std::vector<ReplicaCarry> carries = carries_for(run, plan, first_step);
  // After an elastic job's membership changed: the fit goes on over the new replicas.
  const auto go_on_as = [&](strategy::MembershipChange change) {
    report.membership.push_back(std::move(change));
    if (!metrics && run.strategy.is_chief()) metrics = open_metrics_log(run.options, true);
    report.steps = run.step - first_step;
    plan = run.plan(data.size());
    std::vector<ReplicaCarry> next = carries_for(run, plan, first_step);
    for (std::size_t local = 0; local < next.size(); ++local) {
      next[local].window.continue_fit(carries[local].window);
    }
    carries = std::move(next);
  };
  for (SegmentEnd end = SegmentEnd::kCheckpoint;
       end == SegmentEnd::kCheckpoint || end == SegmentEnd::kAdmit;) {
    const std::uint64_t segment_end = checkpoints.segment_end(run.step, target);
    checkpoints.prepare(run);
    try {
      run.strategy.run([&](auto& replica) {
        const std::size_t local = replica.index() - run.strategy.first_local_replica();
        const SegmentEnd ended =
            ReplicaLoop(run, replica, data, validation, plan, carries[local], checkpoints,
                        metrics.get(), segment_end, target, report)
                .run();
        if (local == 0) end = ended;  // every replica's segment ends alike
      });
    } catch (const CommError& cause) {
      if constexpr (strategy::Regroups<typename R::Strategy>) {
        if (run.strategy.elastic().enabled()) {
          go_on_as(go_on_without(run, cause, carries[0].applied, checkpoints));
          continue;
        }
      }
      throw;
    }
    run.step = first_step + report.steps;
    if constexpr (strategy::Grows<typename R::Strategy>) {
      if (end == SegmentEnd::kAdmit) {
        go_on_as(take_in(run, carries[0].vote.admitted(), checkpoints));
        continue;
      }
    }
    if (end == SegmentEnd::kPreempted) {
      checkpoints.save_preempted(run);
    } else if (checkpoints.enabled()) {
      const auto stop = Clock::now();
      report.checkpoints += checkpoints.save(run) ? 1 : 0;
      report.checkpoint_seconds += seconds_since(stop);
    }
  }
  const auto last_write = Clock::now();
  checkpoints.wait();
  report.checkpoint_seconds += seconds_since(last_write);
  report.seconds = seconds_since(start);
  report.examples_per_second = static_cast<double>(report.steps * run.options.global_batch) /
                               (report.seconds - report.validation_seconds);
  return report;
}

}  // namespace cohort::trainer
