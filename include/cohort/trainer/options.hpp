// What a user hands the Trainer and what a fit hands back: Trainer::Options (TrainerOptions),
// Until and Report.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "cohort/core/error.hpp"
#include "cohort/core/preemption.hpp"
#include "cohort/optimizer/schedule.hpp"
#include "cohort/strategy/elastic.hpp"
#include "cohort/trainer/progress.hpp"

namespace cohort {

// Trainer::Options.
//   global_batch   examples per step, over all replicas (>= micro_batches)
//   micro_batches  pieces of each global batch; the unit of work and of the reduction tree (one
//                  that does not divide global_batch makes pieces that differ by one example:
//                  core/sharding.hpp)
//   seed           defines every epoch's example order
//   log_every      steps between progress lines on the chief (0: only at the end of epochs and
//                  of the fit)
//   progress       Progress::kAuto, kLines or kSilent
//   trace          a directory for this process's timeline (Chrome trace JSON, core/trace.hpp),
//                  written at the end of every fit, also of a failed one; or COHORT_TRACE
//   on_nonfinite   what a step whose reduced gradient holds an infinity or NaN does:
//                  NonFinite::kRaise (the default) or NonFinite::kSkipStep
//                  (trainer/nonfinite.hpp)
//   preemption     what SIGTERM and SIGUSR1 do while the Trainer lives
//                  (trainer/vote.hpp): enabled, the checkpoint to save to, the grace
//                  period (core/preemption.hpp)
//   schedule       the learning rate's factor at each step (optimizer/schedule.hpp): warm-up,
//                  then cosine, linear or step decay, or any function of the step
//   checkpoint     checkpoints during a fit: a directory, every N steps or T seconds, the newest
//                  K kept, resume (trainer/periodic_checkpoints.hpp)
//   metrics        a file where the chief writes one JSON line per progress line and per
//                  evaluation (trainer/metrics_log.hpp); or COHORT_METRICS

// Options::checkpoint. Every field but `directory` needs one.
struct CheckpointPolicy {
  std::filesystem::path directory{};  // empty: no checkpoint during a fit
  std::uint64_t every_steps = 0;      // 0: not by steps
  std::chrono::seconds every{0};      // 0: not by time; else agreed by the job's vote
  std::size_t keep = 3;               // the newest kept (0: all)
  bool resume = false;                // the first fit goes on from the newest in `directory`
};

struct TrainerOptions {
  std::size_t global_batch = 256;
  std::size_t micro_batches = 8;
  std::uint64_t seed = 0;
  std::uint64_t log_every = 100;
  Progress progress = Progress::kAuto;
  // A directory: each process writes its timeline there as a Chrome trace at the end of every
  // fit (core/trace.hpp). Empty: COHORT_TRACE, if set; else no timeline, at no cost.
  std::filesystem::path trace{};
  // What a step whose reduced gradient holds an infinity or NaN does: NonFinite::kRaise (fit
  // throws NumericError) or NonFinite::kSkipStep (every replica skips the update).
  NonFinite on_nonfinite = NonFinite::kRaise;
  // SIGTERM and SIGUSR1: the job stops at a step its processes agree on and saves to
  // preemption.checkpoint (core/preemption.hpp).
  Preemption preemption{};
  // The learning rate at step s is the optimizer's learning_rate times schedule.factor(s); part of
  // the job's settings and of its checkpoints. Default: constant.
  optimizer::Schedule schedule{};
  // Checkpoints during a fit into a directory, and resuming from the newest there.
  CheckpointPolicy checkpoint{};
  // The chief's metrics log (JSON lines). Empty: COHORT_METRICS, if set; else none.
  std::filesystem::path metrics{};
};

// One evaluation on held-out data (trainer/validation.hpp): after `step` steps of the run, each
// of the model's sums (evaluate, core/model.hpp) over the held-out set's size.
struct Evaluation {
  std::uint64_t step = 0;
  std::vector<std::pair<std::string, double>> means;

  // The mean of that name (ConfigError naming the names there are, for another).
  double mean(std::string_view name) const {
    std::string names;
    for (const auto& [known, value] : means) {
      if (known == name) return value;
      names += (names.empty() ? "" : ", ") + known;
    }
    throw ConfigError("Evaluation::mean: no sum is named \"" + std::string(name) +
                      "\"; the model's evaluate gives " + names);
  }
};

// Absolute targets: both count from the beginning of the run, so the same `until` after a restore
// finishes where an uninterrupted run would. 0 means "not given".
struct Until {
  std::uint64_t epochs = 0;
  std::uint64_t steps = 0;
};

// What one fit did, as this process saw it. The losses are reduced over every replica once per
// progress window, but only the chief process (strategy().is_chief(): the one that prints progress)
// keeps them: on every other process `loss` is EMPTY and `times` zero. Read them on the chief, as
// the examples do. A parameter server's fit (it trains no replica) reports only `seconds`.
struct Report {
  std::uint64_t steps = 0;   // steps this fit took
  std::vector<double> loss;  // chief only: mean loss per example of each of those steps
  double seconds = 0.0;      // wall time of the fit
  StepTimes times;           // chief only: of the chief's first replica
  // Training examples per second: over the fit's wall time less its evaluations on held-out data.
  double examples_per_second = 0.0;
  // Steps of this fit whose reduced gradient held an infinity or NaN and that every replica
  // skipped (Options::on_nonfinite = NonFinite::kSkipStep), on every worker process. They count
  // in `steps`; their loss is in `loss` as computed (NaN, typically).
  std::uint64_t skipped_steps = 0;
  // The job stopped for preemption (core/preemption.hpp) before the fit's target, on every
  // process alike, after the save to Options::preemption.checkpoint when one is given. The
  // program should end now, with kExitPreempted.
  bool preempted = false;
  // The evaluations on held-out data of this fit (cohort::validation), on every process, and the
  // wall time they took (this process's first replica's).
  std::vector<Evaluation> validation;
  double validation_seconds = 0.0;
  // Checkpoints taken during this fit (Options::checkpoint), and the wall time the fit stood
  // still for them on this process: each segment's end and the next one's start, the copy of the
  // state to the host, and the wait for the previous background write.
  std::uint64_t checkpoints = 0;
  double checkpoint_seconds = 0.0;
  // The fit stopped before its target because a ValidationOptions::stop said so.
  bool stopped_early = false;
  // Each time an elastic job (strategy/elastic.hpp) went on without a lost worker during this
  // fit, on every process that went on. The steps whose losses were lost with the worker (since
  // the last progress line) are not in `loss`, nor are those before this process became the
  // chief.
  std::vector<strategy::MembershipChange> membership;
};

}  // namespace cohort
