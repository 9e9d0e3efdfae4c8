// Mirrored: in-graph replication in one process, one replica per local device.
//
// Each replica is a thread holding its own copy of the model. After every step the replicas'
// gradients are all-reduced by the collective (in the canonical tree order), and every replica
// applies the same update to its copy, so the copies stay identical.
//
//   cohort::strategy::Mirrored<> mirrored({.replicas = 4});     // host replicas: this header
//   cohort::strategy::Mirrored<cohort::device::Cuda, cohort::collective::Nccl> gpus({});
//       // one replica per GPU: strategy/mirrored_cuda.hpp (cohort::cuda), same bits
//
// The device and the collective go together: device::Cpu with collective::Local (the default),
// device::Cuda with collective::Nccl. Any other pair is refused at compile time with a sentence.
//
// Options:
//   replicas   number of replicas (threads), at least 1 and at most the Trainer's micro_batches:
//              a count that does not divide them is dealt micro-batches as the reduction's tree
//              allows (core/sharding.hpp, Deal; 8 over 3 replicas: 2, 2 and 4), with the same bits
//   timeout    how long a replica waits in a collective for the others before the step fails
//              with a CommError naming it (a replica stuck in user code is then reported, not
//              waited for forever); left at its default, COHORT_TIMEOUT sets it
#pragma once

#include <chrono>
#include <cstddef>
#include <string_view>
#include <utility>
#include <vector>

#include "cohort/collective/local.hpp"
#include "cohort/core/options.hpp"
#include "cohort/core/sharding.hpp"
#include "cohort/device/cpu.hpp"
#include "cohort/strategy/detail/environment_options.hpp"
#include "cohort/strategy/detail/mirrored_replica.hpp"
#include "cohort/strategy/detail/replica_threads.hpp"
#include "cohort/strategy/strategy.hpp"

// Declared only, so that the sentences below can name them without a CUDA header: defined in
// device/cuda.hpp and collective/nccl.hpp.
namespace cohort::device {
struct Cuda;
}
namespace cohort::collective {
class Nccl;
}

namespace cohort::strategy {

// Host replicas. Mirrored<device::Cuda, collective::Nccl> is a specialization of its own
// (strategy/mirrored_cuda.hpp).
template <device::Device Device = device::Cpu, class Collective = collective::Local>
class Mirrored {
  static_assert(!std::same_as<Device, device::Cuda> || !std::same_as<Collective, collective::Nccl>,
                "cohort: Mirrored<device::Cuda, collective::Nccl> is defined in "
                "cohort/strategy/mirrored_cuda.hpp (cohort::cuda): include it.");
  static_assert(!std::same_as<Device, device::Cuda> || std::same_as<Collective, collective::Nccl>,
                "cohort: Mirrored on device::Cuda needs collective::Nccl, the collective over GPU "
                "memory: write Mirrored<device::Cuda, collective::Nccl> "
                "(cohort/strategy/mirrored_cuda.hpp).");
  static_assert(std::same_as<Device, device::Cuda> || !std::same_as<Collective, collective::Nccl>,
                "cohort: collective::Nccl reduces GPU memory, and Mirrored on device::Cpu keeps "
                "the replicas on the host: use Mirrored<> (collective::Local), or "
                "Mirrored<device::Cuda, collective::Nccl> for GPU replicas.");
  static_assert(std::same_as<Device, device::Cpu> || std::same_as<Device, device::Cuda>,
                "cohort: Mirrored runs host replicas on device::Cpu, and GPU replicas on "
                "device::Cuda with collective::Nccl.");

 public:
  static constexpr std::string_view kName = "mirrored";

  struct Options {
    std::size_t replicas = 1;
    std::chrono::milliseconds timeout{std::chrono::minutes(5)};
  };

  explicit Mirrored(Options options) : options_(detail::with_environment(options)) {
    options::require_positive("replicas", options_.replicas);
    options::require_positive("timeout", options_.timeout.count());
  }

  std::size_t replicas() const { return options_.replicas; }
  std::size_t local_replicas() const { return options_.replicas; }
  std::size_t first_local_replica() const { return 0; }
  bool is_chief() const { return true; }
  const Options& options() const { return options_; }

  using Communicator = decltype(std::declval<Collective&>().communicator(0));

  using Replica = detail::MirroredReplica<Communicator>;

  // The micro-batches each replica folds (strategy::FoldsAnyDeal): the group folds each replica as
  // a node of its count.
  void use_deal(const sharding::Deal& deal) {
    leaf_counts_.assign(deal.counts().begin(), deal.counts().end());
  }

  template <class Body>
  void run(Body&& body) {
    // A fresh group per run: a group that saw a failure stays poisoned.
    Collective group({.ranks = static_cast<int>(options_.replicas),
                      .timeout = options_.timeout,
                      .leaf_counts = leaf_counts_});
    detail::run_replica_threads(
        options_.replicas,
        [&](std::size_t index) {
          return Replica(index, group.communicator(static_cast<int>(index)));
        },
        body);
  }

 private:
  Options options_;
  std::vector<std::size_t> leaf_counts_;  // empty: one each
};

static_assert(Strategy<Mirrored<>>);
// Its capabilities (strategy.hpp).
static_assert(ChecksGradient<Mirrored<>, float, optimizer::Sgd>);
static_assert(AbandonsStep<Mirrored<>>);
static_assert(LendsGradientStorage<Mirrored<>, float>);
static_assert(SnapshotsBetweenSteps<Mirrored<>, float>);
static_assert(FoldsAnyDeal<Mirrored<>>);

}  // namespace cohort::strategy
