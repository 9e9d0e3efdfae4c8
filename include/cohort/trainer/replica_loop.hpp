// trainer::ReplicaLoop: one local replica's part of a fit, on the thread the strategy runs it on.
// Every replica of every process runs the same loop: the settings check, the start from the
// chief's state, then for each step the preemption vote when due, its micro-batches
// (core/sharding.hpp), the fold (trainer/step_fold.hpp) and the strategy's three calls
// (strategy/strategy.hpp), and the loss window (trainer/loss_window.hpp); at the end the fit's
// summary and the strategy's finish.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <limits>
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
#include "cohort/trainer/nonfinite.hpp"
#include "cohort/trainer/preemption_vote.hpp"
#include "cohort/trainer/progress.hpp"
#include "cohort/trainer/run.hpp"
#include "cohort/trainer/step_fold.hpp"

namespace cohort::trainer {

template <class R, class Replica, class D>
class ReplicaLoop {
  using M = typename R::Model;
  using S = typename R::Strategy;
  using O = typename R::Optimizer;
  using T = typename R::value_type;
  using Device = typename R::Device;
  using Clock = std::chrono::steady_clock;

 public:
  // Steps from run.step up to `target` (exclusive); `report` is shared by the process's replicas.
  ReplicaLoop(R& run, Replica& replica, const D& data, const sharding::Plan& plan,
              std::uint64_t target, Report& report)
      : run_(run),
        replica_(replica),
        data_(data),
        plan_(plan),
        target_(target),
        report_(report),
        local_(replica.index() - run.strategy.first_local_replica()),
        place_(run.place(local_)),
        parameters_(ModelTraits<M>::parameters(run.models[local_])),
        optimizer_state_(run.optimizer_states[local_].span()),
        reports_(replica.index() == 0 && run.strategy.is_chief()),
        agreement_(place_),
        fold_(run.models[local_], place_),
        window_(reports_, run.options.progress, plan.steps_per_epoch(), run.options.global_batch),
        vote_(run.step) {}

  void run() {
    if (run_.recorder) run_.recorder->name_thread("replica " + std::to_string(replica_.index()));
    // Checked before anything else travels (the parameters' broadcast has their count in it).
    if constexpr (strategy::SpansProcesses<S>) require_same_settings(run_, replica_, agreement_);
    // Every replica starts from the chief's state (replicas of other processes included).
    replica_.start(parameters_, optimizer_state_, run_.step);
    if constexpr (strategy::LendsGradientStorage<S, T>) {
      fold_.lend_sum_storage(replica_.template gradient_sum_storage<T>(parameters_.size()));
    }
    std::uint64_t step = run_.step;
    for (; step < target_; ++step) {
      if (run_.options.preemption.enabled &&
          vote_.template stops_before<S>(step, replica_, agreement_)) {
        if (!window_.empty()) close_window(step - 1, false);
        break;
      }
      train_step(step);
      const std::size_t step_in_epoch = step % plan_.steps_per_epoch();
      const bool periodic =
          run_.options.log_every != 0 && (step_in_epoch + 1) % run_.options.log_every == 0;
      const bool epoch_end = step_in_epoch + 1 == plan_.steps_per_epoch();
      if (periodic || epoch_end || step + 1 == target_) close_window(step, periodic);
    }
    if (local_ == 0) {
      report_.steps = step - run_.step;
      report_.preempted = step < target_;
    }
    if (step > run_.step) summarize(step - run_.step);
    // Every replica ends the fit, as it started it (a parameter server brings the optimizer
    // state home).
    replica_.finish(parameters_, optimizer_state_,
                    step < target_ ? strategy::FitEnd::kPreempted : strategy::FitEnd::kReached);
  }

 private:
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
      if constexpr (strategy::AbandonsStep<S>) {
        replica_.abandon_step(what_of(std::current_exception()));
      }
      throw;
    }
    const auto step_end = Clock::now();
    window_.add(
        fold_.loss(),
        {.compute = std::chrono::duration<double>(synchronization_start - compute_start).count(),
         .communication = std::chrono::duration<double>(step_end - synchronization_start).count()});
  }

  // This replica's whole micro-batches of the step, folded and handed to the replica.
  void compute(strategy::Update<T, O>& update) {
    const std::uint64_t epoch = update.step / plan_.steps_per_epoch();
    const std::size_t step_in_epoch = update.step % plan_.steps_per_epoch();
    if (epoch != order_epoch_) {
      order_ = plan_.epoch_order(run_.options.seed, epoch);
      order_epoch_ = epoch;
    }
    const std::size_t first = plan_.first_micro_batch(replica_.index());
    const std::size_t end = first + plan_.micro_batches_per_replica();
    for (std::size_t micro = first; micro < end; ++micro) {
      const sharding::Range range = plan_.micro_batch(step_in_epoch, micro);
      indices_.assign(order_.begin() + range.begin, order_.begin() + range.end);
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
    window_.close(last_step, periodic, replica_.communicator(), agreement_, run_.recorder.get(),
                  report_);
  }

  // The chief's one line at the end of a fit: the mean time per replica in each phase, and the
  // straggler where there is one (trainer/progress.hpp, fit_summary). One all-reduce (a gather:
  // each replica fills its own pair) on every replica.
  void summarize(std::uint64_t steps) {
    std::vector<double> all(2 * run_.strategy.replicas(), 0.0);
    all[2 * replica_.index()] = window_.fit_times().compute;
    all[2 * replica_.index() + 1] = window_.fit_times().communication;
    agreement_.all_reduce(replica_.communicator(), all, ReduceOp::kSum);
    if (!reports_ || run_.options.progress == Progress::kSilent) return;
    const std::string summary =
        fit_summary(all, steps, [&](std::size_t index) { return run_.replica_name(index); });
    std::printf("%s\n", summary.c_str());
    std::fflush(stdout);
  }

  R& run_;
  Replica& replica_;
  const D& data_;
  const sharding::Plan& plan_;
  const std::uint64_t target_;
  Report& report_;
  const std::size_t local_;
  const typename R::Place place_;
  const std::span<T> parameters_;
  const std::span<T> optimizer_state_;
  const bool reports_;
  Agreement<Device> agreement_;
  StepFold<M, Device> fold_;
  LossWindow window_;
  PreemptionVote vote_;
  std::vector<std::size_t> order_;  // this epoch's example order
  std::uint64_t order_epoch_ = std::numeric_limits<std::uint64_t>::max();
  std::vector<std::size_t> indices_;  // the micro-batch's examples
};

}  // namespace cohort::trainer
