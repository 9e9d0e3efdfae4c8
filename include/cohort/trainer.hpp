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
// the parameters are the same bits for any replica count whose split is valid (micro_batches /
// replicas a power of two), for every synchronous strategy, and after save and restore.
//
// Devices: the step runs on the strategy's device (strategy::DeviceOf<S>: device::Cpu unless the
// strategy names another, as Mirrored<device::Cuda, collective::Nccl> does). Each local replica's
// model is made at its place (ModelTraits<M>::replicate, core/model.hpp), and its gradient fold and
// optimizer state are buffers there; the fold's additions, the norm for clipping and the optimizer
// step are the device's (device/device.hpp), which computes the CPU's bits. save() and restore()
// copy the state between the device and the host.
//
// Options:
//   global_batch   examples per step, over all replicas (>= micro_batches)
//   micro_batches  pieces of each global batch; the unit of work and of the reduction tree
//   seed           defines every epoch's example order
//   log_every      steps between progress lines on the chief (0: only at the end of epochs)
//   progress       Progress::kAuto, kLines or kSilent
//   trace          a directory for this process's timeline (Chrome trace JSON, core/trace.hpp),
//                  written at the end of every fit, also of a failed one; or COHORT_TRACE
//   on_nonfinite   what a step whose reduced gradient holds an infinity or NaN does:
//                  NonFinite::kRaise (the default) or NonFinite::kSkipStep (below)
//   preemption     what SIGTERM and SIGUSR1 do while the Trainer lives (below): enabled, the
//                  checkpoint to save to, the grace period (core/preemption.hpp)
//
// Preemption. With preemption.enabled (the default) the signal is latched, and before the first
// step of a fit, then about every 0.1 s (a number of steps computed alike everywhere from the
// slowest step time), every replica of every process votes in one all-reduce whether any process
// was signalled (a parameter-server worker also counts its servers' marked answers). All stop at
// the same step, within about 0.1 s plus a step of the signal; a signal between two fits stops the
// next before its first step. Every process then
// saves to preemption.checkpoint, when given (Trainer::save: the chief, or a parameter server's
// shards and manifest), and fit returns with Report::preempted: the program should exit with
// kExitPreempted (75), and the same command continues the run bit for bit. A process still alive
// preemption.grace (20 s) after the signal is ended with 128 + the signal.
//
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
// Under ParameterServer the servers hold the reduced gradient, each a shard of it: there every
// worker checks the parameters it pulls after each step instead (NumericError with where() ==
// kParameters; under Sync every worker pulls the same ones), and kSkipStep, which would need the
// servers to agree before they apply a step, is refused with a ConfigError on every process.
// save() never writes a state holding an infinity or NaN: NumericError naming the first (a
// parameter server's shard: its server reports the element, and the chief's save throws
// CheckpointError).
//
// One job, one set of settings. Before the first step of every fit, every replica of every process
// of a job of several (a one-process job's replicas share one Trainer, so nothing can differ)
// compares (core/settings.hpp; one all-reduce of two doubles per field when all agree): seed,
// global_batch, micro_batches, on_nonfinite, the optimizer's name and each of its options, the
// parameter count, the value type, the data-set size, the strategy and its device, replicas,
// local_replicas and the run's step (processes restored from different checkpoints). A difference
// is a ConfigError on every process, before anything else travels, that names the field and both
// values with a process holding each: "micro_batches is 8 on worker 0 (replica 0) but 4 on worker 1
// (replica 2)". Under ParameterServer the strategy's own settings join them (consistency, and the
// options backup_workers, min_shard_bytes, alignment, chunk_bytes), Sync workers compare among
// themselves as above, and then every worker, Async and BoundedStaleness included (whose
// collectives never leave their process), presents its settings to every server
// (strategy/parameter_server/protocol.hpp). A server compares the ones it holds itself (the
// optimizer and its options, the parameter count, the value type, the consistency and the parameter
// server options) with its own, and the others with the chief's: "optimizer option learning_rate is
// 0.01 on parameter server 1 but 0.003 on worker 0", "seed is 11 on worker 0 but 12 on worker 2".
// The ConfigError comes on that server and on every worker, before any worker gets its first
// parameters; a server that agreed learns it when the chief leaves, and its CommError quotes it.
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
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "cohort/checkpoint/checkpoint.hpp"
#include "cohort/core/dataset.hpp"
#include "cohort/core/error.hpp"
#include "cohort/core/micro_batch.hpp"
#include "cohort/core/model.hpp"
#include "cohort/core/options.hpp"
#include "cohort/core/preemption.hpp"
#include "cohort/core/progress.hpp"
#include "cohort/core/readiness.hpp"
#include "cohort/core/reduction_tree.hpp"
#include "cohort/core/role.hpp"
#include "cohort/core/settings.hpp"
#include "cohort/core/sharding.hpp"
#include "cohort/core/trace.hpp"
#include "cohort/device/cpu.hpp"
#include "cohort/device/device.hpp"
#include "cohort/optimizer/optimizer.hpp"
#include "cohort/optimizer/sgd.hpp"
#include "cohort/strategy/mirrored.hpp"
#include "cohort/strategy/strategy.hpp"

namespace cohort {

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
  double examples_per_second = 0.0;
  // Steps of this fit whose reduced gradient held an infinity or NaN and that every replica
  // skipped (Options::on_nonfinite = NonFinite::kSkipStep), on every worker process. They count
  // in `steps`; their loss is in `loss` as computed (NaN, typically).
  std::uint64_t skipped_steps = 0;
  // The job stopped for preemption (core/preemption.hpp) before the fit's target, on every
  // process alike, after the save to Options::preemption.checkpoint when one is given. The
  // program should end now, with kExitPreempted.
  bool preempted = false;
};

namespace detail {
// The model's types, as Trainer declares its members with them. For a type that is not a Model
// they are stand-ins, so that Trainer's static_assert is the one error its user reads.
template <class M>
struct TrainerTypes {
  using value_type = float;
  struct batch_type {};
};
template <Model M>
struct TrainerTypes<M> {
  using value_type = ValueType<M>;
  using batch_type = BatchType<M>;
};
}  // namespace detail

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

 public:
  using value_type = typename detail::TrainerTypes<M>::value_type;
  using batch_type = typename detail::TrainerTypes<M>::batch_type;
  using Device = strategy::DeviceOf<S>;
  using Place = typename Device::Place;

  static_assert(std::same_as<Device, device::Cpu> || Placeable<M, Place>,
                "cohort: the strategy's replicas live on a device (S::Device), and the model "
                "does not say how a replica is made there: give ModelTraits<YourModel> `static "
                "YourModel replicate(const YourModel& prototype, const Place& place)` (for "
                "device::Cuda, Place is device::cuda::Place). See include/cohort/core/model.hpp.");

  struct Options {
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
  };

  // A process without local replicas (a parameter server) builds no model: `model` only gives the
  // parameter count.
  Trainer(const M& model, S strategy, O optimizer, Options options = {})
      : strategy_(std::move(strategy)), optimizer_(std::move(optimizer)), options_(options) {
    if constexpr (kArgumentsValid) start(model);
  }

  // data: a Dataset of batch_type (core/dataset.hpp); anything else is told so at compile time.
  template <class D>
  Report fit(const D& data, Until until) {
    static_assert(!Model<M> || Dataset<D, batch_type>, COHORT_DATASET_REQUIREMENT_MESSAGE);
    if constexpr (kArgumentsValid && Dataset<D, batch_type>) {
      return traced_fit(data, until);
    } else {
      return {};  // never compiled into a program: a static_assert has failed
    }
  }

  // This process's first replica; every replica holds the same parameters between steps. On a
  // device, its parameters() are that device's memory.
  // Not on a parameter server, which holds no model (ConfigError).
  const M& model() const {
    if (models_.empty()) {
      throw ConfigError(
          "Trainer::model: this process runs no replica (a parameter server holds only its shard "
          "of the parameters): ask a worker, for example the chief");
    }
    return models_[0];
  }
  std::uint64_t step() const { return step_; }
  const S& strategy() const { return strategy_; }
  const Options& options() const { return options_; }

  // This process's timeline file, when tracing (Options::trace).
  std::filesystem::path trace_file() const {
    std::string name = recorder_ ? recorder_->label() : std::string("process");
    std::replace(name.begin(), name.end(), ' ', '-');
    return options_.trace / (name + ".json");
  }

  // Writes the complete training state (checkpoint/checkpoint.hpp). Every process calls it after
  // the same fit. Only the chief process writes (every process holds the same state), except
  // under a strategy that saves its own way: a parameter server's servers write a shard each and
  // the chief writes the manifest. Every process returns once the checkpoint is complete, so a
  // restore right after finds it; when it could not be written, every process throws (the chief
  // its own error, the others a CheckpointError quoting it).
  void save(const std::filesystem::path& file) const {
    require_settled("save");
    if constexpr (kArgumentsValid) write_checkpoint(file);
  }

  // Continues the run saved in `file` (a checkpoint or a sharded checkpoint's manifest), which
  // every process reads (a shared file system, or a copy on every host). Everything is checked
  // before anything is changed: on error the trainer and its models are as they were.
  void restore(const std::filesystem::path& file) {
    if constexpr (kArgumentsValid) read_checkpoint(file);
    unsettled_.reset();
  }

 private:
  // Whether M, S and O are what the static_asserts above require. Where they are not, the public
  // members do nothing, so that a failed static_assert is the only error a user reads; the
  // private members below are used only where they are.
  static constexpr bool kArgumentsValid =
      Model<M> && strategy::Strategy<S> && optimizer::Optimizer<O>;

  // Whether S's replicas check each step's reduced gradient for infinities and NaN (their
  // finish_step returns a StepResult: the mirrored strategies). Where they do not (a parameter
  // server, whose servers hold the reduced gradient), the Trainer checks the parameters after
  // each step instead, and only NonFinite::kRaise is possible.
  static constexpr bool checks_gradient() {
    if constexpr (requires { typename S::Replica; }) {
      return std::same_as<decltype(std::declval<typename S::Replica&>().finish_step(
                              std::declval<strategy::Update<value_type, O>&>())),
                          strategy::StepResult>;
    } else {
      return false;
    }
  }

  void start(const M& model) {
    if (options_.on_nonfinite != NonFinite::kRaise &&
        options_.on_nonfinite != NonFinite::kSkipStep) {
      options::reject("on_nonfinite", static_cast<int>(options_.on_nonfinite),
                      "must be NonFinite::kRaise or NonFinite::kSkipStep");
    }
    if (!checks_gradient() && options_.on_nonfinite == NonFinite::kSkipStep) {
      options::reject("on_nonfinite", name(options_.on_nonfinite),
                      std::string("is not available under ") + std::string(S::kName) +
                          ": its servers hold the reduced gradient and would first have to agree "
                          "to skip a step; use NonFinite::kRaise (the default)");
    }
    options::require_in_range("preemption.grace", options_.preemption.grace.count(),
                              std::chrono::seconds::rep{1}, std::chrono::seconds::rep{3600});
    watch_ = std::make_unique<preemption::Watch>(options_.preemption);
    parameter_count_ = ModelTraits<M>::parameters(const_cast<M&>(model)).size();
    sharding::Plan::validate_split(options_.global_batch, options_.micro_batches,
                                   strategy_.replicas());
    if (const std::size_t gradients = ModelTraits<M>::gradients(const_cast<M&>(model)).size();
        gradients != parameter_count_) {
      options::reject("gradients().size()", gradients,
                      "must equal parameters().size() (" + std::to_string(parameter_count_) + ")");
    }
    if (options_.trace.empty()) {
      if (const char* directory = std::getenv("COHORT_TRACE"); directory && *directory) {
        options_.trace = directory;
      }
    }
    if (!options_.trace.empty()) {
      const auto [label, process] = trace_identity();
      recorder_ = std::make_unique<trace::Recorder>(label, process);
    }
    const std::size_t locals = strategy_.local_replicas();
    models_.reserve(locals);
    optimizer_states_.reserve(locals);
    for (std::size_t local = 0; local < locals; ++local) {
      models_.push_back(cohort::replicate(model, place(local)));
      optimizer_states_.emplace_back(O::kStateSlots * parameter_count_, place(local));
    }
  }

  // A fit with this process's timeline, when tracing: written at the end, also of a failed fit,
  // where it shows where the step stopped.
  template <class D>
  Report traced_fit(const D& data, Until until) {
    require_settled("fit");
    const trace::Installed installed(recorder_.get());
    Report report;
    try {
      report = train(data, until);
    } catch (...) {
      try {
        throw;
      } catch (const ConfigError&) {   // refused before any step began
      } catch (const NumericError&) {  // every replica stopped at the same point of the step
      } catch (...) {
        unsettled_ = "the fit begun at step " + std::to_string(step_) + " failed (" +
                     what_of(std::current_exception()) + ")";
      }
      if (recorder_) {
        try {
          recorder_->write(trace_file());
        } catch (const Error&) {
        }
      }
      throw;
    }
    if (recorder_) recorder_->write(trace_file());
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

  void write_checkpoint(const std::filesystem::path& file) const {
    const trace::Span span(recorder_.get(), trace::Phase::kCheckpoint, {.step = step_});
    if constexpr (requires { strategy_.save(file, checkpoint_state(false), parameter_count_); }) {
      // The values are the servers' to write: the strategy gets the run's settings and step.
      strategy_.save(file, checkpoint_state(false), parameter_count_);
    } else {
      std::exception_ptr failure;
      if (strategy_.is_chief()) {
        try {
          const auto state = checkpoint_state();
          refuse_nonfinite(state.parameters, NumericError::Where::kParameters, file);
          refuse_nonfinite(state.optimizer_state, NumericError::Where::kOptimizerState, file);
          checkpoint::write(file, state);
        } catch (...) {
          failure = std::current_exception();
        }
      }
      // Across processes every one hears how the chief's write went: none returns before the
      // file is complete (a restore right after finds it), and all fail when it is not.
      if constexpr (requires { strategy_.save_outcome(file, std::string_view()); }) {
        const std::string outcome = strategy_.save_outcome(file, failure ? what_of(failure) : "");
        if (!failure && !outcome.empty()) throw checkpoint::not_written_by_chief(file, outcome);
      }
      if (failure) std::rethrow_exception(failure);
    }
  }

  // A state with an infinity or NaN is never saved: it could only be restored to fail again.
  void refuse_nonfinite(std::span<const value_type> values, NumericError::Where where,
                        const std::filesystem::path& file) const {
    if (const std::size_t first = device::cpu::first_nonfinite(values); first != values.size()) {
      throw NumericError(where, step_ == 0 ? 0 : step_ - 1, first,
                         "not written to " + file.string() +
                             ": a training state with infinities or NaN is never saved; restore "
                             "an earlier checkpoint, or train with on_nonfinite = skip_step");
    }
  }

  void read_checkpoint(const std::filesystem::path& file) {
    const auto state = checkpoint::read<value_type>(file);
    const auto expect = [&](std::string_view field, const auto& in_file, const auto& here) {
      if (in_file == here) return;
      std::ostringstream why;
      why << "checkpoint " << file.string() << ": " << field << " is " << in_file
          << " in the file but " << here << " in this trainer";
      throw CheckpointError(why.str());
    };
    expect("optimizer", state.optimizer, std::string(O::kName));
    expect("parameter count", state.parameters.size(), parameter_count_);
    expect("optimizer state size", state.optimizer_state.size(), O::kStateSlots * parameter_count_);
    expect("seed", state.seed, options_.seed);
    expect("global_batch", state.global_batch, std::uint64_t{options_.global_batch});
    expect("micro_batches", state.micro_batches, std::uint64_t{options_.micro_batches});
    for (std::size_t local = 0; local < models_.size(); ++local) {
      Device::from_host(place(local), std::span<const value_type>(state.parameters),
                        ModelTraits<M>::parameters(models_[local]));
      Device::from_host(place(local), std::span<const value_type>(state.optimizer_state),
                        optimizer_states_[local].span());
    }
    // A parameter server keeps its shard of the restored state (for a save before the next fit).
    if constexpr (requires { strategy_.restored(state); }) strategy_.restored(state);
    step_ = state.step;
    dataset_size_ = state.dataset_size;
  }

  template <class D>
  Report train(const D& data, Until until) {
    if (until.epochs == 0 && until.steps == 0) {
      options::reject("until", "{}", "give epochs or steps (or both)");
    }
    // A strategy with server processes (strategy/parameter_server.hpp): a server serves the
    // workers' fit and returns when they are done.
    if constexpr (requires { strategy_.serves(); }) {
      if (strategy_.serves()) {
        Report report;
        const auto start = std::chrono::steady_clock::now();
        report.preempted =
            strategy_.template serve<value_type>(parameter_count_, optimizer_, server_settings());
        report.seconds =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        if (report.preempted) save_preempted();
        return report;
      }
    }
    const sharding::Plan plan(data.size(), options_.global_batch, options_.micro_batches,
                              strategy_.replicas());
    if (dataset_size_ != 0 && dataset_size_ != data.size()) {
      options::reject("data.size()", data.size(),
                      "differs from the " + std::to_string(dataset_size_) +
                          " examples this run began with; its data order would change");
    }
    dataset_size_ = data.size();
    std::uint64_t target = std::numeric_limits<std::uint64_t>::max();
    if (until.epochs != 0) target = until.epochs * plan.steps_per_epoch();
    if (until.steps != 0) target = std::min(target, until.steps);

    Report report;
    const auto start = std::chrono::steady_clock::now();
    strategy_.run([&](auto& replica) { train_replica(replica, data, plan, target, report); });
    report.seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    report.examples_per_second =
        static_cast<double>(report.steps * options_.global_batch) / report.seconds;
    step_ += report.steps;
    if (report.preempted) save_preempted();
    return report;
  }

  template <class T>
  using Buffer = device::Buffer<Device, T>;

  // A gradient of the step's fold: a buffer of its own at the replica's place, or, for the sum,
  // storage that the strategy lends (strategy.hpp, gradient_sum_storage).
  class Gradient {
   public:
    std::span<value_type> span() { return lent_.empty() ? owned_.span() : lent_; }
    std::span<const value_type> span() const { return lent_.empty() ? owned_.span() : lent_; }
    std::size_t size() const { return span().size(); }
    // Keeps what it holds where that is `count` elements, else holds a buffer of its own.
    void hold(std::size_t count, const Place& place) {
      if (size() == count) return;
      lent_ = {};
      owned_ = Buffer<value_type>(count, place);
    }
    void lend(std::span<value_type> storage) {
      lent_ = storage;
      owned_ = {};
    }

   private:
    Buffer<value_type> owned_;
    std::span<value_type> lent_;
  };

  Place place(std::size_t local) const { return strategy::place_of(strategy_, local); }

  // This process's name and track in a timeline: its role and rank where the strategy has a
  // cluster (processes), else one process.
  std::pair<std::string, int> trace_identity() const {
    if constexpr (requires { strategy_.cluster(); }) {
      const auto& spec = strategy_.cluster();
      const bool server = spec.role == Role::kParameterServer;
      // Servers' tracks after every worker's in a merged timeline.
      constexpr int kFirstServerTrack = 1 << 16;
      return {(server ? "ps " : "worker ") + std::to_string(spec.rank),
              server ? kFirstServerTrack + spec.rank : spec.rank};
    } else {
      return {"process", 0};
    }
  }

  // The training state of this process's first replica, on the host, as a checkpoint holds it;
  // without `values` (or without replicas), the run's settings and step only.
  checkpoint::TrainingState<value_type> checkpoint_state(bool values = true) const {
    checkpoint::TrainingState<value_type> state;
    state.optimizer = O::kName;
    if (values && !models_.empty()) {
      const auto parameters = ModelTraits<M>::parameters(const_cast<M&>(models_[0]));
      state.parameters.resize(parameters.size());
      Device::to_host(place(0), std::span<const value_type>(parameters),
                      std::span<value_type>(state.parameters));
      state.optimizer_state.resize(optimizer_states_[0].size());
      Device::to_host(place(0), optimizer_states_[0].span(),
                      std::span<value_type>(state.optimizer_state));
    }
    state.step = step_;
    state.seed = options_.seed;
    state.global_batch = options_.global_batch;
    state.micro_batches = options_.micro_batches;
    state.dataset_size = dataset_size_;
    return state;
  }

  static void add_loss(double& left, const double& right) { left += right; }

  // The gradient fold's addition. Out of line on purpose: the model's forward_backward usually
  // inlines into train_replica's micro-batch loop, and with this vector loop inlined beside it GCC
  // 12 compiled the model measurably slower (examples/00_mirrored_cpu: about 8% fewer examples/s
  // on 1 replica, with 1% more instructions: another register allocation of the model's loops).
  struct AddInto {
    Place place;
    [[gnu::noinline]] void operator()(Gradient& left, const Gradient& right) const {
      Device::add_into(place, left.span(), right.span());
    }
    [[gnu::noinline]] void part(Gradient& left, const Gradient& right, std::size_t begin,
                                std::size_t count) const {
      Device::add_into(place, left.span().subspan(begin, count),
                       std::span<const value_type>(right.span()).subspan(begin, count));
    }
  };

  // The last micro-batch of a step, with gradient readiness (core/model.hpp): each range the
  // model reports final is folded at once (the fold's remaining merges, on that range only) and
  // handed to the replica, which may start reducing it while the backward pass goes on.
  template <class Replica>
  double last_micro_batch_with_readiness(M& model, const batch_type& batch,
                                         std::span<const value_type> gradients,
                                         tree::StreamingFold<Gradient, AddInto>& gradient_fold,
                                         const Place& place, Replica& replica,
                                         strategy::Update<value_type, O>& update) {
    Gradient& leaf = gradient_fold.begin_last();
    leaf.hold(gradients.size(), place);
    update.gradient_sum = gradient_fold.result_slot().span();
    replica.begin_step(update);
    ReadinessCheck readiness;
    readiness.begin(gradients.size());
    auto ready = [&](std::size_t begin, std::size_t end) {
      readiness.add(begin, end);
      const std::size_t count = end - begin;
      Device::copy(place, gradients.subspan(begin, count), leaf.span().subspan(begin, count));
      gradient_fold.finish_part(
          [&](Gradient& left, Gradient& right) { AddInto{place}.part(left, right, begin, count); });
      replica.gradients_ready(update, begin, end);
    };
    const double loss = ModelTraits<M>::forward_backward(model, batch, GradientReady(ready));
    readiness.require_complete();
    gradient_fold.end_last();
    return loss;
  }

  template <class Replica, class D>
  void train_replica(Replica& replica, const D& data, const sharding::Plan& plan,
                     std::uint64_t target, Report& report) {
    using Clock = std::chrono::steady_clock;
    const std::size_t local = replica.index() - strategy_.first_local_replica();
    const Place place = this->place(local);
    M& model = models_[local];
    const std::span<value_type> parameters = ModelTraits<M>::parameters(model);
    const std::span<const value_type> gradients = ModelTraits<M>::gradients(model);
    const std::span<value_type> optimizer_state = optimizer_states_[local].span();
    const bool reports = replica.index() == 0 && strategy_.is_chief();
    trace::Recorder* const recorder = recorder_.get();
    if (recorder != nullptr) recorder->name_thread("replica " + std::to_string(replica.index()));

    // Every process of the job runs with the same settings, checked before anything else travels
    // (the parameters' broadcast below has their count in it). The replicas of one process share
    // this trainer and its strategy: with no other process, nothing could differ.
    if constexpr (requires { strategy_.cluster(); }) require_same_settings(replica, place);
    // Every replica starts from the chief's state (replicas of other processes included).
    replica.start(parameters, optimizer_state, step_);

    tree::StreamingFold<Gradient, AddInto> gradient_fold(AddInto{place});
    if constexpr (requires { replica.template gradient_sum_storage<value_type>(std::size_t{}); }) {
      gradient_fold.result_slot().lend(
          replica.template gradient_sum_storage<value_type>(gradients.size()));
    }
    tree::StreamingFold<double, decltype(&add_loss)> loss_fold(&add_loss);
    ProgressPrinter progress(reports ? options_.progress : Progress::kSilent,
                             plan.steps_per_epoch(), options_.global_batch);
    std::vector<std::size_t> order;
    std::uint64_t order_epoch = std::numeric_limits<std::uint64_t>::max();
    std::vector<std::size_t> indices;
    const double inverse_batch = 1.0 / static_cast<double>(options_.global_batch);
    // This replica's loss fold of each step since the last report, and the same where the
    // communicator reduces them.
    std::vector<double> window_losses;
    Buffer<double> window_at_place;
    std::vector<StepTimes> window_times;
    StepTimes fit_times;  // this replica's, over the whole fit

    // The progress window's losses travel once per window, not once per step: every replica keeps
    // its folds and one all-reduce of the window gives each step's sum in the same tree.
    const auto report_window = [&](std::uint64_t last_step, bool periodic) {
      const trace::Span span(recorder, trace::Phase::kLossAllReduce, {.step = last_step});
      const auto communication_start = Clock::now();
      if (window_at_place.size() < window_losses.size()) {
        window_at_place = Buffer<double>(window_losses.size(), place);
      }
      const std::span<double> losses = window_at_place.span().first(window_losses.size());
      Device::from_host(place, std::span<const double>(window_losses), losses);
      replica.communicator().all_reduce(losses, ReduceOp::kSum);
      Device::to_host(place, std::span<const double>(losses), std::span<double>(window_losses));
      const double loss_seconds =
          std::chrono::duration<double>(Clock::now() - communication_start).count();
      window_times.back().communication += loss_seconds;
      fit_times.communication += loss_seconds;
      if (reports) {
        const std::uint64_t first_step = last_step + 1 - window_losses.size();
        for (std::size_t i = 0; i < window_losses.size(); ++i) {
          const double mean_loss = window_losses[i] * inverse_batch;
          report.loss.push_back(mean_loss);
          report.times += window_times[i];
          progress.report(first_step + i, mean_loss, window_times[i],
                          periodic && i + 1 == window_losses.size());
        }
      }
      window_losses.clear();
      window_times.clear();
    };
    // The preemption votes: before the first step, then about every kVoteInterval (a whole number
    // of steps that every replica computes alike from the vote's slowest step time).
    Buffer<double> vote_at_place;
    std::uint64_t next_vote = step_;
    std::uint64_t last_vote = step_;
    auto last_vote_time = Clock::now();

    std::uint64_t step = step_;
    for (; step < target; ++step) {
      if (options_.preemption.enabled && step == next_vote) {
        const auto now = Clock::now();
        const double step_seconds =
            step == last_vote ? 0.0
                              : std::chrono::duration<double>(now - last_vote_time).count() /
                                    static_cast<double>(step - last_vote);
        const Vote vote = vote_to_stop(replica, place, vote_at_place, step_seconds);
        if (vote.stop) {
          if (!window_losses.empty()) report_window(step - 1, false);
          break;
        }
        next_vote = step + steps_between_votes(vote.step_seconds);
        last_vote = step;
        last_vote_time = now;
      }
      const std::uint64_t epoch = step / plan.steps_per_epoch();
      const std::size_t step_in_epoch = step % plan.steps_per_epoch();
      if (epoch != order_epoch) {
        order = plan.epoch_order(options_.seed, epoch);
        order_epoch = epoch;
      }
      const auto compute_start = Clock::now();
      const trace::Span step_span(recorder, trace::Phase::kStep, {.step = step});
      gradient_fold.reset();
      loss_fold.reset();
      // A step that an exception ends releases the other replicas and waits until no collective
      // uses its buffers (strategy.hpp, abandon_step) while they, gradient_fold's, still live.
      Clock::time_point synchronization_start;
      try {
        strategy::Update<value_type, O> update{.parameters = parameters,
                                               .gradient_sum = {},
                                               .optimizer = optimizer_,
                                               .optimizer_state = optimizer_state,
                                               .step = step,
                                               .inverse_batch = inverse_batch,
                                               .on_nonfinite = options_.on_nonfinite};
        const std::size_t first = plan.first_micro_batch(replica.index());
        const std::size_t end = first + plan.micro_batches_per_replica();
        for (std::size_t micro = first; micro < end; ++micro) {
          const sharding::Range range = plan.micro_batch(step_in_epoch, micro);
          indices.assign(order.begin() + range.begin, order.begin() + range.end);
          const trace::Span span(recorder, trace::Phase::kForwardBackward,
                                 {.step = step, .index = micro});
          // Which micro-batch this is, for a model that draws random numbers from it.
          const MicroBatch micro_batch{.seed = options_.seed, .step = step, .index = micro};
          const MicroBatchScope micro_batch_scope(micro_batch);
          double loss = 0.0;
          if constexpr (ReportsReadiness<M>) {
            if (micro + 1 == end) {
              loss = last_micro_batch_with_readiness(model, data.batch(indices), gradients,
                                                     gradient_fold, place, replica, update);
              loss_fold.push([&](double& slot) { slot = loss; });
              continue;
            }
          }
          loss = ModelTraits<M>::forward_backward(model, data.batch(indices));
          gradient_fold.push([&](Gradient& slot) {
            slot.hold(gradients.size(), place);
            Device::copy(place, gradients, slot.span());
          });
          loss_fold.push([&](double& slot) { slot = loss; });
        }
        if (!ReportsReadiness<M>) {
          update.gradient_sum = gradient_fold.result().span();
          replica.begin_step(update);
          replica.gradients_ready(update, 0, update.gradient_sum.size());
        }
        synchronization_start = Clock::now();
        if (finish_and_check(replica, update, place) && local == 0) ++report.skipped_steps;
      } catch (...) {
        if constexpr (requires { replica.abandon_step(std::string_view()); }) {
          replica.abandon_step(what_of(std::current_exception()));
        }
        throw;
      }
      window_losses.push_back(loss_fold.result());
      const auto step_end = Clock::now();
      window_times.push_back(
          {.compute = std::chrono::duration<double>(synchronization_start - compute_start).count(),
           .communication =
               std::chrono::duration<double>(step_end - synchronization_start).count()});
      fit_times += window_times.back();

      const bool periodic =
          options_.log_every != 0 && (step_in_epoch + 1) % options_.log_every == 0;
      const bool epoch_end = step_in_epoch + 1 == plan.steps_per_epoch();
      if (periodic || epoch_end || step + 1 == target) report_window(step, periodic);
    }
    if (local == 0) {
      report.steps = step - step_;
      report.preempted = step < target;
    }
    if (step > step_) summarize_fit(replica, place, fit_times, step - step_, reports);
    // Every replica ends the fit, as it started it (a parameter server brings the optimizer
    // state home).
    replica.finish(parameters, optimizer_state,
                   step < target ? strategy::FitEnd::kPreempted : strategy::FitEnd::kReached);
  }

  // replica.finish_step(update), and what the step found: false for a step whose reduced gradient
  // is finite, true for one that every replica skipped (NonFinite::kSkipStep); a NumericError for
  // one that raises. Where the strategy checks no gradient, the step's parameters are checked.
  template <class Replica>
  bool finish_and_check(Replica& replica, strategy::Update<value_type, O>& update,
                        const Place& place) {
    if constexpr (checks_gradient()) {
      const strategy::StepResult result = replica.finish_step(update);
      if (result.first_nonfinite == strategy::StepResult::kFinite) return false;
      if (options_.on_nonfinite == NonFinite::kSkipStep) return true;
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
      const std::span<const value_type> parameters(update.parameters);
      if (const std::size_t first = Device::first_nonfinite(place, parameters);
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

  // Preemption votes come about this often, so that the job stops within about this time of a
  // signal and a vote (one all-reduce of two numbers, some microseconds between processes) costs
  // a small model's fast steps nothing measurable.
  static constexpr double kVoteInterval = 0.1;  // seconds

  struct Vote {
    bool stop;            // some process of the job was asked to stop
    double step_seconds;  // the slowest replica's mean step time since the last vote
  };

  // Whether any process of the job was asked to stop (core/preemption.hpp), with the slowest step
  // time: one all-reduce (max) of both, so that every replica of every process decides the same
  // way and schedules the same next vote. A parameter-server worker also counts what its servers
  // said (a signalled server marks its answers).
  template <class Replica>
  static Vote vote_to_stop(Replica& replica, const Place& place, Buffer<double>& at_place,
                           double step_seconds) {
    bool asked = preemption::requested() != 0;
    if constexpr (requires { replica.stop_requested(); }) asked = asked || replica.stop_requested();
    double values[2] = {asked ? 1.0 : 0.0, step_seconds};
    if (at_place.size() != 2) at_place = Buffer<double>(2, place);
    Device::from_host(place, std::span<const double>(values), at_place.span());
    replica.communicator().all_reduce(at_place.span(), ReduceOp::kMax);
    Device::to_host(place, std::span<const double>(at_place.span()), std::span<double>(values));
    return {values[0] != 0.0, values[1]};
  }

  // Steps until the next vote: kVoteInterval's worth at the given step time, at least 1.
  static std::uint64_t steps_between_votes(double step_seconds) {
    if (!(step_seconds > 0.0)) return 1;
    return static_cast<std::uint64_t>(std::clamp(kVoteInterval / step_seconds, 1.0, 1e6));
  }

  // After a fit that stopped for preemption, on every process: the save, when a checkpoint is
  // configured (a parameter server's servers write their shards, the chief the manifest), and
  // the chief's line about it.
  void save_preempted() {
    const std::filesystem::path& file = options_.preemption.checkpoint;
    if (!file.empty()) write_checkpoint(file);
    if (!strategy_.is_chief()) return;
    const std::string saved = file.empty()
                                  ? std::string("nothing saved (no Options::preemption.checkpoint)")
                                  : "saved to " + file.string() + ": run again to continue";
    std::fprintf(stderr, "cohort: preempted: the job stopped before step %llu; %s\n",
                 static_cast<unsigned long long>(step_), saved.c_str());
  }

  // Before a NumericError that every replica raises alike: a barrier, so that each finishes this
  // step (its collectives, its update, a parameter-server worker's pulls) before the first error
  // releases the others or its process exits. Then they all hold the same state, and every
  // process reports this error rather than the release's or a lost peer's.
  template <class Replica>
  static void finish_together(Replica& replica) {
    try {
      replica.communicator().barrier();
    } catch (const CommError&) {
    }
  }

  // The settings that a parameter server holds too (it trains no replica): what its updates
  // depend on, with the strategy's own.
  [[gnu::cold]] settings::Fields server_settings() const {
    settings::Fields fields = {
        {"optimizer", std::string(O::kName)},
        {"optimizer option", optimizer::describe_options(optimizer_)},
        {"parameter count", std::to_string(parameter_count_)},
        {"value type", std::same_as<value_type, float> ? std::string("float")
                       : std::same_as<value_type, double>
                           ? std::string("double")
                           : std::to_string(sizeof(value_type)) + "-byte"},
    };
    if constexpr (requires { strategy_.settings(); }) {
      for (settings::Field& field : strategy_.settings()) fields.push_back(std::move(field));
    }
    return fields;
  }

  // The settings every process of the job must share, compared across every replica before the
  // first step (core/settings.hpp): a difference is a ConfigError on every process naming the
  // field and both values. One all-reduce of two doubles per field when they agree. A strategy
  // whose collectives do not reach every process (a parameter server) then has them compared
  // where they do (its servers).
  template <class Replica>
  [[gnu::cold]] void require_same_settings(Replica& replica, const Place& place) const {
    const auto text = [](auto value) { return std::to_string(value); };
    settings::Fields fields = {
        {"seed", text(options_.seed)},
        {"global_batch", text(options_.global_batch)},
        {"micro_batches", text(options_.micro_batches)},
        {"on_nonfinite", std::string(name(options_.on_nonfinite))},
    };
    for (settings::Field& field : server_settings()) fields.push_back(std::move(field));
    fields.insert(fields.end(),
                  {{"data-set size", text(dataset_size_)},
                   {"strategy", std::string(S::kName) + " on " + std::string(Device::kName)},
                   {"replicas", text(strategy_.replicas())},
                   {"local_replicas", text(strategy_.local_replicas())},
                   {"step", text(step_)}});
    std::string who = "replica " + std::to_string(replica.index());
    if constexpr (requires { strategy_.cluster(); }) {
      who = "worker " + std::to_string(strategy_.cluster().rank) + " (" + who + ")";
    }
    Buffer<double> at_place;
    settings::require_same(fields, who, replica.index(), [&](std::span<double> values) {
      if (at_place.size() != values.size()) at_place = Buffer<double>(values.size(), place);
      Device::from_host(place, std::span<const double>(values), at_place.span());
      replica.communicator().all_reduce(at_place.span(), ReduceOp::kMax);
      Device::to_host(place, std::span<const double>(at_place.span()), values);
    });
    if constexpr (requires { replica.present_settings(fields); }) replica.present_settings(fields);
  }

  // The chief's one line at the end of a fit: the mean time per replica in each phase, and the
  // straggler where there is one (core/progress.hpp, fit_summary), by its worker, rank and
  // replica. One all-reduce (a gather: each replica fills its own pair) on every replica.
  template <class Replica>
  void summarize_fit(Replica& replica, const Place& place, const StepTimes& mine,
                     std::uint64_t steps, bool reports) {
    const std::size_t replicas = strategy_.replicas();
    std::vector<double> all(2 * replicas, 0.0);
    all[2 * replica.index()] = mine.compute;
    all[2 * replica.index() + 1] = mine.communication;
    Buffer<double> at_place(all.size(), place);
    Device::from_host(place, std::span<const double>(all), at_place.span());
    replica.communicator().all_reduce(at_place.span(), ReduceOp::kSum);
    Device::to_host(place, std::span<const double>(at_place.span()), std::span<double>(all));
    if (!reports || options_.progress == Progress::kSilent) return;
    const std::size_t locals = strategy_.local_replicas();
    const std::string summary = fit_summary(all, steps, [&](std::size_t index) {
      std::string name = "replica " + std::to_string(index);
      if constexpr (requires { strategy_.cluster(); }) {
        // Workers are numbered alike in the cluster and in the replicas' order.
        const std::string worker = std::to_string(index / locals);
        name = "worker " + worker + " (rank " + worker + "), " + name;
      }
      return name;
    });
    std::printf("%s\n", summary.c_str());
    std::fflush(stdout);
  }

  S strategy_;
  O optimizer_;
  Options options_;
  std::size_t parameter_count_ = 0;
  std::vector<M> models_;  // one per local replica, at its place
  std::vector<Buffer<value_type>> optimizer_states_;
  std::uint64_t step_ = 0;
  std::size_t dataset_size_ = 0;          // fixed by the first fit or by restore
  std::optional<std::string> unsettled_;  // why the state may be inconsistent (require_settled)
  std::unique_ptr<trace::Recorder> recorder_;  // when tracing (Options::trace)
  std::unique_ptr<preemption::Watch> watch_;   // when Options::preemption.enabled
};

}  // namespace cohort
