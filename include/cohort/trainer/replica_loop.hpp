// trainer::ReplicaLoop: one local replica's part of a segment of a fit (the steps between two
// checkpoints, trainer/periodic_checkpoints.hpp; the whole fit without them), on the thread the
// strategy runs it on. Every replica of every process runs the same loop: the settings check (at
// the fit's first segment), the start from the chief's state, then for each step the job's vote
// when due (trainer/vote.hpp), its micro-batches (core/sharding.hpp), the fold
// (trainer/step_fold.hpp) and the strategy's three calls (strategy/strategy.hpp), and the loss
// window (trainer/loss_window.hpp), and the evaluation on held-out data when due
// (trainer/validation.hpp); at the end the strategy's finish, and at the fit's end its summary.
#pragma once

#include <chrono>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "cohort/core/micro_batch.hpp"
#include "cohort/core/model.hpp"
#include "cohort/core/reduce_op.hpp"
#include "cohort/core/sharding.hpp"
#include "cohort/core/trace.hpp"
#include "cohort/strategy/strategy.hpp"
#include "cohort/trainer/agreement.hpp"
#include "cohort/trainer/job_settings.hpp"
#include "cohort/trainer/loss_window.hpp"
#include "cohort/trainer/metrics_log.hpp"
#include "cohort/trainer/nonfinite.hpp"
#include "cohort/trainer/periodic_checkpoints.hpp"
#include "cohort/trainer/progress.hpp"
#include "cohort/trainer/run.hpp"
#include "cohort/trainer/step_fold.hpp"
#include "cohort/trainer/validation.hpp"
#include "cohort/trainer/vote.hpp"

namespace cohort::trainer {

// How a segment ended.
enum class SegmentEnd {
  kTarget,      // the fit's target
  kCheckpoint,  // a checkpoint is due: the fit goes on after it
  kPreempted,   // the job agreed to stop
  kStopped,     // a validation's stop said so (early stopping)
  kAdmit,       // processes join the job here (trainer/elastic.hpp): the fit goes on after it
};

// What a replica's fit carries from one segment to the next.
struct ReplicaCarry {
  LossWindow window;
  Vote vote;
  std::uint64_t first_step;  // the fit's
  bool settings_checked = false;
  std::vector<std::size_t> order{};  // the example order of epoch order_epoch
  std::uint64_t order_epoch = std::numeric_limits<std::uint64_t>::max();
  // The run's steps this replica's state holds: where an elastic job that lost a worker takes the
  // newest state from (trainer/elastic.hpp).
  std::uint64_t applied = 0;
};

template <class R, class Replica, class D, class V = NoValidation>
class ReplicaLoop {
  using M = typename R::Model;
  using S = typename R::Strategy;
  using O = typename R::Optimizer;
  using T = typename R::value_type;
  using Device = typename R::Device;
  using Clock = std::chrono::steady_clock;

 public:
  // Steps from run.step up to segment_end (exclusive) of a fit to `target`; `report` is shared by
  // the process's replicas. `validation`: none for NoValidation; `metrics`: the chief's log.
  ReplicaLoop(R& run, Replica& replica, const D& data, const Validation<V>* validation,
              const sharding::Plan& plan, ReplicaCarry& carry, PeriodicCheckpoints<R>& checkpoints,
              MetricsLog* metrics, std::uint64_t segment_end, std::uint64_t target, Report& report)
      : run_(run),
        replica_(replica),
        data_(data),
        plan_(plan),
        carry_(carry),
        checkpoints_(checkpoints),
        metrics_(metrics),
        validation_(validation),
        segment_end_(segment_end),
        target_(target),
        report_(report),
        local_(replica.index() - run.strategy.first_local_replica()),
        place_(run.place(local_)),
        parameters_(ModelTraits<M>::parameters(run.models[local_])),
        optimizer_state_(run.optimizer_states[local_].span()),
        reports_(replica.index() == 0 && run.strategy.is_chief()),
        agreement_(place_),
        fold_(run.models[local_], place_, strategy::gradient_sum_of(run.strategy)) {
    if constexpr (kValidates) {
      evaluator_.emplace(validation->data, run.options.global_batch, run.options.micro_batches,
                         plan.deal().first(replica.index()), plan.deal().count(replica.index()));
    }
  }

  SegmentEnd run() {
    // Before anything travels: a worker lost in the segment's first collectives leaves this
    // replica with the state of run_.step, which is what an elastic job then agrees on.
    carry_.applied = run_.step;
    if (run_.recorder) run_.recorder->name_thread("replica " + std::to_string(replica_.index()));
    // Checked before anything else travels (the parameters' broadcast has their count in it).
    if constexpr (strategy::SpansProcesses<S>) {
      require_same_settings(run_, replica_, agreement_, !carry_.settings_checked);
    }
    carry_.settings_checked = true;
    // Every replica starts from the chief's state (replicas of other processes included).
    replica_.start(parameters_, optimizer_state_, run_.step);
    std::span<T> sum_storage;
    if constexpr (strategy::LendsGradientStorage<S, T>) {
      sum_storage = replica_.template gradient_sum_storage<T>(parameters_.size());
    }
    fold_.lend_sum_storage(sum_storage, plan_.deal().count(replica_.index()));
    const bool votes =
        run_.options.preemption.enabled || run_.options.checkpoint.every.count() != 0 || grows();
    SegmentEnd end = segment_end_ == target_ ? SegmentEnd::kTarget : SegmentEnd::kCheckpoint;
    std::uint64_t step = run_.step;
    for (; step < segment_end_; ++step) {
      const Decision decision =
          votes ? carry_.vote.template before<S>(step, local_ == 0 && checkpoints_.due_by_time(),
                                                 joiners_waiting(), replica_, agreement_)
                : Decision::kGoOn;
      if (decision == Decision::kAdmit) {
        if (!carry_.window.empty()) close_window(step - 1, false);
        end = SegmentEnd::kAdmit;
        break;
      }
      const bool checkpoint = step > run_.step && (decision == Decision::kCheckpoint ||
                                                   checkpoints_.due_by_steps(step));
      if (decision == Decision::kStop || (checkpoint && !kBetweenSteps)) {
        if (!carry_.window.empty()) close_window(step - 1, false);
        end = decision == Decision::kStop ? SegmentEnd::kPreempted : SegmentEnd::kCheckpoint;
        break;
      }
      if (checkpoint) checkpoint_between_steps(step);
      train_step(step);
      carry_.applied = step + 1;
      const std::size_t step_in_epoch = step % plan_.steps_per_epoch();
      const bool periodic =
          run_.options.log_every != 0 && (step_in_epoch + 1) % run_.options.log_every == 0;
      const bool epoch_end = step_in_epoch + 1 == plan_.steps_per_epoch();
      // The fit's last step has a line of its own, as an epoch's last does.
      const bool fit_end = step + 1 == target_;
      if (periodic || epoch_end || step + 1 == segment_end_) {
        close_window(step, periodic || fit_end);
      }
      if constexpr (kValidates) {
        const std::uint64_t every = validation_->options.every_steps;
        if (((every == 0 && epoch_end) || (every != 0 && (step + 1) % every == 0) ||
             step + 1 == target_) &&
            validate(step + 1)) {
          // The steps since the last progress line are reported before the fit ends here.
          if (!carry_.window.empty()) close_window(step, false);
          ++step;
          end = SegmentEnd::kStopped;
          break;
        }
      }
    }
    const bool fit_ends = end != SegmentEnd::kCheckpoint && end != SegmentEnd::kAdmit;
    if (local_ == 0) {
      report_.steps += step - run_.step;
      report_.preempted = end == SegmentEnd::kPreempted;
      report_.stopped_early = end == SegmentEnd::kStopped;
    }
    if (fit_ends && step > carry_.first_step) summarize(step - carry_.first_step);
    // Every replica ends the segment as it ends a fit (a parameter server brings the optimizer
    // state home; a sharded update gathers it).
    replica_.finish(parameters_, optimizer_state_,
                    end == SegmentEnd::kPreempted ? strategy::FitEnd::kPreempted
                    : end == SegmentEnd::kAdmit   ? strategy::FitEnd::kAdmit
                    : fit_ends                    ? strategy::FitEnd::kReached
                                                  : strategy::FitEnd::kCheckpoint);
    return end;
  }

 private:
  static constexpr bool kValidates = !std::same_as<V, NoValidation>;

  // Whether processes may join this fit, or take a lost worker's place back (an elastic job:
  // strategy::Grows, strategy::TakesWorkersBack), which the votes make room for.
  bool grows() const {
    if constexpr (strategy::Grows<S> || strategy::TakesWorkersBack<S>) {
      return run_.strategy.elastic().enabled();
    }
    return false;
  }

  // The processes the chief takes in at this vote, 0 elsewhere; asked before every step, so that
  // the door's handshakes move between votes. A job that takes workers back takes nobody in at a
  // vote: its chief answers its door here.
  std::size_t joiners_waiting() {
    if (local_ != 0 || !run_.strategy.is_chief()) return 0;
    if constexpr (strategy::Grows<S>) return run_.strategy.joiners_waiting();
    if constexpr (strategy::TakesWorkersBack<S>) run_.strategy.tend_door();
    return 0;
  }
  static constexpr bool kBetweenSteps = PeriodicCheckpoints<R>::kBetweenSteps;

  // A checkpoint after `step` steps, taken between two steps without ending the segment
  // (strategy::SnapshotsBetweenSteps): every replica makes its state whole and takes its share of
  // it (the chief's replicas copy theirs, and the last writes it in the background).
  void checkpoint_between_steps(std::uint64_t step) {
    if constexpr (kBetweenSteps) {
      const auto start = Clock::now();
      const trace::Span span(run_.recorder.get(), trace::Phase::kCheckpoint, {.step = step});
      replica_.make_state_whole(optimizer_state_);
      if (checkpoints_.snapshot(run_, step, local_, run_.models.size()) && local_ == 0) {
        ++report_.checkpoints;
        report_.checkpoint_seconds += std::chrono::duration<double>(Clock::now() - start).count();
      }
    }
  }

  // One step: the micro-batches, the fold, the strategy's synchronization and update. A step that
  // an exception ends releases the other replicas and waits until no collective uses its buffers
  // (strategy::AbandonsStep) while they, the fold's, still live.
  void train_step(std::uint64_t step) {
    const auto compute_start = Clock::now();
    const trace::Span span(run_.recorder.get(), trace::Phase::kStep, {.step = step});
    fold_.reset();
    Clock::time_point synchronization_start;
    try {
      strategy::Update<T, O> update{
          .parameters = parameters_,
          .gradient_sum = {},
          .optimizer = run_.optimizer,
          .optimizer_state = optimizer_state_,
          .step = step,
          .inverse_batch = 1.0 / static_cast<double>(run_.options.global_batch),
          .learning_rate_factor = run_.options.schedule.factor(step),
          .on_nonfinite = run_.options.on_nonfinite};
      compute(update);
      synchronization_start = Clock::now();
      if (finish_and_check<S, Device>(replica_, update, place_) && local_ == 0) {
        ++report_.skipped_steps;
      }
    } catch (...) {
      // A process that fails on its own leaves an elastic job: it stops listening before the
      // abandoned step tells the others, so that the workers that regroup do not count it in.
      if constexpr (strategy::Regroups<S>) {
        if (!is_comm_error(std::current_exception())) run_.strategy.withdraw();
      }
      if constexpr (strategy::AbandonsStep<S>) {
        replica_.abandon_step(what_of(std::current_exception()));
      }
      throw;
    }
    const auto step_end = Clock::now();
    carry_.window.add(
        fold_.loss(),
        {.compute = std::chrono::duration<double>(synchronization_start - compute_start).count(),
         .communication = std::chrono::duration<double>(step_end - synchronization_start).count()});
  }

  // This replica's whole micro-batches of the step, folded and handed to the replica.
  void compute(strategy::Update<T, O>& update) {
    const std::uint64_t epoch = update.step / plan_.steps_per_epoch();
    const std::size_t step_in_epoch = update.step % plan_.steps_per_epoch();
    if (epoch != carry_.order_epoch) {
      carry_.order = plan_.epoch_order(run_.options.seed, epoch);
      carry_.order_epoch = epoch;
    }
    const std::size_t first = plan_.deal().first(replica_.index());
    const std::size_t end = first + plan_.deal().count(replica_.index());
    for (std::size_t micro = first; micro < end; ++micro) {
      const sharding::Range range = plan_.micro_batch(step_in_epoch, micro);
      indices_.assign(carry_.order.begin() + range.begin, carry_.order.begin() + range.end);
      const trace::Span span(run_.recorder.get(), trace::Phase::kForwardBackward,
                             {.step = update.step, .index = micro});
      // Which micro-batch this is, for a model that draws random numbers from it.
      const MicroBatchScope micro_batch(
          MicroBatch{.seed = run_.options.seed, .step = update.step, .index = micro});
      if constexpr (ReportsReadiness<M>) {
        if (micro + 1 == end) {
          fold_.add_last_with_readiness(data_.batch(indices_), replica_, update);
          return;
        }
      }
      fold_.add(data_.batch(indices_));
    }
    fold_.hand_over(replica_, update);
  }

  void close_window(std::uint64_t last_step, bool periodic) {
    const double learning_rate =
        run_.optimizer.options().learning_rate * run_.options.schedule.factor(last_step);
    carry_.window.close(last_step, periodic, learning_rate, replica_.communicator(), agreement_,
                        run_.recorder.get(), metrics_, report_);
  }

  // The evaluation after `steps` steps, kept in the Report and the metrics log; whether the fit
  // stops here, as every replica of every process agrees (ValidationOptions::stop).
  bool validate(std::uint64_t steps) {
    const trace::Span span(run_.recorder.get(), trace::Phase::kValidation, {.step = steps - 1});
    const auto start = Clock::now();
    Evaluation evaluation =
        evaluator_->evaluate(run_.models[local_], steps, replica_.communicator(), agreement_);
    double stop = 0.0;
    if (local_ == 0) {
      if (reports_ && run_.options.progress != Progress::kSilent) print(evaluation);
      if (reports_ && metrics_ != nullptr) {
        metrics_->validation(
            steps, static_cast<double>(steps) / static_cast<double>(plan_.steps_per_epoch()),
            evaluation);
      }
      report_.validation.push_back(std::move(evaluation));
      if (validation_->options.stop && validation_->options.stop(report_)) stop = 1.0;
    }
    agreement_.all_reduce(replica_.communicator(), std::span<double>(&stop, 1), ReduceOp::kMax);
    if (local_ == 0) {
      report_.validation_seconds += std::chrono::duration<double>(Clock::now() - start).count();
    }
    carry_.window.restart_clock();
    return stop != 0.0;
  }

  // The chief's line of an evaluation: "validation after step 780: loss 0.08123 correct 0.97120".
  static void print(const Evaluation& evaluation) {
    std::string line = "validation after step " + std::to_string(evaluation.step) + ":";
    for (const auto& [name, mean] : evaluation.means) {
      char value[32];
      std::snprintf(value, sizeof value, " %.5f", mean);
      line += " " + name + value;
    }
    std::printf("%s\n", line.c_str());
    std::fflush(stdout);
  }

  // The chief's one line at the end of a fit: the mean time per replica in each phase, and the
  // straggler where there is one (trainer/progress.hpp, fit_summary). One all-reduce (a gather:
  // each replica fills its own pair) on every replica.
  void summarize(std::uint64_t steps) {
    std::vector<double> all(2 * run_.strategy.replicas(), 0.0);
    all[2 * replica_.index()] = carry_.window.fit_times().compute;
    all[2 * replica_.index() + 1] = carry_.window.fit_times().communication;
    agreement_.all_reduce(replica_.communicator(), all, ReduceOp::kSum);
    if (!reports_ || run_.options.progress == Progress::kSilent) return;
    const std::string summary =
        fit_summary(all, steps, [&](std::size_t index) { return run_.replica_name(index); });
    std::printf("%s\n", summary.c_str());
    for (const strategy::MembershipChange& change : report_.membership) {
      std::printf("fit: %s\n", membership_text(change).c_str());
    }
    std::fflush(stdout);
  }

  R& run_;
  Replica& replica_;
  const D& data_;
  const sharding::Plan& plan_;
  ReplicaCarry& carry_;
  PeriodicCheckpoints<R>& checkpoints_;
  MetricsLog* const metrics_;
  const Validation<V>* const validation_;
  const std::uint64_t segment_end_;
  const std::uint64_t target_;
  Report& report_;
  const std::size_t local_;
  const typename R::Place place_;
  const std::span<T> parameters_;
  const std::span<T> optimizer_state_;
  const bool reports_;
  Agreement<Device> agreement_;
  StepFold<M, Device> fold_;
  std::optional<Evaluator<M, V>> evaluator_;  // with held-out data
  std::vector<std::size_t> indices_;          // the micro-batch's examples
};

}  // namespace cohort::trainer
