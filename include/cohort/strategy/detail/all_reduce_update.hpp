// The synchronous update of the mirrored strategies: sum the replicas' gradients with
// the communicator (canonical tree), then apply the optimizer to this replica's own copy. Every
// replica computes the same bits, so the copies never drift apart. The work runs at the replica's
// place on its device (device/device.hpp): on the host for device::Cpu, on the replica's stream
// for device::Cuda, where the spans of the update are device memory.
#pragma once

#include <chrono>
#include <span>

#include "cohort/core/reduce_op.hpp"
#include "cohort/optimizer/optimizer.hpp"
#include "cohort/strategy/strategy.hpp"

namespace cohort::strategy::detail {

// Out of line on purpose, as the Trainer's fold addition (trainer.hpp, AddInto): inlined into the
// step's loop it changes how GCC compiles the model's forward_backward inlined there.
template <device::Device D, class Communicator, class T, class O>
[[gnu::noinline]] void all_reduce_update(Communicator& communicator, Update<T, O>& update,
                                         const typename D::Place& place) {
  // What the replica started before (its forward, backward and fold) counts as compute, not as
  // communication; a no-op on the host.
  D::synchronize(place);
  const auto start = std::chrono::steady_clock::now();
  communicator.all_reduce(update.gradient_sum, ReduceOp::kSum);
  update.communication_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  double scale = update.inverse_batch;
  if (const double max_norm = update.optimizer.options().max_gradient_norm; max_norm > 0.0) {
    scale *= optimizer::clipping_factor(
        D::sum_of_squares(place, std::span<const T>(update.gradient_sum)), update.inverse_batch,
        max_norm);
  }
  D::step(place, update.optimizer, update.parameters, std::span<const T>(update.gradient_sum),
          update.optimizer_state,
          optimizer::StepContext{.step = update.step + 1, .gradient_scale = scale});
}

}  // namespace cohort::strategy::detail
