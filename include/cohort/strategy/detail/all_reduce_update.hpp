// The synchronous update of the mirrored strategies: sum the replicas' gradients with
// the communicator (canonical tree), then apply the optimizer to this replica's own copy. Every
// replica computes the same bits, so the copies never drift apart.
#pragma once

#include <chrono>
#include <span>

#include "cohort/core/reduce_op.hpp"
#include "cohort/device/cpu.hpp"
#include "cohort/optimizer/optimizer.hpp"
#include "cohort/strategy/strategy.hpp"

namespace cohort::strategy::detail {

template <class Communicator, class T, class O>
void all_reduce_update(Communicator& communicator, Update<T, O>& update) {
  const auto start = std::chrono::steady_clock::now();
  communicator.all_reduce(update.gradient_sum, ReduceOp::kSum);
  update.communication_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  double scale = update.inverse_batch;
  if (const double max_norm = update.optimizer.options().max_gradient_norm; max_norm > 0.0) {
    scale *= optimizer::clipping_factor(
        device::cpu::sum_of_squares<T>(std::span<const T>(update.gradient_sum)),
        update.inverse_batch, max_norm);
  }
  update.optimizer.step(update.parameters, std::span<const T>(update.gradient_sum),
                        update.optimizer_state,
                        optimizer::StepContext{.step = update.step + 1, .gradient_scale = scale});
}

}  // namespace cohort::strategy::detail
