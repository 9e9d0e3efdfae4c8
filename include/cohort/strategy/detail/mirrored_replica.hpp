// The replica that Mirrored and MultiWorkerMirrored hand to the Trainer's step: its global index,
// its communicator over every replica of the job, its place on its device, and the synchronous
// update: the gradient's buckets all-reduced as they become final (overlapping the rest of the
// backward pass where the communicator can), then the optimizer applied to this replica's own
// copy. Every replica computes the same bits, so the copies never drift apart. The work runs at
// the replica's place on its device (device/device.hpp): on the host for device::Cpu, on the
// replica's stream for device::Cuda, where the spans of the update are device memory.
#pragma once

#include <algorithm>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <optional>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

#include "cohort/collective/collective.hpp"
#include "cohort/collective/wire.hpp"
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
// apply(context, checked) applies the update with `context` and returns the gradient's first
// non-finite element, or its size where it has none or `checked` says it was checked before: the
// whole update (MirroredReplica::finish_step), or this worker's part of it (the sharded update).
// Out of line on purpose, as the Trainer's fold addition (trainer/step_fold.hpp, AddInto): inlined
// into the step's loop it changes how GCC compiles the model's forward_backward inlined there. Hot,
// because out of line GCC guesses its frequency from the one call in the replica's loop, which
// follows the model's loops: guessed never executed, it was compiled for size, the optimizer's loop
// scalar, and Adam took 5.5 ms of an 11 ms step of the examples' MLP (1.4 ms vectorized;
// docs/benchmarks.md, "The examples' Eigen MLP").
template <device::Device D, class T, class O, class Apply>
[[gnu::noinline, gnu::hot]] StepResult apply_update(const Update<T, O>& update,
                                                    const typename D::Place& place, Apply&& apply) {
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
  const optimizer::StepContext context{.step = update.step + 1,
                                       .gradient_scale = scale,
                                       .learning_rate_factor = update.learning_rate_factor};
  const std::size_t first = apply(context, checked);
  if (first == gradient.size()) return {};
  return {.first_nonfinite = first, .applied = true};
}

template <class Communicator, device::Device D = device::Cpu>
class MirroredReplica {
 public:
  using Place = typename D::Place;

  // bucket_bytes: the unit in which the gradient is reduced while the backward pass goes on
  // (the default, one bucket: the whole gradient once it is final). shares_update: whether the
  // replicas may share out the update in stripes (below); not in an elastic job, where a worker
  // lost would take the only current copy of its stripes' optimizer state with it.
  // gradient_sum: the reduction of the gradient (collective/wire.hpp), which the Trainer's fold
  // follows inside the replica too (strategy::ChoosesGradientSum).
  MirroredReplica(std::size_t index, Communicator communicator, Place place = {},
                  std::size_t bucket_bytes = std::numeric_limits<std::size_t>::max(),
                  bool shares_update = true, ReduceOp gradient_sum = ReduceOp::kSum)
      : index_(index),
        communicator_(std::move(communicator)),
        place_(place),
        bucket_bytes_(bucket_bytes),
        shares_update_(shares_update),
        gradient_sum_(gradient_sum) {}

  std::size_t index() const { return index_; }
  Communicator& communicator() { return communicator_; }
  const Place& place() const { return place_; }

  // Replicas built in other processes take the chief's parameters; the optimizer state and the
  // step are already the same everywhere (a fresh run, or the same checkpoint restored).
  template <class T>
  void start(std::span<T> parameters, std::span<T> /*optimizer_state*/, std::uint64_t /*step*/) {
    communicator_.broadcast(parameters, 0);
  }

  // Where the Trainer keeps this replica's gradient sum (strategy.hpp): the communicator's
  // shared buffer, where it has one (collective::Deterministic::share_buffer, memory the processes
  // of this host share: the sum's all-reduce then copies nothing in or out; collective::Local's,
  // the replica's own for the sharded update), else nothing, and the Trainer keeps its own. A
  // collective.
  template <class T>
  std::span<T> gradient_sum_storage(std::size_t count) {
    collective::require_gradient_sum_fits<T>(gradient_sum_);
    if constexpr (std::same_as<D, device::Cpu> &&
                  requires { communicator_.template share_buffer<T>(count); }) {
      const auto shared = communicator_.template share_buffer<T>(count);
      if (!shared.why_not.empty()) {
        std::fprintf(stderr,
                     "cohort: replica %zu: the gradient goes in and out of shared memory, since "
                     "a buffer for it there failed: %s\n",
                     index_, shared.why_not.c_str());
      }
      shard_.reset();
      if constexpr (kShardable<T>) {
        if (shares_update_ && !shared.values.empty() && communicator_.stripes_reach_every_rank()) {
          shard_ = Shard{.shared = std::as_writable_bytes(shared.values),
                         .stripe = stripe_for(count, static_cast<std::size_t>(communicator_.size()),
                                              sizeof(T))};
        }
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
          communicator_, update.gradient_sum.subspan(first, last - first), gradient_sum_));
    });
  }

  template <class T, class O>
  StepResult finish_step(Update<T, O>& update) {
    COHORT_ASSERT(buckets_.complete());
    for (collective::Pending& pending : pending_) pending.wait();
    if constexpr (kShardable<T> && device::cpu::HasElementRule<O, T>) {
      if (shard_ && update.gradient_sum.data() == shared_as<T>().data()) {
        return finish_sharded(update);
      }
    }
    const auto whole = [&](const optimizer::StepContext& context, bool checked) {
      const std::span<const T> gradient(update.gradient_sum);
      if (checked) {
        D::step(place_, update.optimizer, update.parameters, gradient, update.optimizer_state,
                context);
        return gradient.size();
      }
      if (D::step_finite(place_, update.optimizer, update.parameters, gradient,
                         update.optimizer_state, context)) {
        return gradient.size();
      }
      return D::first_nonfinite(place_, gradient);
    };
    return apply_update<D>(update, place_, whole);
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

  // Between two steps (strategy::SnapshotsBetweenSteps), on every replica together: every replica
  // already holds the parameters, and the whole optimizer state once a sharded update's stripes
  // are gathered.
  template <class T>
  void make_state_whole(std::span<T> optimizer_state) {
    if constexpr (kShardable<T>) {
      if (shard_) gather_state(optimizer_state);
    }
  }

  // The end of a fit: the state made whole.
  template <class T>
  void finish(std::span<T> /*parameters*/, std::span<T> optimizer_state, FitEnd /*end*/) {
    make_state_whole(optimizer_state);
  }

 private:
  // The sharded update. Where the gradient sum lies in the communicator's shared buffer
  // (gradient_sum_storage) and its gather of stripes reaches every replica (the threads of
  // Mirrored; worker processes of one replica each that share memory), every replica holds the
  // whole reduced gradient after the all-reduce, decides alike (clipping, the non-finite policy),
  // and applies the optimizer to its own stripes of the parameters only (stripe k is replica k's,
  // modulo the replicas: stripe_for), with its own part of the optimizer state; then it writes
  // its new parameters where its stripes of the gradient lay, and the stripes are gathered
  // (gather_shared_stripes: collective::Local copies each replica's into the others',
  // collective::Deterministic each worker's from the others' in shared memory). Every update is
  // elementwise, so the bits are those of the whole update; each worker does 1/n of it. Stripes,
  // not halves: an update's cost varies along the parameters (for the examples' MLP, Adam took 2.1
  // ms for the half holding most of the second layer against 1.2 ms for the other, its tiny squares
  // subnormal floats), and the stripes give every worker its share of each layer. The optimizer
  // state outside a worker's stripes is gathered when the fit ends, or before a non-finite step
  // raises; until then each worker's is current on its own stripes.
  struct Shard {
    std::span<std::byte> shared;  // the whole gradient sum, in this worker's shared buffer
    std::size_t stripe = 1;       // elements
    bool state_spread = false;    // an update applied since the optimizer state was last whole
  };
  // Stripes of at most kStripeBytes (long enough that a stripe's loop and copies run at full
  // speed), and at least kStripesPerWorker per worker, so that a small model is shared too.
  static constexpr std::size_t kStripeBytes = std::size_t{64} << 10;
  static constexpr std::size_t kStripesPerWorker = 8;
  static std::size_t stripe_for(std::size_t count, std::size_t ranks, std::size_t element_bytes) {
    const std::size_t even = (count + kStripesPerWorker * ranks - 1) / (kStripesPerWorker * ranks);
    return std::clamp<std::size_t>(even, 1, std::max<std::size_t>(1, kStripeBytes / element_bytes));
  }

  template <class T>
  static constexpr bool kShardable = std::same_as<D, device::Cpu>&& requires(
      Communicator& c, std::span<const T> part, std::span<T> into) {
    c.gather_shared_stripes(part, into, std::size_t{1});
    c.stripes_reach_every_rank();
  };

  template <class T>
  std::span<T> shared_as() const {
    return {reinterpret_cast<T*>(shard_->shared.data()), shard_->shared.size() / sizeof(T)};
  }

  // Calls body(begin, count) for each of this worker's stripes of `length` elements, in order:
  // stripe k is the communicator's rank k mod size().
  template <class Body>
  void for_each_own_stripe(std::size_t length, Body&& body) {
    const auto rank = static_cast<std::size_t>(communicator_.rank());
    const std::size_t stride = shard_->stripe * static_cast<std::size_t>(communicator_.size());
    for (std::size_t begin = rank * shard_->stripe; begin < length; begin += stride) {
      body(begin, std::min(shard_->stripe, length - begin));
    }
  }

  template <class T, class O>
  StepResult finish_sharded(Update<T, O>& update) {
    const std::span<T> shared = shared_as<T>();
    const StepResult result =
        apply_update<D>(update, place_, [&](const optimizer::StepContext& context, bool checked) {
          const std::span<const T> gradient(shared);
          // Where the whole was checked before, every worker knows it finite; else the first
          // non-finite element of every worker's stripes, the least of which is the whole's.
          std::int64_t first[] = {static_cast<std::int64_t>(gradient.size())};
          for_each_own_stripe(gradient.size(), [&](std::size_t begin, std::size_t count) {
            const std::span<const T> part = gradient.subspan(begin, count);
            const bool finite =
                device::cpu::step_part(update.optimizer, update.parameters.subspan(begin, count),
                                       part, update.optimizer_state, begin, context);
            if (!checked && !finite && first[0] == static_cast<std::int64_t>(gradient.size())) {
              first[0] = static_cast<std::int64_t>(begin + device::cpu::first_nonfinite(part));
            }
            std::copy_n(update.parameters.begin() + static_cast<std::ptrdiff_t>(begin), count,
                        shared.begin() + static_cast<std::ptrdiff_t>(begin));
          });
          shard_->state_spread = true;
          communicator_.gather_shared_stripes(std::span<const T>(shared), update.parameters,
                                              shard_->stripe);
          if (!checked) communicator_.all_reduce(std::span<std::int64_t>(first), ReduceOp::kMin);
          return static_cast<std::size_t>(first[0]);
        });
    // The Trainer raises: the state it may save next is made whole first, on every worker alike.
    if (result.first_nonfinite != StepResult::kFinite && update.on_nonfinite == NonFinite::kRaise) {
      gather_state(update.optimizer_state);
    }
    return result;
  }

  // Makes this worker's optimizer state whole: slot by slot, each worker's stripes are written
  // where its gradient lay and gathered by the others.
  template <class T>
  void gather_state(std::span<T> state) {
    if (!shard_->state_spread) return;
    const std::span<T> shared = shared_as<T>();
    const std::size_t whole = shared.size();
    for (std::size_t slot = 0; slot * whole < state.size(); ++slot) {
      const std::span<T> values = state.subspan(slot * whole, whole);
      for_each_own_stripe(whole, [&](std::size_t begin, std::size_t count) {
        std::copy_n(values.begin() + static_cast<std::ptrdiff_t>(begin), count,
                    shared.begin() + static_cast<std::ptrdiff_t>(begin));
      });
      communicator_.gather_shared_stripes(std::span<const T>(shared), values, shard_->stripe);
    }
    shard_->state_spread = false;
  }

  std::size_t index_;
  Communicator communicator_;
  [[no_unique_address]] Place place_;
  std::size_t bucket_bytes_;
  bool shares_update_;
  ReduceOp gradient_sum_;
  GradientBuckets buckets_;
  std::vector<collective::Pending> pending_;
  std::optional<Shard> shard_;  // the sharded update, where the replica's gradient sum allows it
};

}  // namespace cohort::strategy::detail
