// The sharded update over TCP (MirroredReplica, mirrored_replica.hpp). Where the gradient's buckets
// are all-reduced between processes of one replica each over the transport (collective::
// ReducesToOwners: collective::Deterministic, flat), each bucket's all-reduce stops halfway, once
// every element's sum is made on the one process that owns it (reduce_to_owners); each process
// applies the optimizer to the parameters and state it owns, and the second half gathers the new
// parameters instead of the gradient's sums (gather_from_owners). The bytes on the wire are the
// all-reduce's, and each of n processes applies 1/n of the update: for 2 workers of the
// 20M-parameter MLP over TCP, half a 560 MB pass a step (docs/benchmarks.md, "A model of 20M
// parameters over TCP"). The owned sums have the all-reduce's bits and every update is
// elementwise, so the parameters have the bits of the whole update; clipping's norm has the whole
// gradient's bits too (owned_norm.hpp). Not on the wire's packed sums, which keep the whole
// all-reduce: the gather would carry the parameters in 4 bytes an element where the packed sums
// take 2. The optimizer state outside a process's own elements is gathered when the fit ends,
// before a checkpoint and before a non-finite step raises; in an elastic job also when each
// process keeps a copy of the whole state (kept_stripes.hpp, keep_schedule.hpp).
#pragma once

#include <algorithm>
#include <cstddef>
#include <span>
#include <utility>
#include <vector>

#include "cohort/collective/collective.hpp"
#include "cohort/core/error.hpp"
#include "cohort/core/reduce_op.hpp"
#include "cohort/device/cpu.hpp"
#include "cohort/strategy/detail/apply_update.hpp"
#include "cohort/strategy/detail/kept_stripes.hpp"
#include "cohort/strategy/detail/owned_norm.hpp"
#include "cohort/strategy/strategy.hpp"

namespace cohort::strategy::detail {

// What the sharded update over TCP needs: a communicator that reduces to owners, and an optimizer
// that updates element by element.
template <class Communicator, class T, class O>
concept UpdatesOwned =
    collective::ReducesToOwners<Communicator, T> && device::cpu::HasElementRule<O, T>;

// One replica's sharded update over TCP, from step to step. Its calls take the replica's
// communicator (each a collective), its pending work (which the replica's abandon_step waits for
// if a gather fails) and what it keeps for a loss (KeptStripes, whose `spread` it sets).
template <class Communicator>
class OwnedUpdate {
 public:
  using Bucket = std::pair<std::size_t, std::size_t>;  // elements [first, last) of the gradient

  // A step begins: whether its buckets reduce to their owners.
  void begin_step(bool shares) {
    this_step_ = shares;
    if (shares) buckets_.clear();
  }
  bool this_step() const { return this_step_; }

  // Starts elements [first, last) of the gradient sum reducing to their owners.
  template <class T>
  collective::Pending start_bucket(Communicator& communicator, std::span<T> gradient_sum,
                                   std::size_t first, std::size_t last, ReduceOp sum) {
    buckets_.push_back({first, last});
    return collective::start_reduce_to_owners(communicator,
                                              gradient_sum.subspan(first, last - first), sum);
  }

  // The step's update, every bucket reduced: this process's part of it, the new parameters
  // gathered from their owners.
  template <class T, class O>
  StepResult finish(Communicator& communicator, Update<T, O>& update,
                    std::vector<collective::Pending>& pending, KeptStripes* kept) {
    const std::span<const T> gradient(update.gradient_sum);
    const StepResult result = apply_update<device::Cpu>(
        update,
        [&](const optimizer::StepContext& context, bool checked) {
          set_spread(true, kept);
          std::size_t mine = gradient.size();
          gather(communicator, update.parameters, pending,
                 [&](std::size_t first, std::size_t last) {
                   for_each_owned_in<T>(communicator, first, last,
                                        [&](std::size_t begin, std::size_t count) {
                                          step_run(update, context, checked, begin, count, mine);
                                        });
                 });
          return checked ? gradient.size() : least_over_processes(communicator, mine);
        },
        Checks<T>{communicator, gradient, std::span<const Bucket>(buckets_)});
    // The Trainer raises: the state it may save next is made whole first, on every process alike.
    if (result.first_nonfinite != StepResult::kFinite && update.on_nonfinite == NonFinite::kRaise) {
      gather_state(communicator, update.optimizer_state, pending, kept);
    }
    return result;
  }

  // Makes the optimizer state whole after sharded updates: each slot gathered from its owners as
  // the parameters are.
  template <class T>
  void gather_state(Communicator& communicator, std::span<T> state,
                    std::vector<collective::Pending>& pending, KeptStripes* kept) {
    if (!state_spread_) return;
    const std::size_t whole = buckets_.front().second;
    for (std::size_t slot = 0; slot * whole < state.size(); ++slot) {
      gather(communicator, state.subspan(slot * whole, whole), pending,
             [](std::size_t, std::size_t) {});
    }
    set_spread(false, kept);
  }

 private:
  void set_spread(bool spread, KeptStripes* kept) {
    state_spread_ = spread;
    if (kept) kept->spread = spread;
  }

  // Calls body(begin, count) for each run of the elements of bucket [first, last) that this
  // process owns.
  template <class T, class Body>
  static void for_each_owned_in(const Communicator& communicator, std::size_t first,
                                std::size_t last, Body&& body) {
    communicator.template for_each_owned<T>(
        last - first, [&](std::size_t begin, std::size_t count) { body(first + begin, count); });
  }

  // The gather of `values` from their owners, bucket by bucket, each started once write(first,
  // last) has written this process's part of it, so that a bucket travels while the next is
  // written; returns once every bucket has arrived. The gathers are the step's pending work (every
  // earlier one was waited before).
  template <class T, class Write>
  void gather(Communicator& communicator, std::span<T> values,
              std::vector<collective::Pending>& pending, Write&& write) {
    pending.clear();
    for (const auto& [first, last] : buckets_) {
      write(first, last);
      pending.push_back(
          collective::start_gather_from_owners(communicator, values.subspan(first, last - first)));
    }
    for (collective::Pending& gathered : pending) gathered.wait();
  }

  // apply_update's checks where each process holds the sums of the elements it owns.
  template <class T>
  struct Checks {
    Communicator& communicator;
    std::span<const T> gradient;
    std::span<const Bucket> buckets;
    double sum_of_squares() const {
      return owned_sum_of_squares<T>(communicator, gradient, buckets);
    }
    // The buckets come the gradient's end first: the least of their runs' firsts.
    std::size_t first_nonfinite() const {
      std::size_t mine = gradient.size();
      for (const auto& [first, last] : buckets) {
        for_each_owned_in<T>(communicator, first, last, [&](std::size_t begin, std::size_t count) {
          const std::size_t at = device::cpu::first_nonfinite(gradient.subspan(begin, count));
          if (at != count) mine = std::min(mine, begin + at);
        });
      }
      return least_over_processes(communicator, mine);
    }
  };

  bool this_step_ = false;     // whether this step's buckets reduce to their owners
  bool state_spread_ = false;  // an update applied since the optimizer state was last whole
  // The last such step's, in the order they were reduced: they tile the gradient from its end
  // (GradientBuckets), so the first ends at its size.
  std::vector<Bucket> buckets_;
};

}  // namespace cohort::strategy::detail
