// trainer::Run<M, S, O>: what one process's Trainer holds between fits. The Trainer (its face,
// trainer.hpp) owns one; the room's other headers read and advance it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "cohort/core/model.hpp"
#include "cohort/core/sharding.hpp"
#include "cohort/core/trace.hpp"
#include "cohort/device/device.hpp"
#include "cohort/strategy/strategy.hpp"
#include "cohort/trainer/options.hpp"

namespace cohort::trainer {

namespace detail {
// The model's types, as the Trainer declares its members with them. For a type that is not a
// Model they are stand-ins, so that the Trainer's static_assert is the one error its user reads.
template <class M>
struct ModelTypes {
  using value_type = float;
  struct batch_type {};
};
template <Model M>
struct ModelTypes<M> {
  using value_type = ValueType<M>;
  using batch_type = BatchType<M>;
};
}  // namespace detail

template <class M, class S, class O>
struct Run {
  using Model = M;
  using Strategy = S;
  using Optimizer = O;
  using value_type = typename detail::ModelTypes<M>::value_type;
  using batch_type = typename detail::ModelTypes<M>::batch_type;
  using Device = strategy::DeviceOf<S>;
  using Place = typename Device::Place;
  template <class T>
  using Buffer = device::Buffer<Device, T>;

  Run(S chosen_strategy, O chosen_optimizer, TrainerOptions chosen_options)
      : strategy(std::move(chosen_strategy)),
        optimizer(std::move(chosen_optimizer)),
        options(std::move(chosen_options)) {}

  S strategy;
  O optimizer;
  TrainerOptions options;
  std::size_t parameter_count = 0;
  std::vector<M> models;  // one per local replica, at its place
  std::vector<Buffer<value_type>> optimizer_states;
  std::uint64_t step = 0;        // steps applied since the run began, restores included
  // A process started again for a lost worker's place goes on from a later step than its fit
  // began at (trainer/elastic.hpp, rejoin_fit): that first step, the job's, which its settings
  // present (trainer/job_settings.hpp).
  std::optional<std::uint64_t> rejoined_from{};
  std::size_t dataset_size = 0;  // fixed by the first fit or by restore
  std::unique_ptr<trace::Recorder> recorder;  // when tracing (Options::trace)

  Place place(std::size_t local) const { return strategy::place_of(strategy, local); }

  // The data's order and deal for `examples` training examples over the job's replicas.
  sharding::Plan plan(std::size_t examples) const {
    return sharding::Plan(examples, options.global_batch, options.micro_batches,
                          strategy.replicas(), strategy.local_replicas(), shares(),
                          strategy::FoldsAnyDeal<S>);
  }

  // The workers' shares of the micro-batches (sharding::Deal): one per worker, or the strategy's
  // where it keeps the shares of workers it lost (strategy::KeepsShares).
  sharding::Shares shares() const {
    if constexpr (strategy::KeepsShares<S>) return strategy.shares();
    return sharding::Shares::of(strategy.replicas() / strategy.local_replicas());
  }

  // Tells a strategy that folds any deal (strategy::FoldsAnyDeal) the micro-batches of each of
  // its replicas: at the start, and after an elastic job's regroup. A process that runs no
  // replica (a parameter server) folds nothing and is dealt nothing.
  void deal() {
    if constexpr (strategy::FoldsAnyDeal<S>) {
      if (strategy.local_replicas() == 0) return;
      strategy.use_deal(sharding::Deal(options.micro_batches, strategy.replicas(),
                                       strategy.local_replicas(), shares()));
    }
  }

  // Replica `index` as progress and errors name it: "worker 1 (rank 1), replica 2" where the job is
  // processes (workers are numbered alike in the cluster and in the replicas' order), else
  // "replica 2".
  std::string replica_name(std::size_t index) const {
    std::string name = "replica " + std::to_string(index);
    if constexpr (strategy::SpansProcesses<S>) {
      const std::string worker = std::to_string(index / strategy.local_replicas());
      name = "worker " + worker + " (rank " + worker + "), " + name;
    }
    return name;
  }

  // This process's name and track in a timeline: its role and rank where the job is processes,
  // else one process.
  std::pair<std::string, int> trace_identity() const {
    if constexpr (strategy::SpansProcesses<S>) {
      const auto& spec = strategy.cluster();
      const bool server = spec.role == Role::kParameterServer;
      // Servers' tracks after every worker's in a merged timeline.
      constexpr int kFirstServerTrack = 1 << 16;
      return {(server ? "ps " : "worker ") + std::to_string(spec.rank),
              server ? kFirstServerTrack + spec.rank : spec.rank};
    } else {
      return {"process", 0};
    }
  }
};

}  // namespace cohort::trainer
