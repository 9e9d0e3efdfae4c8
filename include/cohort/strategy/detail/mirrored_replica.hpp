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
#include "cohort/strategy/detail/kept_stripes.hpp"
#include "cohort/strategy/detail/owned_norm.hpp"
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
// checks.sum_of_squares() and checks.first_nonfinite() read the reduced gradient as every
// replica agrees: its sum of squares, and its first non-finite element (or its size). Where every
// replica holds the whole gradient, passes over it (WholeChecks); where each holds only its own
// part of the sum (the sharded update over TCP), passes over that part and a few collectives.
// Out of line on purpose, as the Trainer's fold addition (trainer/step_fold.hpp, AddInto): inlined
// into the step's loop it changes how GCC compiles the model's forward_backward inlined there. Hot,
// because out of line GCC guesses its frequency from the one call in the replica's loop, which
// follows the model's loops: guessed never executed, it was compiled for size, the optimizer's loop
// scalar, and Adam took 5.5 ms of an 11 ms step of the examples' MLP (1.4 ms vectorized;
// docs/benchmarks.md, "The examples' Eigen MLP").
template <device::Device D, class T, class O, class Apply, class Checks>
[[gnu::noinline, gnu::hot]] StepResult apply_update(const Update<T, O>& update, Apply&& apply,
                                                    const Checks& checks) {
  const trace::Span span(trace::current(), trace::Phase::kOptimizer, {.step = update.step});
  const std::span<const T> gradient(update.gradient_sum);
  double scale = update.inverse_batch;
  bool checked = false;
  if (const double max_norm = update.optimizer.options().max_gradient_norm; max_norm > 0.0) {
    const double squares = checks.sum_of_squares();
    if (!std::isfinite(squares)) {
      if (const std::size_t first = checks.first_nonfinite(); first != gradient.size()) {
        return {.first_nonfinite = first, .applied = false};
      }
    }
    checked = true;
    scale *= optimizer::clipping_factor(squares, update.inverse_batch, max_norm);
  } else if (update.on_nonfinite == NonFinite::kSkipStep) {
    if (const std::size_t first = checks.first_nonfinite(); first != gradient.size()) {
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

// apply_update's checks where every replica holds the whole reduced gradient.
template <device::Device D, class T>
struct WholeChecks {
  const typename D::Place& place;
  std::span<const T> gradient;
  double sum_of_squares() const { return D::sum_of_squares(place, gradient); }
  std::size_t first_nonfinite() const { return D::first_nonfinite(place, gradient); }
};

template <class Communicator, device::Device D = device::Cpu>
class MirroredReplica {
 public:
  using Place = typename D::Place;

  // Gradient sizes in bytes (Settings::share_update_from).
  struct ShareFrom {
    std::size_t stripes = 0;
    std::size_t owned = 0;
  };

  // How the replica reduces and updates, where a strategy says more than the defaults
  // (MultiWorkerMirrored's options).
  struct Settings {
    // The unit in which the gradient is reduced while the backward pass goes on (the default, one
    // bucket: the whole gradient once it is final).
    std::size_t bucket_bytes = std::numeric_limits<std::size_t>::max();
    // An elastic job's (kept_stripes.hpp), where a sharded update (below) also keeps the state
    // every KeptStripes::kEvery steps, this worker's stripes in shared memory or a copy of the
    // whole over TCP, so that a worker lost takes none of the state with it; the replica records
    // there what it keeps.
    KeptStripes* kept = nullptr;
    // The reduction of the gradient (collective/wire.hpp), which the Trainer's fold follows inside
    // the replica too (strategy::ChoosesGradientSum).
    ReduceOp gradient_sum = ReduceOp::kSum;
    // The gradient's size in bytes from which the update is sharded (below), where it can be: in
    // stripes, or over TCP to the owners of the all-reduce's sums; under it, each replica applies
    // the whole.
    ShareFrom share_update_from{};
  };

  MirroredReplica(std::size_t index, Communicator communicator, Place place = {},
                  Settings settings = {})
      : index_(index),
        communicator_(std::move(communicator)),
        place_(place),
        bucket_bytes_(settings.bucket_bytes),
        kept_(settings.kept),
        gradient_sum_(settings.gradient_sum),
        share_update_from_(settings.share_update_from) {}

  std::size_t index() const { return index_; }
  Communicator& communicator() { return communicator_; }
  const Place& place() const { return place_; }

  // Replicas built in other processes take the chief's parameters; the optimizer state and the
  // step are already the same everywhere (a fresh run, or the same checkpoint restored).
  template <class T>
  void start(std::span<T> parameters, std::span<T> optimizer_state, std::uint64_t /*step*/) {
    communicator_.broadcast(parameters, 0);
    state_count_ = optimizer_state.size();
    owned_ = {};
  }

  // Where the Trainer keeps this replica's gradient sum (strategy.hpp): the communicator's
  // shared buffer, where it has one (collective::Deterministic::share_buffer, memory the processes
  // of this host share: the sum's all-reduce then copies nothing in or out; collective::Local's,
  // the replica's own for the sharded update), else nothing, and the Trainer's fold keeps it (in
  // the model's own gradient where the replica folds one micro-batch a step). A collective.
  template <class T>
  std::span<T> gradient_sum_storage(std::size_t count) {
    collective::require_gradient_sum_fits<T>(gradient_sum_);
    if constexpr (std::same_as<D, device::Cpu> &&
                  requires { communicator_.template share_buffer<T>(count); }) {
      // An elastic job's sharded update keeps its stripes after the gradient sum
      // (kept_stripes.hpp), where the stripes reach every worker; elsewhere (by host, over TCP)
      // each worker keeps its own copies of the whole state (keeps_own_copies).
      StripeLayout layout{
          .parameters = count, .state = state_count_, .element_bytes = sizeof(T), .first = count};
      bool keeps = false;
      if constexpr (kShardable<T>) {
        keeps = kept_ && shares_stripes<T>(count) && communicator_.stripes_reach_every_rank();
      }
      const auto shared =
          communicator_.template share_buffer<T>(keeps ? layout.shared_count() : count);
      if (!shared.why_not.empty()) {
        std::fprintf(stderr,
                     "cohort: replica %zu: the gradient goes in and out of shared memory, since "
                     "a buffer for it there failed: %s\n",
                     index_, shared.why_not.c_str());
      }
      shard_.reset();
      std::optional<collective::StripeGroup> group;
      if constexpr (kShardable<T>) group = communicator_.stripe_group();
      // Where the process has one replica, that replica keeps what it keeps for a loss, by either
      // sharded update: nothing yet in this segment.
      if (kept_ && group) kept_->restart();
      if (shared.values.empty()) return {};
      const std::span<T> sum = shared.values.first(count);
      if constexpr (kShardable<T>) {
        if (group && shares_stripes<T>(count)) {
          layout.stripe = stripe_for(count, group->size, sizeof(T));
          layout.ranks = static_cast<int>(group->size);
          shard_ =
              Shard{.shared = std::as_writable_bytes(sum),
                    .group = *group,
                    .stripe = layout.stripe,
                    .kept = keeps ? std::as_writable_bytes(shared.values) : std::span<std::byte>()};
          if (keeps) kept_->layout = layout;
        }
      }
      return sum;
    } else {
      return {};
    }
  }

  template <class T, class O>
  void begin_step(Update<T, O>& update) {
    buckets_.begin(update.gradient_sum.size(), std::max<std::size_t>(1, bucket_bytes_ / sizeof(T)));
    pending_.clear();
    if constexpr (kReducesToOwners<T, O>) {
      owned_.this_step =
          reduces_to_owners() && update.gradient_sum.size() * sizeof(T) >= share_update_from_.owned;
      if (owned_.this_step) owned_.buckets.clear();
    }
    // The state the segment starts from, whole on every worker, kept before its first
    // all-reduce (kept_stripes.hpp).
    if (keeps_own_copies() && kept_->keeps == 0) {
      kept_->keep_own(std::span<const T>(update.parameters),
                      std::span<const T>(update.optimizer_state), update.step);
    }
    if constexpr (kShardable<T>) {
      if (keeps_stripes() && kept_->keeps == 0) {
        const std::size_t copy = kept_->begin_copy(update.step);
        keep_own_stripes<T>(update.parameters, update.optimizer_state, copy);
      }
    }
  }

  template <class T, class O>
  void gradients_ready(Update<T, O>& update, std::size_t begin, std::size_t end) {
    buckets_.ready(begin, end, [&](std::size_t /*bucket*/, std::size_t first, std::size_t last) {
      const std::span<T> bucket = update.gradient_sum.subspan(first, last - first);
      if constexpr (kReducesToOwners<T, O>) {
        if (owned_.this_step) {
          owned_.buckets.push_back({first, last});
          pending_.push_back(
              collective::start_reduce_to_owners(communicator_, bucket, gradient_sum_));
          return;
        }
      }
      pending_.push_back(collective::start_all_reduce(communicator_, bucket, gradient_sum_));
    });
  }

  template <class T, class O>
  StepResult finish_step(Update<T, O>& update) {
    COHORT_ASSERT(buckets_.complete());
    for (collective::Pending& pending : pending_) pending.wait();
    if (!keeps_own_copies()) return apply_step(update);
    // This step's all-reduce met every worker after its last step, and so after the copy it kept
    // then; every kEvery steps, a copy of the state made whole, a step skipped included.
    kept_->met();
    const StepResult result = apply_step(update);
    if (const std::uint64_t after = update.step + 1; after % KeptStripes::kEvery == 0) {
      const trace::Span span(trace::current(), trace::Phase::kKeepState, {.step = after});
      make_state_whole(update.optimizer_state);
      kept_->keep_own(std::span<const T>(update.parameters),
                      std::span<const T>(update.optimizer_state), after);
    }
    return result;
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
    if constexpr (std::same_as<D, device::Cpu> && collective::ReducesToOwners<Communicator, T>) {
      gather_owned_state(optimizer_state);
    }
  }

  // The end of a fit: the state made whole.
  template <class T>
  void finish(std::span<T> /*parameters*/, std::span<T> optimizer_state, FitEnd /*end*/) {
    make_state_whole(optimizer_state);
  }

 private:
  // The update of a step whose gradient sum is reduced: this worker's part of it (the sharded
  // updates below), or the whole.
  template <class T, class O>
  StepResult apply_step(Update<T, O>& update) {
    if constexpr (kReducesToOwners<T, O>) {
      if (owned_.this_step) return finish_owned(update);
    }
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
    return apply_update<D>(update, whole, whole_checks(update));
  }

  // The sharded update. Where the gradient sum lies in the communicator's shared buffer
  // (gradient_sum_storage) and its gather of stripes reaches the replicas of a stripe group (the
  // threads of Mirrored; worker processes of one replica each that share memory; by host, the
  // workers of each host: collective::StripeGroup), every replica holds the whole reduced
  // gradient after the all-reduce, decides alike (clipping, the non-finite policy), and applies
  // the optimizer to its own stripes of the parameters only (stripe k is the replica's at place k
  // modulo the group's size: stripe_for), with its own part of the optimizer state; then it
  // writes its new parameters where its stripes of the gradient lay, and the stripes are gathered
  // (gather_shared_stripes: collective::Local copies each replica's into the others',
  // collective::Deterministic each worker's from the others' in shared memory, by host the host's
  // workers'). Every host of a job by host computes the same update, each among its own workers.
  // Every update is elementwise, so the bits are those of the whole update; each worker does 1/n
  // of it, n the workers of its group. An elastic job by host keeps a copy of the whole state in
  // each worker every KeptStripes::kEvery steps, as over TCP, since its stripes do not reach the
  // other hosts' workers (kept_stripes.hpp). Stripes,
  // not halves: an update's cost varies along the parameters (for the examples' MLP, Adam took 2.1
  // ms for the half holding most of the second layer against 1.2 ms for the other, its tiny squares
  // subnormal floats), and the stripes give every worker its share of each layer. The optimizer
  // state outside a worker's stripes is gathered when the fit ends, or before a non-finite step
  // raises; until then each worker's is current on its own stripes. In an elastic job each
  // worker also keeps its stripes after the gradient sum every KeptStripes::kEvery steps, and on
  // those steps the parameters are gathered from there (kept_stripes.hpp).
  struct Shard {
    std::span<std::byte> shared;  // the whole gradient sum, in this worker's shared buffer
    collective::StripeGroup group;  // the workers the stripes are shared out among
    std::size_t stripe = 1;       // elements
    std::span<std::byte> kept{};  // the whole shared buffer where it keeps the stripes, else empty
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
    { c.stripe_group() } -> std::same_as<std::optional<collective::StripeGroup>>;
  };

  template <class T>
  std::span<T> shared_as() const {
    return {reinterpret_cast<T*>(shard_->shared.data()), shard_->shared.size() / sizeof(T)};
  }

  bool keeps_stripes() const { return shard_ && !shard_->kept.empty(); }

  // Whether a gradient of `count` elements is large enough for stripes:
  // Settings::share_update_from.
  template <class T>
  bool shares_stripes(std::size_t count) const {
    return count * sizeof(T) >= share_update_from_.stripes;
  }

  // `count` elements of the kept stripes from `offset` (StripeLayout).
  template <class T>
  std::span<T> kept_as(std::size_t offset, std::size_t count) const {
    return {reinterpret_cast<T*>(shard_->kept.data()) + offset, count};
  }

  void set_spread(bool spread) {
    shard_->state_spread = spread;
    if (kept_) kept_->spread = spread;
  }

  // Whether this worker keeps its own copies of the whole state for a loss (kept_stripes.hpp):
  // an elastic job's sharded update where the stripes do not reach every worker (by host), or over
  // TCP; on the host, where both run.
  bool keeps_own_copies() const {
    if constexpr (!std::same_as<D, device::Cpu>) return false;
    return kept_ && (owned_.this_step || (shard_ && shard_->kept.empty()));
  }

  // Calls body(begin, count) for each of this worker's stripes of `length` elements, in order:
  // stripe k is the worker's at place k mod the stripe group's size (collective.hpp).
  template <class Body>
  void for_each_own_stripe(std::size_t length, Body&& body) {
    for_each_stripe_of(shard_->group.place, shard_->group.size, shard_->stripe, length,
                       std::forward<Body>(body));
  }

  // Keeps this worker's stripe [begin, begin + count) of the optimizer state in `copy`.
  template <class T>
  void keep_state_stripe(std::span<const T> state, std::size_t copy, std::size_t begin,
                         std::size_t count) {
    const StripeLayout& layout = kept_->layout;
    const std::span<T> kept = kept_as<T>(layout.state_in(copy), layout.state);
    for (std::size_t at = begin; at < layout.state; at += layout.parameters) {
      std::copy_n(state.data() + at, count, kept.data() + at);
    }
  }

  // Keeps all of this worker's stripes of the parameters and optimizer state in `copy`.
  template <class T>
  void keep_own_stripes(std::span<const T> parameters, std::span<const T> state, std::size_t copy) {
    const std::span<T> kept = kept_as<T>(kept_->layout.parameters_in(copy), parameters.size());
    for_each_own_stripe(parameters.size(), [&](std::size_t begin, std::size_t count) {
      std::copy_n(parameters.data() + begin, count, kept.data() + begin);
      keep_state_stripe(state, copy, begin, count);
    });
  }

  template <class T, class O>
  StepResult finish_sharded(Update<T, O>& update) {
    const std::span<T> shared = shared_as<T>();
    const std::uint64_t after = update.step + 1;
    // Where each worker writes its new parameters for the others to gather: where its gradient
    // lay, or, after a step whose state it keeps, into that copy (kept_stripes.hpp).
    std::optional<std::size_t> copy;
    if (keeps_stripes()) {
      // This step's all-reduce has met: every worker has kept the segment's start.
      kept_->met();
      if (after % KeptStripes::kEvery == 0) copy = kept_->begin_copy(after);
    }
    const std::span<T> published =
        copy ? kept_as<T>(kept_->layout.parameters_in(*copy), shared.size()) : shared;
    const StepResult result = apply_update<D>(
        update,
        [&](const optimizer::StepContext& context, bool checked) {
          // From here until the state is whole again, parameters and state may be current on
          // this worker's stripes only.
          set_spread(true);
          const std::span<const T> gradient(shared);
          // Where the whole was checked before, every worker knows it finite; else the first
          // non-finite element of every worker's stripes, the least of which is the whole's.
          std::size_t mine = gradient.size();
          for_each_own_stripe(gradient.size(), [&](std::size_t begin, std::size_t count) {
            step_run(update, context, checked, begin, count, mine);
            std::copy_n(update.parameters.data() + begin, count, published.data() + begin);
            if (copy)
              keep_state_stripe(std::span<const T>(update.optimizer_state), *copy, begin, count);
          });
          communicator_.gather_shared_stripes(std::span<const T>(published), update.parameters,
                                              shard_->stripe);
          return checked ? gradient.size() : least_over_processes(mine);
        },
        whole_checks(update));
    if (copy && !result.applied) {
      // A step skipped is kept too, its state the last one's; the gather is the meeting that
      // says every worker has kept it.
      keep_own_stripes<T>(update.parameters, update.optimizer_state, *copy);
      communicator_.gather_shared_stripes(std::span<const T>(published), update.parameters,
                                          shard_->stripe);
    }
    if (copy) kept_->complete = after;
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
        std::copy_n(values.data() + begin, count, shared.data() + begin);
      });
      communicator_.gather_shared_stripes(std::span<const T>(shared), values, shard_->stripe);
    }
    set_spread(false);
  }

  template <class T, class O>
  WholeChecks<D, T> whole_checks(const Update<T, O>& update) const {
    return {.place = place_, .gradient = std::span<const T>(update.gradient_sum)};
  }

  // The sharded update over TCP. Where the gradient's buckets are all-reduced between processes
  // of one replica each over the transport (collective::ReducesToOwners: collective::
  // Deterministic, flat), each bucket's all-reduce stops halfway, once every element's sum is
  // made on the one process that owns it (reduce_to_owners); each process applies the optimizer
  // to the parameters and state it owns, and the second half gathers the new parameters instead
  // of the gradient's sums (gather_from_owners). The bytes on the wire are the all-reduce's, and
  // each of n processes applies 1/n of the update: for 2 workers of the 20M-parameter MLP over
  // TCP, half a 560 MB pass a step (docs/benchmarks.md, "A model of 20M parameters over TCP").
  // The owned sums have the all-reduce's bits and every update is elementwise, so the parameters
  // have the bits of the whole update; clipping's norm has the whole gradient's bits too
  // (owned_norm.hpp). Not on the wire's packed sums, which keep the whole all-reduce: the gather
  // would carry the parameters in 4 bytes an element where the packed sums take 2. The optimizer
  // state outside a process's own elements is gathered when the fit ends, before a checkpoint and
  // before a non-finite step raises; in an elastic job also every KeptStripes::kEvery steps, when
  // each process keeps a copy of the whole state (kept_stripes.hpp).
  struct Owned {
    bool this_step = false;     // whether this step's buckets reduce to their owners
    bool state_spread = false;  // an update applied since the optimizer state was last whole
    // The last such step's, in the order they were reduced: they tile the gradient from its end
    // (GradientBuckets), so the first ends at its size.
    std::vector<std::pair<std::size_t, std::size_t>> buckets;
  };

  template <class T, class O>
  static constexpr bool kReducesToOwners = std::same_as<D, device::Cpu>&&
      collective::ReducesToOwners<Communicator, T>&& device::cpu::HasElementRule<O, T>;

  bool reduces_to_owners() const {
    return gradient_sum_ == ReduceOp::kSum && communicator_.reduces_to_owners();
  }

  void set_owned_spread(bool spread) {
    owned_.state_spread = spread;
    if (kept_) kept_->spread = spread;
  }

  // Calls body(begin, count) for each run of the elements of bucket [first, last) that this
  // process owns.
  template <class T, class Body>
  void for_each_owned_in(std::size_t first, std::size_t last, Body&& body) const {
    communicator_.template for_each_owned<T>(
        last - first, [&](std::size_t begin, std::size_t count) { body(first + begin, count); });
  }

  // The gather of `values` from their owners, bucket by bucket, each started once write(first,
  // last) has written this process's part of it, so that a bucket travels while the next is
  // written; returns once every bucket has arrived. The gathers are the step's pending work, which
  // abandon_step waits for if one fails (every earlier one was waited before).
  template <class T, class Write>
  void gather_owned(std::span<T> values, Write&& write) {
    pending_.clear();
    for (const auto& [first, last] : owned_.buckets) {
      write(first, last);
      pending_.push_back(
          collective::start_gather_from_owners(communicator_, values.subspan(first, last - first)));
    }
    for (collective::Pending& gather : pending_) gather.wait();
  }

  // The optimizer's update of the run [begin, begin + count) of the parameters and state (this
  // process's part of a sharded update). Where the gradient was not checked before and the run's
  // is not finite, `first` becomes the least of it and the run's first non-finite element.
  template <class T, class O>
  static void step_run(Update<T, O>& update, const optimizer::StepContext& context, bool checked,
                       std::size_t begin, std::size_t count, std::size_t& first) {
    const std::span<const T> part = std::span<const T>(update.gradient_sum).subspan(begin, count);
    const bool finite =
        device::cpu::step_part(update.optimizer, update.parameters.subspan(begin, count), part,
                               update.optimizer_state, begin, context);
    if (!checked && !finite) first = std::min(first, begin + device::cpu::first_nonfinite(part));
  }

  // The least over every process of the first non-finite element each holds (`mine`, or the
  // gradient's size where it holds none) of its part: the whole gradient's.
  std::size_t least_over_processes(std::size_t mine) {
    std::int64_t first[] = {static_cast<std::int64_t>(mine)};
    communicator_.all_reduce(std::span<std::int64_t>(first), ReduceOp::kMin);
    return static_cast<std::size_t>(first[0]);
  }

  // apply_update's checks where each process holds the sums of the elements it owns.
  template <class T>
  struct OwnedChecks {
    MirroredReplica* replica;
    std::span<const T> gradient;
    double sum_of_squares() const {
      return owned_sum_of_squares<T>(replica->communicator_, gradient,
                                     std::span(replica->owned_.buckets));
    }
    // The buckets come the gradient's end first: the least of their runs' firsts.
    std::size_t first_nonfinite() const {
      std::size_t mine = gradient.size();
      for (const auto& [first, last] : replica->owned_.buckets) {
        replica->template for_each_owned_in<T>(
            first, last, [&](std::size_t begin, std::size_t count) {
              const std::size_t at = device::cpu::first_nonfinite(gradient.subspan(begin, count));
              if (at != count) mine = std::min(mine, begin + at);
            });
      }
      return replica->least_over_processes(mine);
    }
  };

  template <class T, class O>
  StepResult finish_owned(Update<T, O>& update) {
    const std::span<const T> gradient(update.gradient_sum);
    const StepResult result = apply_update<D>(
        update,
        [&](const optimizer::StepContext& context, bool checked) {
          set_owned_spread(true);
          std::size_t mine = gradient.size();
          gather_owned(update.parameters, [&](std::size_t first, std::size_t last) {
            for_each_owned_in<T>(first, last, [&](std::size_t begin, std::size_t count) {
              step_run(update, context, checked, begin, count, mine);
            });
          });
          return checked ? gradient.size() : least_over_processes(mine);
        },
        OwnedChecks<T>{this, gradient});
    // The Trainer raises: the state it may save next is made whole first, on every process alike.
    if (result.first_nonfinite != StepResult::kFinite && update.on_nonfinite == NonFinite::kRaise) {
      gather_owned_state(update.optimizer_state);
    }
    return result;
  }

  // Makes the optimizer state whole after sharded updates over TCP: each slot gathered from its
  // owners as the parameters are.
  template <class T>
  void gather_owned_state(std::span<T> state) {
    if (!owned_.state_spread) return;
    const std::size_t whole = owned_.buckets.front().second;
    for (std::size_t slot = 0; slot * whole < state.size(); ++slot) {
      gather_owned(state.subspan(slot * whole, whole), [](std::size_t, std::size_t) {});
    }
    set_owned_spread(false);
  }

  std::size_t index_;
  Communicator communicator_;
  [[no_unique_address]] Place place_;
  std::size_t bucket_bytes_;
  KeptStripes* kept_;
  ReduceOp gradient_sum_;
  ShareFrom share_update_from_;
  std::size_t state_count_ = 0;  // the optimizer state's elements (start)
  GradientBuckets buckets_;
  std::vector<collective::Pending> pending_;
  std::optional<Shard> shard_;  // the sharded update, where the replica's gradient sum allows it
  Owned owned_;                 // the sharded update over TCP
};

}  // namespace cohort::strategy::detail
