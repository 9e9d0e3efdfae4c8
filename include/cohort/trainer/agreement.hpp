// trainer::Agreement: the job's small agreements (the loss window, the preemption vote, the
// settings check, the fit's summary), each an all-reduce of a few doubles over every replica of
// every process. The doubles live on the host; the communicator reduces memory at the replica's
// place, so they travel through a buffer there, kept between agreements.
#pragma once

#include <span>

#include "cohort/core/reduce_op.hpp"
#include "cohort/device/device.hpp"

namespace cohort::trainer {

template <device::Device D>
class Agreement {
 public:
  explicit Agreement(typename D::Place place) : place_(place) {}

  // Leaves in `values`, on every replica, op over every replica's `values`.
  template <class Communicator>
  void all_reduce(Communicator& communicator, std::span<double> values, ReduceOp op) {
    if (at_place_.size() < values.size()) {
      at_place_ = device::Buffer<D, double>(values.size(), place_);
    }
    const std::span<double> there = at_place_.span().first(values.size());
    D::from_host(place_, std::span<const double>(values), there);
    communicator.all_reduce(there, op);
    D::to_host(place_, std::span<const double>(there), values);
  }

 private:
  typename D::Place place_;
  device::Buffer<D, double> at_place_;
};

}  // namespace cohort::trainer
