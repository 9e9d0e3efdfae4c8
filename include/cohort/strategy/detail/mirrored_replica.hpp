// The replica that Mirrored and MultiWorkerMirrored hand to the Trainer's step: its global index,
// its communicator over every replica of the job, and the all-reduce update.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>

#include "cohort/strategy/detail/all_reduce_update.hpp"
#include "cohort/strategy/strategy.hpp"

namespace cohort::strategy::detail {

template <class Communicator>
class MirroredReplica {
 public:
  MirroredReplica(std::size_t index, Communicator communicator)
      : index_(index), communicator_(std::move(communicator)) {}

  std::size_t index() const { return index_; }
  Communicator& communicator() { return communicator_; }

  // Replicas built in other processes take the chief's parameters; the optimizer state and the
  // step are already the same everywhere (a fresh run, or the same checkpoint restored).
  template <class T>
  void start(std::span<T> parameters, std::span<T> /*optimizer_state*/, std::uint64_t /*step*/) {
    communicator_.broadcast(parameters, 0);
  }

  template <class T, class O>
  void update(Update<T, O>& update) {
    all_reduce_update(communicator_, update);
  }

 private:
  std::size_t index_;
  Communicator communicator_;
};

}  // namespace cohort::strategy::detail
