// Trainer<Model, Strategy, Optimizer>: the class users meet first.
//
//   cohort::Trainer trainer(model,
//                           cohort::strategy::Mirrored<>({.replicas = 4}),
//                           cohort::optimizer::Adam({.learning_rate = 1e-3}),
//                           {.global_batch = 256, .micro_batches = 8, .seed = 1});
//   cohort::Report report = trainer.fit(data, {.epochs = 5});
//   trainer.save("run.ckpt");
//
// One training step, on every replica at once:
//   1. The global batch (global_batch examples of this epoch's seeded order) is split into
//      micro_batches micro-batches; this replica computes its own whole micro-batches
//      (core/sharding.hpp), calling forward_backward once per micro-batch.
//   2. The micro-batch gradients are summed in the canonical tree (core/reduction_tree.hpp) inside
//      the replica; the strategy continues the same tree across replicas and applies the
//      optimizer: scaled by 1 / global_batch (and by the clipping factor when max_gradient_norm
//      is set), on every replica's own copy for the mirrored strategies. The replica hears of the
//      step in three calls (strategy/strategy.hpp): begin_step, gradients_ready for each range
//      of the fold that is final, finish_step. For a model with gradient readiness
//      (core/model.hpp) the ranges of the last micro-batch are folded and handed over while its
//      backward pass goes on, so the strategy can reduce the first buckets meanwhile; otherwise
//      the whole fold is one range after the last micro-batch. Either way each element's sum
//      follows the same tree, so the bits are the same.
//   3. The summed losses of the steps since the last progress line travel in one all-reduce, in
//      the same tree, so a step costs one collective.
// A model that draws random numbers (dropout) draws them from its micro-batch's own stream
// (core/micro_batch.hpp), so that they too are the same wherever the micro-batch is computed.
// Nothing in this depends on how many replicas there are, so for a fixed seed and micro_batches
// the parameters are the same bits for any replica count up to micro_batches (a count that does
// not divide them is dealt micro-batches as the tree allows: core/sharding.hpp, Deal), for every
// synchronous strategy, and after save and restore.
//
// Devices: the step runs on the strategy's device (strategy::DeviceOf<S>: device::Cpu unless the
// strategy names another, as Mirrored<device::Cuda, collective::Nccl> does). Each local replica's
// model is made at its place (ModelTraits<M>::replicate, core/model.hpp), and its gradient fold and
// optimizer state are buffers there; the fold's additions, the norm for clipping and the optimizer
// step are the device's (device/device.hpp), which computes the CPU's bits. save() and restore()
// copy the state between the device and the host.
//
// The room (include/cohort/trainer/):
//   options.hpp          Trainer::Options, Until, Report
//   run.hpp              what the Trainer holds between fits
//   segments.hpp         a fit as the replicas run it, segment by segment between checkpoints
//   replica_loop.hpp     one replica's part of a segment: the steps, the vote, the window, the
//                        evaluations, the summary
//   step_fold.hpp        a replica's fold of its micro-batches in a step
//   loss_window.hpp      the losses of the steps since the last progress line
//   agreement.hpp        the job's small agreements (a few doubles all-reduced)
//   job_settings.hpp     one job, one set of settings
//   nonfinite.hpp        non-finite gradients: Options::on_nonfinite
//   vote.hpp             what the job decides together: preemption (Options::preemption), a
//                        checkpoint by time
//   elastic.hpp          an elastic job's fit going on without a lost worker
//   checkpoints.hpp      save and restore
//   periodic_checkpoints.hpp  checkpoints during a fit: Options::checkpoint
//   snapshot_write.hpp   a checkpoint's write during a fit, shared out between the replicas
//   validation.hpp       evaluation on held-out data inside fit, and stopping early
//   metrics_log.hpp      the chief's metrics file: Options::metrics
//   progress.hpp         progress lines and the fit's summary
//
// fit(data, until) trains until the run (counted since it began, restored checkpoints included)
// has done until.steps steps or until.epochs epochs, whichever comes first of those given, and
// returns a Report: its per-step losses on the chief process only (empty elsewhere; Report below).
// If fit throws, the replicas may hold a partially applied step: until a restore, save and fit
// refuse (ConfigError), except after a ConfigError (arguments refused before any step) or a
// NumericError (every replica stopped at the same point of the step).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "cohort/core/dataset.hpp"
#include "cohort/core/error.hpp"
#include "cohort/core/model.hpp"
#include "cohort/core/options.hpp"
#include "cohort/core/preemption.hpp"
#include "cohort/core/sharding.hpp"
#include "cohort/core/trace.hpp"
#include "cohort/device/cpu.hpp"
#include "cohort/optimizer/optimizer.hpp"
#include "cohort/optimizer/sgd.hpp"
#include "cohort/strategy/mirrored.hpp"
#include "cohort/strategy/strategy.hpp"
#include "cohort/trainer/checkpoints.hpp"
#include "cohort/trainer/elastic.hpp"
#include "cohort/trainer/job_settings.hpp"
#include "cohort/trainer/metrics_log.hpp"
#include "cohort/trainer/nonfinite.hpp"
#include "cohort/trainer/options.hpp"
#include "cohort/trainer/periodic_checkpoints.hpp"
#include "cohort/trainer/run.hpp"
#include "cohort/trainer/segments.hpp"
#include "cohort/trainer/validation.hpp"

namespace cohort {

template <class M, class S = strategy::Mirrored<>, class O = optimizer::Sgd>
class Trainer {
  static_assert(Model<M>, COHORT_MODEL_REQUIREMENT_MESSAGE);
  static_assert(strategy::Strategy<S>,
                "cohort: the second argument of Trainer must be a strategy, for example "
                "cohort::strategy::Mirrored<>. See include/cohort/strategy/strategy.hpp.");
  static_assert(optimizer::Optimizer<O>,
                "cohort: the third argument of Trainer must be an optimizer, for example "
                "cohort::optimizer::Sgd or cohort::optimizer::Adam. See "
                "include/cohort/optimizer/optimizer.hpp.");

  using Run = trainer::Run<M, S, O>;

 public:
  using value_type = typename Run::value_type;
  using batch_type = typename Run::batch_type;
  using Device = typename Run::Device;
  using Place = typename Run::Place;
  using Options = TrainerOptions;

  static_assert(std::same_as<Device, device::Cpu> || Placeable<M, Place>,
                "cohort: the strategy's replicas live on a device (S::Device), and the model "
                "does not say how a replica is made there: give ModelTraits<YourModel> `static "
                "YourModel replicate(const YourModel& prototype, const Place& place)` (for "
                "device::Cuda, Place is device::cuda::Place). See include/cohort/core/model.hpp.");

  // A process without local replicas (a parameter server) builds no model: `model` only gives the
  // parameter count.
  Trainer(const M& model, S strategy, O optimizer, Options options = {})
      : run_(std::move(strategy), std::move(optimizer), std::move(options)),
        checkpoints_(run_.options.checkpoint) {
    if constexpr (kArgumentsValid) start(model);
  }

  // data: a Dataset of batch_type (core/dataset.hpp); anything else is told so at compile time.
  template <class D>
  Report fit(const D& data, Until until) {
    return checked_fit(data, until, static_cast<const Validation<trainer::NoValidation>*>(nullptr));
  }

  // The same, evaluating held-out data as it goes (cohort::validation, trainer/validation.hpp).
  template <class D, class V>
  Report fit(const D& data, Until until, const Validation<V>& validation) {
    static_assert(!Model<M> || Dataset<V, batch_type>, COHORT_DATASET_REQUIREMENT_MESSAGE);
    return checked_fit(data, until, &validation);
  }

  // This process's first replica; every replica holds the same parameters between steps. On a
  // device, its parameters() are that device's memory.
  // Not on a parameter server, which holds no model (ConfigError).
  const M& model() const {
    if (run_.models.empty()) {
      throw ConfigError(
          "Trainer::model: this process runs no replica (a parameter server holds only its shard "
          "of the parameters): ask a worker, for example the chief");
    }
    return run_.models[0];
  }
  std::uint64_t step() const { return run_.step; }
  const S& strategy() const { return run_.strategy; }
  const Options& options() const { return run_.options; }

  // This process's timeline file, when tracing (Options::trace).
  std::filesystem::path trace_file() const {
    std::string name = run_.recorder ? run_.recorder->label() : std::string("process");
    std::replace(name.begin(), name.end(), ' ', '-');
    return run_.options.trace / (name + ".json");
  }

  // Writes the complete training state (checkpoint/checkpoint.hpp). Every process calls it after
  // the same fit. Only the chief process writes (every process holds the same state), except
  // under a strategy that saves its own way: a parameter server's servers write a shard each and
  // the chief writes the manifest. Every process returns once the checkpoint is complete, so a
  // restore right after finds it; when it could not be written, every process throws (the chief
  // its own error, the others a CheckpointError quoting it).
  void save(const std::filesystem::path& file) const {
    require_settled("save");
    if constexpr (kArgumentsValid) trainer::write_checkpoint(run_, file);
  }

  // Continues the run saved in `file` (a checkpoint or a sharded checkpoint's manifest), which
  // every process reads (a shared file system, or a copy on every host). Everything is checked
  // before anything is changed: on error the trainer and its models are as they were.
  void restore(const std::filesystem::path& file) {
    if constexpr (kArgumentsValid) trainer::read_checkpoint(run_, file);
    unsettled_.reset();
  }

 private:
  // Whether M, S and O are what the static_asserts above require. Where they are not, the public
  // members do nothing, so that a failed static_assert is the only error a user reads; the
  // private members below are used only where they are.
  static constexpr bool kArgumentsValid =
      Model<M> && strategy::Strategy<S> && optimizer::Optimizer<O>;

  void start(const M& model) {
    trainer::validate_nonfinite_policy<S, value_type, O>(run_.options.on_nonfinite);
    run_.options.schedule.validate();
    checkpoints_.validate();
    options::require_in_range("preemption.grace", run_.options.preemption.grace.count(),
                              std::chrono::seconds::rep{1}, std::chrono::seconds::rep{3600});
    watch_ = std::make_unique<preemption::Watch>(run_.options.preemption);
    run_.parameter_count = ModelTraits<M>::parameters(const_cast<M&>(model)).size();
    sharding::Plan::validate_split(run_.options.global_batch, run_.options.micro_batches,
                                   run_.strategy.replicas(), run_.strategy.local_replicas(),
                                   strategy::FoldsAnyDeal<S>);
    run_.deal();
    if (const std::size_t gradients = ModelTraits<M>::gradients(const_cast<M&>(model)).size();
        gradients != run_.parameter_count) {
      options::reject(
          "gradients().size()", gradients,
          "must equal parameters().size() (" + std::to_string(run_.parameter_count) + ")");
    }
    if (run_.options.trace.empty()) {
      if (const char* directory = std::getenv("COHORT_TRACE"); directory && *directory) {
        run_.options.trace = directory;
      }
    }
    if (!run_.options.trace.empty()) {
      const auto [label, process] = run_.trace_identity();
      run_.recorder = std::make_unique<trace::Recorder>(label, process);
    }
    const std::size_t locals = run_.strategy.local_replicas();
    run_.models.reserve(locals);
    run_.optimizer_states.reserve(locals);
    for (std::size_t local = 0; local < locals; ++local) {
      run_.models.push_back(cohort::replicate(model, run_.place(local)));
      run_.optimizer_states.emplace_back(O::kStateSlots * run_.parameter_count, run_.place(local));
    }
  }

  // Both fits, once the data's type is checked.
  template <class D, class V>
  Report checked_fit(const D& data, Until until, const Validation<V>* validation) {
    static_assert(!Model<M> || Dataset<D, batch_type>, COHORT_DATASET_REQUIREMENT_MESSAGE);
    if constexpr (kArgumentsValid && Dataset<D, batch_type>) {
      return traced_fit(data, until, validation);
    } else {
      return {};  // never compiled into a program: a static_assert has failed
    }
  }

  // A fit with this process's timeline, when tracing: written at the end, also of a failed fit,
  // where it shows where the step stopped.
  template <class D, class V>
  Report traced_fit(const D& data, Until until, const Validation<V>* validation) {
    require_settled("fit");
    const trace::Installed installed(run_.recorder.get());
    Report report;
    try {
      report = train(data, until, validation);
    } catch (...) {
      try {
        throw;
      } catch (const ConfigError&) {   // refused before any step began
      } catch (const NumericError&) {  // every replica stopped at the same point of the step
      } catch (...) {
        unsettled_ = "the fit begun at step " + std::to_string(run_.step) + " failed (" +
                     what_of(std::current_exception()) + ")";
      }
      if (run_.recorder) {
        try {
          run_.recorder->write(trace_file());
        } catch (const Error&) {
        }
      }
      throw;
    }
    if (run_.recorder) run_.recorder->write(trace_file());
    return report;
  }

  // A fit that failed otherwise than by refusing its arguments or raising on a non-finite value
  // may have stopped inside a step: some replicas updated, or a sharded update's optimizer state
  // current on each worker's stripes only (strategy/detail/mirrored_replica.hpp). Such a state
  // is neither saved nor trained on until a restore replaces it.
  void require_settled(std::string_view call) const {
    if (!unsettled_) return;
    throw ConfigError("Trainer::" + std::string(call) + ": " + *unsettled_ +
                      ", so the replicas may hold a partially applied step: restore a checkpoint "
                      "first");
  }

  template <class D, class V>
  Report train(const D& data, Until until, const Validation<V>* validation) {
    if (until.epochs == 0 && until.steps == 0) {
      options::reject("until", "{}", "give epochs or steps (or both)");
    }
    checkpoints_.resume(run_);
    if constexpr (strategy::ServesFit<S, value_type, O>) {
      if (run_.strategy.serves()) return serve();
    }
    if (!metrics_ && run_.strategy.is_chief()) {
      metrics_ = trainer::open_metrics_log(run_.options, run_.options.checkpoint.resume);
    }
    const sharding::Plan plan = run_.plan(data.size());
    if (run_.dataset_size != 0 && run_.dataset_size != data.size()) {
      options::reject("data.size()", data.size(),
                      "differs from the " + std::to_string(run_.dataset_size) +
                          " examples this run began with; its data order would change");
    }
    run_.dataset_size = data.size();
    if constexpr (strategy::Grows<S>) {
      if (run_.strategy.joined() && !joined_fit_) {
        joined_fit_ = true;
        trainer::join_fit(run_);
      }
    }
    if constexpr (strategy::TakesWorkersBack<S>) {
      if (run_.strategy.rejoined() && !joined_fit_) {
        joined_fit_ = true;
        trainer::rejoin_fit(run_);
      }
    }
    std::uint64_t target = std::numeric_limits<std::uint64_t>::max();
    if (until.epochs != 0) target = until.epochs * plan.steps_per_epoch();
    if (until.steps != 0) target = std::min(target, until.steps);

    Report report =
        trainer::fit_segments(run_, checkpoints_, metrics_, data, validation, plan, target);
    run_.rejoined_from.reset();  // a later fit begins where this one ended, as every worker's
    return report;
  }

  // A server's fit (strategy::ServesFit): it serves the workers' fit, segment by segment, saving
  // its shard with them after each (Options::checkpoint), and returns when they are done.
  Report serve() {
    Report report;
    const auto start = std::chrono::steady_clock::now();
    for (strategy::FitEnd end = strategy::FitEnd::kCheckpoint;
         end == strategy::FitEnd::kCheckpoint || end == strategy::FitEnd::kAdmit;) {
      const strategy::Served served = run_.strategy.template serve<value_type>(
          run_.parameter_count, run_.optimizer, run_.options.schedule,
          trainer::server_settings(run_));
      end = served.end;
      run_.step = served.step;
      if (end == strategy::FitEnd::kPreempted) {
        report.preempted = true;
        checkpoints_.save_preempted(run_);
      } else if (end != strategy::FitEnd::kAdmit && checkpoints_.enabled()) {
        report.checkpoints += checkpoints_.save(run_) ? 1 : 0;
      }
    }
    report.seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return report;
  }

  Run run_;
  trainer::PeriodicCheckpoints<Run> checkpoints_;
  std::unique_ptr<trainer::MetricsLog> metrics_;  // on the chief, when asked
  std::optional<std::string> unsettled_;      // why the state may be inconsistent (require_settled)
  std::unique_ptr<preemption::Watch> watch_;  // when Options::preemption.enabled
  // A process that joined a running job took its state (join_fit), or one started again for a
  // lost worker's place took the step it goes on from (rejoin_fit).
  bool joined_fit_ = false;
};

}  // namespace cohort
