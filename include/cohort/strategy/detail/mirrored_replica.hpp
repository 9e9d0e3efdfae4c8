// The replica that Mirrored and MultiWorkerMirrored hand to the Trainer's step: its global index,
// its communicator over every replica of the job, its place on its device, and the all-reduce
// update.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>

#include "cohort/device/cpu.hpp"
#include "cohort/strategy/detail/all_reduce_update.hpp"
#include "cohort/strategy/strategy.hpp"

namespace cohort::strategy::detail {

template <class Communicator, device::Device D = device::Cpu>
class MirroredReplica {
 public:
  using Place = typename D::Place;

  MirroredReplica(std::size_t index, Communicator communicator, Place place = {})
      : index_(index), communicator_(std::move(communicator)), place_(place) {}

  std::size_t index() const { return index_; }
  Communicator& communicator() { return communicator_; }
  const Place& place() const { return place_; }

  // Replicas built in other processes take the chief's parameters; the optimizer state and the
  // step are already the same everywhere (a fresh run, or the same checkpoint restored).
  template <class T>
  void start(std::span<T> parameters, std::span<T> /*optimizer_state*/, std::uint64_t /*step*/) {
    communicator_.broadcast(parameters, 0);
  }

  template <class T, class O>
  void update(Update<T, O>& update) {
    all_reduce_update<D>(communicator_, update, place_);
  }

 private:
  std::size_t index_;
  Communicator communicator_;
  [[no_unique_address]] Place place_;
};

}  // namespace cohort::strategy::detail
