// The replica that Mirrored and MultiWorkerMirrored hand to the Trainer's step: its global index,
// its communicator over every replica of the job, its place on its device, and the synchronous
// update: the gradient's buckets all-reduced as they become final (overlapping the rest of the
// backward pass where the communicator can), then the optimizer applied to this replica's own
// copy. Every replica computes the same bits, so the copies never drift apart. The work runs at
// the replica's place on its device (device/device.hpp): on the host for device::Cpu, on the
// replica's stream for device::Cuda, where the spans of the update are device memory.
#pragma once

#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

#include "cohort/collective/collective.hpp"
#include "cohort/core/reduce_op.hpp"
#include "cohort/core/trace.hpp"
#include "cohort/device/cpu.hpp"
#include "cohort/optimizer/optimizer.hpp"
#include "cohort/strategy/detail/gradient_buckets.hpp"
#include "cohort/strategy/strategy.hpp"

namespace cohort::strategy::detail {

// Clipping, the non-finite check and the optimizer step on a reduced gradient sum, at the
// replica's place. Every replica holds the same reduced gradient, so every replica decides the
// same way without a word to the others. The check rides on a pass that reads the gradient anyway:
//   clipping        the sum of squares, finite when every element is (for float, half and
//                   bfloat16 always; a double gradient whose squares overflow is looked into);
//                   nothing is applied to a non-finite gradient, under either policy
//   kRaise          the optimizer's update (D::step_finite), which is applied; the Trainer throws
//   kSkipStep       one read of the gradient before the update (D::first_nonfinite): the only
//                   case with a pass of its own, as the decision must precede every write
// Out of line on purpose, as the Trainer's fold addition (trainer.hpp, AddInto): inlined into the
// step's loop it changes how GCC compiles the model's forward_backward inlined there. Hot, because
// out of line GCC guesses its frequency from the one call in train_replica, which follows the
// model's loops: guessed never executed, it was compiled for size, the optimizer's loop scalar, and
// Adam took 5.5 ms of an 11 ms step of the examples' MLP (1.4 ms vectorized; docs/benchmarks.md,
// "The examples' Eigen MLP").
template <device::Device D, class T, class O>
[[gnu::noinline, gnu::hot]] StepResult apply_update(const Update<T, O>& update,
                                                    const typename D::Place& place) {
  const trace::Span span(trace::current(), trace::Phase::kOptimizer, {.step = update.step});
  const std::span<const T> gradient(update.gradient_sum);
  double scale = update.inverse_batch;
  bool checked = false;
  if (const double max_norm = update.optimizer.options().max_gradient_norm; max_norm > 0.0) {
    const double squares = D::sum_of_squares(place, gradient);
    if (!std::isfinite(squares)) {
      if (const std::size_t first = D::first_nonfinite(place, gradient); first != gradient.size()) {
        return {.first_nonfinite = first, .applied = false};
      }
    }
    checked = true;
    scale *= optimizer::clipping_factor(squares, update.inverse_batch, max_norm);
  } else if (update.on_nonfinite == NonFinite::kSkipStep) {
    if (const std::size_t first = D::first_nonfinite(place, gradient); first != gradient.size()) {
      return {.first_nonfinite = first, .applied = false};
    }
    checked = true;
  }
  const optimizer::StepContext context{.step = update.step + 1, .gradient_scale = scale};
  if (checked) {
    D::step(place, update.optimizer, update.parameters, gradient, update.optimizer_state, context);
    return {};
  }
  if (D::step_finite(place, update.optimizer, update.parameters, gradient, update.optimizer_state,
                     context)) {
    return {};
  }
  return {.first_nonfinite = D::first_nonfinite(place, gradient), .applied = true};
}

template <class Communicator, device::Device D = device::Cpu>
class MirroredReplica {
 public:
  using Place = typename D::Place;

  // bucket_bytes: the unit in which the gradient is reduced while the backward pass goes on
  // (the default, one bucket: the whole gradient once it is final).
  MirroredReplica(std::size_t index, Communicator communicator, Place place = {},
                  std::size_t bucket_bytes = std::numeric_limits<std::size_t>::max())
      : index_(index),
        communicator_(std::move(communicator)),
        place_(place),
        bucket_bytes_(bucket_bytes) {}

  std::size_t index() const { return index_; }
  Communicator& communicator() { return communicator_; }
  const Place& place() const { return place_; }

  // Replicas built in other processes take the chief's parameters; the optimizer state and the
  // step are already the same everywhere (a fresh run, or the same checkpoint restored).
  template <class T>
  void start(std::span<T> parameters, std::span<T> /*optimizer_state*/, std::uint64_t /*step*/) {
    communicator_.broadcast(parameters, 0);
  }

  // Where the Trainer keeps this replica's gradient sum (strategy.hpp): memory that the
  // communicator shares with the other processes of this host, where it does
  // (collective::Deterministic::share_buffer: the sum's all-reduce then copies nothing in or
  // out), else nothing, and the Trainer keeps its own. A collective.
  template <class T>
  std::span<T> gradient_sum_storage(std::size_t count) {
    if constexpr (std::same_as<D, device::Cpu> &&
                  requires { communicator_.template share_buffer<T>(count); }) {
      const auto shared = communicator_.template share_buffer<T>(count);
      if (!shared.why_not.empty()) {
        std::fprintf(stderr,
                     "cohort: replica %zu: the gradient goes in and out of shared memory, since "
                     "a buffer for it there failed: %s\n",
                     index_, shared.why_not.c_str());
      }
      return shared.values;
    } else {
      return {};
    }
  }

  template <class T, class O>
  void begin_step(Update<T, O>& update) {
    buckets_.begin(update.gradient_sum.size(), std::max<std::size_t>(1, bucket_bytes_ / sizeof(T)));
    pending_.clear();
  }

  template <class T, class O>
  void gradients_ready(Update<T, O>& update, std::size_t begin, std::size_t end) {
    buckets_.ready(begin, end, [&](std::size_t /*bucket*/, std::size_t first, std::size_t last) {
      pending_.push_back(collective::start_all_reduce(
          communicator_, update.gradient_sum.subspan(first, last - first), ReduceOp::kSum));
    });
  }

  template <class T, class O>
  StepResult finish_step(Update<T, O>& update) {
    COHORT_ASSERT(buckets_.complete());
    for (collective::Pending& pending : pending_) pending.wait();
    return apply_update<D>(update, place_);
  }

  // The step ends by an exception (strategy.hpp): the group is released, and every bucket this
  // step started has finished, failed as the group fails, before the Trainer frees the buffers it
  // reduces (a communication thread may still be reducing one).
  void abandon_step(std::string_view reason) noexcept {
    // The step's own error is what goes up: the abort's, and the failures it causes, are not.
    try {
      communicator_.abort(reason);
    } catch (...) {
    }
    for (collective::Pending& pending : pending_) {
      try {
        pending.wait();
      } catch (...) {
      }
    }
    pending_.clear();
  }

  // The end of a fit: every replica already holds the final state.
  template <class T>
  void finish(std::span<T> /*parameters*/, std::span<T> /*optimizer_state*/, FitEnd /*end*/) {}

 private:
  std::size_t index_;
  Communicator communicator_;
  [[no_unique_address]] Place place_;
  std::size_t bucket_bytes_;
  GradientBuckets buckets_;
  std::vector<collective::Pending> pending_;
};

}  // namespace cohort::strategy::detail
