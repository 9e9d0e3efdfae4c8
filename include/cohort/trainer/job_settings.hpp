// One job, one set of settings. Before the first step of every fit, every replica of every process
// of a job of several (strategy::SpansProcesses; a one-process job's replicas share one Trainer,
// so nothing can differ) compares (core/settings.hpp; one all-reduce of two doubles per field when
// all agree): seed, global_batch, micro_batches, on_nonfinite, the optimizer's name and each of
// its options, the learning-rate schedule, the parameter count, the value type, the gradient sum
// (sum, or sum_bf16 under wire bf16: collective/wire.hpp), the data-set size, the strategy and its
// device, replicas, local_replicas and the run's step (processes restored from different
// checkpoints). A difference is a ConfigError on every process, before anything else travels, that
// names the field and both values with a process holding each: "micro_batches is 8 on worker 0
// (replica 0) but 4 on worker 1 (replica 2)".
//
// Under ParameterServer the strategy's own settings join them (strategy::PresentsSettings:
// consistency, and the options backup_workers, min_shard_bytes, alignment, chunk_bytes), Sync
// workers compare among themselves as above, and then every worker, Async and BoundedStaleness
// included (whose collectives never leave their process), presents its settings to every server
// (strategy/parameter_server/protocol.hpp). A server compares the ones it holds itself (the
// optimizer and its options, the parameter count, the value type, the gradient sum, the consistency
// and the parameter server options, the schedule) with its own, and the others with the chief's:
// "optimizer option learning_rate is 0.01 on parameter server 1 but 0.003 on worker 0", "seed is 11
// on worker 0 but 12 on worker 2". The ConfigError comes on that server and on every worker, before
// any worker gets its first parameters; a server that agreed learns it when the chief leaves, and
// its CommError quotes it.
#pragma once

#include <concepts>
#include <span>
#include <string>
#include <utility>

#include "cohort/core/reduce_op.hpp"
#include "cohort/core/settings.hpp"
#include "cohort/optimizer/optimizer.hpp"
#include "cohort/strategy/strategy.hpp"
#include "cohort/trainer/agreement.hpp"

namespace cohort::trainer {

// The settings that a parameter server holds too (it trains no replica): what its updates
// depend on, with the strategy's own.
template <class R>
[[gnu::cold]] settings::Fields server_settings(const R& run) {
  using T = typename R::value_type;
  settings::Fields fields = {
      {"optimizer", std::string(R::Optimizer::kName)},
      {"optimizer option", optimizer::describe_options(run.optimizer)},
      {"schedule", run.options.schedule.description()},
      {"parameter count", std::to_string(run.parameter_count)},
      {"value type", std::same_as<T, float>    ? std::string("float")
                     : std::same_as<T, double> ? std::string("double")
                                               : std::to_string(sizeof(T)) + "-byte"},
      {"gradient sum", std::string(name(strategy::gradient_sum_of(run.strategy)))},
  };
  if constexpr (strategy::PresentsSettings<typename R::Strategy>) {
    for (settings::Field& field : run.strategy.settings()) fields.push_back(std::move(field));
  }
  return fields;
}

// Before the first step, on every replica of a job of several processes: a difference is a
// ConfigError on every process naming the field and both values. At the start of every later
// segment of the fit (trainer/segments.hpp) only a strategy that presents its settings does so
// again (`compare` false): a parameter server's servers take them at every start.
template <class R, class Replica>
[[gnu::cold]] void require_same_settings(const R& run, Replica& replica,
                                         Agreement<typename R::Device>& agreement, bool compare) {
  using S = typename R::Strategy;
  const auto text = [](auto value) { return std::to_string(value); };
  settings::Fields fields = {
      {"seed", text(run.options.seed)},
      {"global_batch", text(run.options.global_batch)},
      {"micro_batches", text(run.options.micro_batches)},
      {"on_nonfinite", std::string(name(run.options.on_nonfinite))},
  };
  for (settings::Field& field : server_settings(run)) fields.push_back(std::move(field));
  fields.insert(fields.end(),
                {{"data-set size", text(run.dataset_size)},
                 {"strategy", std::string(S::kName) + " on " + std::string(R::Device::kName)},
                 {"replicas", text(run.strategy.replicas())},
                 {"local_replicas", text(run.strategy.local_replicas())},
                 {"step", text(run.rejoined_from.value_or(run.step))}});
  const std::string who = "worker " + std::to_string(run.strategy.cluster().rank) + " (replica " +
                          std::to_string(replica.index()) + ")";
  if (compare) {
    settings::require_same(fields, who, replica.index(), [&](std::span<double> values) {
      agreement.all_reduce(replica.communicator(), values, ReduceOp::kMax);
    });
  }
  if constexpr (strategy::PresentsSettings<S>) replica.present_settings(fields);
}

}  // namespace cohort::trainer
