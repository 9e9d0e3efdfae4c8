// Mirrored<device::Cuda, collective::Nccl>: one replica per GPU of this process. For cohort::cuda
// users (it includes the CUDA runtime and NCCL headers).
//
//   cohort::strategy::Mirrored<cohort::device::Cuda, cohort::collective::Nccl> gpus({});
//   cohort::Trainer trainer(model, std::move(gpus), cohort::optimizer::Adam({...}), {...});
//
// Replica r runs on GPU r (an index among the GPUs that CUDA_VISIBLE_DEVICES leaves visible), on
// its own thread, which makes GPU r current before anything else, and on its own stream, which
// the strategy owns for its whole life. The Trainer places the replica's model there
// (ModelTraits<M>::replicate(prototype, place), core/model.hpp) with its gradient fold and
// optimizer state; the model's forward_backward, the fold, the all-reduce
// (collective::NcclCommunicator on that stream) and the optimizer step (cuda::step) all run in
// that stream's order. With deterministic NCCL (the default) the all-reduce sums the replicas in
// the canonical tree, and every kernel computes the CPU's operations in the CPU's order, so the
// parameters are the bits of Mirrored<> on the host with the same seed, for any replica count
// (given a model whose CUDA forward_backward computes its CPU twin's bits).
//
// Options:
//   replicas       GPUs to use, 0 .. replicas-1. 0 (the default): every visible GPU. More than
//                  are visible, or none visible, is a ConfigError naming replicas (and why there
//                  is no GPU: device::cuda::unavailable()).
//   timeout        how long a replica waits in a collective, or in the NCCL group's set-up, for
//                  the others before it fails with a CommError. A replica that fails (its
//                  forward_backward throws, say) aborts the group: the others fail at once, with
//                  its reason, as with Mirrored<>, and so does a replica whose communicator is
//                  being finalized when the other fails. Also the longest that ending a
//                  communicator (NCCL's finalize; ncclCommAbort after it) or a replica's stream
//                  (its last work) may wait.
//   deterministic  true (default): the all-reduce of collective::NcclCommunicator's deterministic
//                  mode, the CPU's bits. false: ncclAllReduce, faster on many GPUs, in an order
//                  NCCL chooses (bits may differ from the CPU and between machines).
//
// Requires: link cohort::cuda, and compile one .cu that includes cohort/cuda/instantiate.cuh.
// Losses travel as doubles (collective::Nccl's float64), once per progress window.
#pragma once

#include <cuda_runtime_api.h>

#include <chrono>
#include <cstddef>
#include <exception>
#include <string>
#include <string_view>
#include <vector>

#include "cohort/collective/nccl.hpp"
#include "cohort/core/options.hpp"
#include "cohort/cuda/launch.hpp"
#include "cohort/device/cuda.hpp"
#include "cohort/strategy/detail/mirrored_replica.hpp"
#include "cohort/strategy/detail/replica_threads.hpp"
#include "cohort/strategy/mirrored.hpp"
#include "cohort/strategy/strategy.hpp"

namespace cohort::strategy {

template <>
class Mirrored<device::Cuda, collective::Nccl> {
 public:
  static constexpr std::string_view kName = "mirrored";
  using Device = device::Cuda;
  using Communicator = collective::NcclCommunicator;
  using Replica = detail::MirroredReplica<Communicator, device::Cuda>;

  struct Options {
    std::size_t replicas = 0;
    std::chrono::milliseconds timeout{std::chrono::minutes(5)};
    bool deterministic = true;
  };

  explicit Mirrored(Options options) : options_(options) {
    options::require_positive("timeout", options_.timeout.count());
    const auto visible = static_cast<std::size_t>(device::cuda::device_count());
    if (visible == 0) {
      options::reject("replicas", options_.replicas,
                      "needs one GPU per replica, and this process has none: " +
                          device::cuda::unavailable() + device::cuda::visible_devices());
    }
    if (options_.replicas > visible) {
      options::reject("replicas", options_.replicas,
                      "needs one GPU per replica; this process sees " + std::to_string(visible) +
                          device::cuda::visible_devices());
    }
    const std::size_t count = options_.replicas == 0 ? visible : options_.replicas;
    if (options_.deterministic && count > cuda::kMaxTreeInputs) {
      options::reject("replicas", count,
                      "deterministic NCCL combines at most 64 GPUs (cuda::kMaxTreeInputs)");
    }
    streams_.reserve(count);
    // A stream's end waits for its work at most as long as a collective may take.
    for (std::size_t r = 0; r < count; ++r) {
      streams_.emplace_back(static_cast<int>(r), options_.timeout);
    }
  }

  std::size_t replicas() const { return streams_.size(); }
  std::size_t local_replicas() const { return streams_.size(); }
  std::size_t first_local_replica() const { return 0; }
  bool is_chief() const { return true; }
  const Options& options() const { return options_; }

  // Replica local_index's GPU and stream.
  device::cuda::Place place(std::size_t local_index) const {
    return streams_.at(local_index).place();
  }

  template <class Body>
  void run(Body&& body) {
    // A fresh group per run: a communicator that saw a failure stays aborted.
    const collective::Nccl group({.ranks = static_cast<int>(replicas()),
                                  .timeout = options_.timeout,
                                  .deterministic = options_.deterministic});
    detail::run_replica_threads(
        replicas(),
        [&](std::size_t index) {
          try {
            const device::cuda::Place where = place(index);
            device::cuda::use(where.device);  // this thread drives GPU `index` from here on
            return Replica(index, group.communicator(static_cast<int>(index), where.stream), where);
          } catch (...) {
            // The others are waiting in the group's set-up for this one: release them.
            group.abort(static_cast<int>(index), what_of(std::current_exception()));
            throw;
          }
        },
        body);
  }

 private:
  Options options_;
  std::vector<device::cuda::Stream> streams_;  // replica r's, on GPU r
};

static_assert(Strategy<Mirrored<device::Cuda, collective::Nccl>>);
// Its capabilities (strategy.hpp).
static_assert(HasPlaces<Mirrored<device::Cuda, collective::Nccl>>);
static_assert(ChecksGradient<Mirrored<device::Cuda, collective::Nccl>, float, optimizer::Sgd>);
static_assert(AbandonsStep<Mirrored<device::Cuda, collective::Nccl>>);
static_assert(LendsGradientStorage<Mirrored<device::Cuda, collective::Nccl>, float>);
static_assert(SnapshotsBetweenSteps<Mirrored<device::Cuda, collective::Nccl>, float>);

}  // namespace cohort::strategy
