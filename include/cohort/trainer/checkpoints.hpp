// The Trainer's checkpoints: the run's state written and read (checkpoint/checkpoint.hpp), by the
// chief or by a strategy that saves its own way (strategy::SavesOwnCheckpoint: a parameter
// server's servers write a shard each and the chief the manifest).
#pragma once

#include <cstdio>
#include <exception>
#include <filesystem>
#include <span>
#include <sstream>
#include <string>
#include <string_view>
#include <system_error>

#include "cohort/checkpoint/checkpoint.hpp"
#include "cohort/core/error.hpp"
#include "cohort/core/reduce_op.hpp"
#include "cohort/core/trace.hpp"
#include "cohort/device/cpu.hpp"
#include "cohort/strategy/strategy.hpp"
#include "cohort/trainer/run.hpp"

namespace cohort::trainer {

// Into `state`: the training state of this process's first replica after `step` steps, on the
// host, as a checkpoint holds it; without `values` (or without replicas), the run's settings and
// step only.
template <class R>
void fill_checkpoint_state(const R& run, std::uint64_t step,
                           checkpoint::TrainingState<typename R::value_type>& state,
                           bool values = true) {
  using T = typename R::value_type;
  state.optimizer = R::Optimizer::kName;
  if (values && !run.models.empty()) {
    const auto parameters =
        ModelTraits<typename R::Model>::parameters(const_cast<typename R::Model&>(run.models[0]));
    state.parameters.resize(parameters.size());
    R::Device::to_host(run.place(0), std::span<const T>(parameters),
                       std::span<T>(state.parameters));
    state.optimizer_state.resize(run.optimizer_states[0].size());
    R::Device::to_host(run.place(0), run.optimizer_states[0].span(),
                       std::span<T>(state.optimizer_state));
  }
  state.step = step;
  state.seed = run.options.seed;
  state.global_batch = run.options.global_batch;
  state.micro_batches = run.options.micro_batches;
  state.dataset_size = run.dataset_size;
  state.schedule = run.options.schedule.description();
  state.gradient_sum = name(strategy::gradient_sum_of(run.strategy));
}

// The run's state as fill_checkpoint_state leaves it, at run.step.
template <class R>
checkpoint::TrainingState<typename R::value_type> checkpoint_state(const R& run,
                                                                   bool values = true) {
  checkpoint::TrainingState<typename R::value_type> state;
  fill_checkpoint_state(run, run.step, state, values);
  return state;
}

// A state with an infinity or NaN is never saved: it could only be restored to fail again. The
// error for the state after `step` steps whose value `first` of `where` is not finite.
inline NumericError nonfinite_state_error(NumericError::Where where, std::uint64_t step,
                                          std::size_t first, const std::filesystem::path& file) {
  return NumericError(where, step == 0 ? 0 : step - 1, first,
                      "not written to " + file.string() +
                          ": a training state with infinities or NaN is never saved; restore "
                          "an earlier checkpoint, or train with on_nonfinite = skip_step");
}

template <class T>
void refuse_nonfinite(std::span<const T> values, NumericError::Where where, std::uint64_t step,
                      const std::filesystem::path& file) {
  if (const std::size_t first = device::cpu::first_nonfinite(values); first != values.size()) {
    throw nonfinite_state_error(where, step, first, file);
  }
}

// Before a process writes checkpoints into `directory` (checkpoint.directory).
inline void create_checkpoint_directory(const std::filesystem::path& directory) {
  std::error_code error;
  std::filesystem::create_directories(directory, error);
  if (error) {
    throw CheckpointError("checkpoint.directory " + directory.string() +
                          " cannot be created: " + error.message());
  }
}

// The chief's write of a whole state; a state with an infinity or NaN is refused.
template <class T>
void write_state(const checkpoint::TrainingState<T>& state, const std::filesystem::path& file,
                 std::uint64_t step) {
  refuse_nonfinite(std::span<const T>(state.parameters), NumericError::Where::kParameters, step,
                   file);
  refuse_nonfinite(std::span<const T>(state.optimizer_state), NumericError::Where::kOptimizerState,
                   step, file);
  checkpoint::write(file, state);
}

// Trainer::save on every process: returns once `file` is complete, or throws on every process.
template <class R>
void write_checkpoint(const R& run, const std::filesystem::path& file) {
  using T = typename R::value_type;
  const trace::Span span(run.recorder.get(), trace::Phase::kCheckpoint, {.step = run.step});
  if constexpr (strategy::SavesOwnCheckpoint<typename R::Strategy, T>) {
    // The values are the servers' to write: the strategy gets the run's settings and step.
    run.strategy.save(file, checkpoint_state(run, false), run.parameter_count);
  } else {
    std::exception_ptr failure;
    if (run.strategy.is_chief()) {
      try {
        write_state(checkpoint_state(run), file, run.step);
      } catch (...) {
        failure = std::current_exception();
      }
    }
    // Across processes every one hears how the chief's write went: none returns before the
    // file is complete (a restore right after finds it), and all fail when it is not.
    if constexpr (strategy::SharesSaveOutcome<typename R::Strategy>) {
      const std::string outcome = run.strategy.save_outcome(file, failure ? what_of(failure) : "");
      if (!failure && !outcome.empty()) throw checkpoint::not_written_by_chief(file, outcome);
    }
    if (failure) std::rethrow_exception(failure);
  }
}

// Trainer::restore: everything is checked before anything is changed.
template <class R>
void read_checkpoint(R& run, const std::filesystem::path& file) {
  using T = typename R::value_type;
  using O = typename R::Optimizer;
  const auto state = checkpoint::read<T>(file);
  const auto expect = [&](std::string_view field, const auto& in_file, const auto& here) {
    if (in_file == here) return;
    std::ostringstream why;
    why << "checkpoint " << file.string() << ": " << field << " is " << in_file
        << " in the file but " << here << " in this trainer";
    throw CheckpointError(why.str());
  };
  expect("optimizer", state.optimizer, std::string(O::kName));
  expect("parameter count", state.parameters.size(), run.parameter_count);
  expect("optimizer state size", state.optimizer_state.size(),
         O::kStateSlots * run.parameter_count);
  expect("seed", state.seed, run.options.seed);
  expect("global_batch", state.global_batch, std::uint64_t{run.options.global_batch});
  expect("micro_batches", state.micro_batches, std::uint64_t{run.options.micro_batches});
  expect("schedule", state.schedule, run.options.schedule.description());
  expect("gradient sum (the wire's)", state.gradient_sum,
         std::string(name(strategy::gradient_sum_of(run.strategy))));
  for (std::size_t local = 0; local < run.models.size(); ++local) {
    R::Device::from_host(run.place(local), std::span<const T>(state.parameters),
                         ModelTraits<typename R::Model>::parameters(run.models[local]));
    R::Device::from_host(run.place(local), std::span<const T>(state.optimizer_state),
                         run.optimizer_states[local].span());
  }
  // A parameter server keeps its shard of the restored state (for a save before the next fit).
  if constexpr (strategy::SavesOwnCheckpoint<typename R::Strategy, T>) run.strategy.restored(state);
  run.step = state.step;
  run.dataset_size = state.dataset_size;
}

// After a fit that stopped for preemption, on every process: the save to `file` (none when it is
// empty), and the chief's line about it.
template <class R>
void save_preempted_to(const R& run, const std::filesystem::path& file) {
  if (!file.empty()) write_checkpoint(run, file);
  if (!run.strategy.is_chief()) return;
  const std::string saved = file.empty() ? std::string(
                                               "nothing saved (no Options::preemption.checkpoint "
                                               "and no Options::checkpoint.directory)")
                                         : "saved to " + file.string() + ": run again to continue";
  std::fprintf(stderr, "cohort: preempted: the job stopped before step %llu; %s\n",
               static_cast<unsigned long long>(run.step), saved.c_str());
}

}  // namespace cohort::trainer
