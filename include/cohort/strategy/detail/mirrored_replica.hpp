// The replica that Mirrored and MultiWorkerMirrored hand to the Trainer's step: its global index,
// its communicator over every replica of the job, its place on its device, and the synchronous
// update: the gradient's buckets all-reduced as they become final (overlapping the rest of the
// backward pass where the communicator can), then the optimizer applied to this replica's own
// copy. Every replica computes the same bits, so the copies never drift apart. The work runs at
// the replica's place on its device (device/device.hpp): on the host for device::Cpu, on the
// replica's stream for device::Cuda, where the spans of the update are device memory.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstdio>
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
#include "cohort/strategy/detail/apply_update.hpp"
#include "cohort/strategy/detail/gradient_buckets.hpp"
#include "cohort/strategy/detail/keep_schedule.hpp"
#include "cohort/strategy/detail/kept_stripes.hpp"
#include "cohort/strategy/detail/owned_update.hpp"
#include "cohort/strategy/strategy.hpp"

namespace cohort::strategy::detail {

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
    BucketSize bucket{};
    // An elastic job's (kept_stripes.hpp), where a sharded update (below) also keeps the state,
    // this worker's stripes in shared memory every KeptStripes::kEvery steps or a copy of the
    // whole over TCP as often as 1% of the step time allows (keep_schedule.hpp), so that a worker
    // lost takes none of the state with it; the replica records there what it keeps.
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
        bucket_(settings.bucket),
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
      [[maybe_unused]] const bool stripes = shares_stripes<T>(count);
      bool keeps = false;
      if constexpr (kShardable<T>) {
        keeps = kept_ && stripes && communicator_.stripes_reach_every_rank();
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
        if (group && stripes) {
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
    buckets_.begin(update.gradient_sum.size(),
                   bucket_.elements(update.gradient_sum.size(), sizeof(T)));
    pending_.clear();
    if constexpr (kReducesToOwners<T, O>) {
      owned_.begin_step(shares_owned<T>(update.gradient_sum.size()));
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
        if (owned_.this_step()) {
          pending_.push_back(
              owned_.start_bucket(communicator_, update.gradient_sum, first, last, gradient_sum_));
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
    // then; at the steps keep_schedule_ says, a copy of the state made whole, a step skipped
    // included.
    kept_->met();
    const StepResult result = apply_step(update);
    const KeepSchedule::Clock::time_point ended = KeepSchedule::Clock::now();
    keep_schedule_.step_finished(ended);
    if (const std::uint64_t after = update.step + 1; keep_schedule_.keeps(after)) {
      {
        const trace::Span span(trace::current(), trace::Phase::kKeepState, {.step = after});
        make_state_whole(update.optimizer_state);
        kept_->keep_own(std::span<const T>(update.parameters),
                        std::span<const T>(update.optimizer_state), after);
      }
      keep_schedule_.kept(after,
                          std::chrono::duration<double>(KeepSchedule::Clock::now() - ended).count(),
                          communicator_);
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
      owned_.gather_state(communicator_, optimizer_state, pending_, kept_);
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
      if (owned_.this_step()) return owned_.finish(communicator_, update, pending_, kept_);
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
  // each worker, as over TCP (keep_schedule.hpp), since its stripes do not reach the other hosts'
  // workers (kept_stripes.hpp). Stripes,
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

  // Whether a gradient of `count` elements reduces to its owners, for the sharded update over TCP
  // (owned_update.hpp): Settings::share_update_from.
  template <class T>
  bool shares_owned(std::size_t count) const {
    return gradient_sum_ == ReduceOp::kSum && communicator_.reduces_to_owners() &&
           count * sizeof(T) >= share_update_from_.owned;
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
    return kept_ && (owned_.this_step() || (shard_ && shard_->kept.empty()));
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
          return checked ? gradient.size() : least_over_processes(communicator_, mine);
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

  template <class T, class O>
  static constexpr bool kReducesToOwners =
      std::same_as<D, device::Cpu>&& UpdatesOwned<Communicator, T, O>;

  std::size_t index_;
  Communicator communicator_;
  [[no_unique_address]] Place place_;
  BucketSize bucket_;
  KeptStripes* kept_;
  ReduceOp gradient_sum_;
  ShareFrom share_update_from_;
  std::size_t state_count_ = 0;  // the optimizer state's elements (start)
  GradientBuckets buckets_;
  std::vector<collective::Pending> pending_;
  std::optional<Shard> shard_;  // the sharded update, where the replica's gradient sum allows it
  OwnedUpdate<Communicator> owned_;  // the sharded update over TCP
  KeepSchedule keep_schedule_;       // when this replica keeps its own copies (keeps_own_copies)
};

}  // namespace cohort::strategy::detail
