// How a fit of an elastic job (strategy/elastic.hpp) goes on when its membership changes.
//
// go_on_without: when a worker is lost. The segment failed with a CommError on every process that
// goes on, each at a step boundary or in a step it abandoned (strategy::AbandonsStep: nothing of
// that step applied). Then:
//   1. the strategy regroups (strategy::Regroups): the workers left form the next membership;
//   2. the micro-batches are dealt over their replicas (core/sharding.hpp, Deal);
//   3. the job agrees on the newest state: a worker may have applied the last step before the
//      loss (its all-reduce completed) where another did not. Every replica takes the parameters
//      and optimizer state of the first worker that holds the most steps, which are the bits of
//      a job that lost nobody, since that step's sum was complete. Where a worker's state was
//      current only on its part of a sharded update (strategy::KeepsStripes), every replica
//      rebuilds instead the newest state the lost membership kept: at most 16 steps back from
//      every worker's stripes in shared memory, the lost worker's included, or (over TCP and by
//      host) from its own copy of the whole, kept as often as 1% of the step time allows
//      (strategy/detail/keep_schedule.hpp), and none of it travels;
//   4. the fit goes on from there, retrying the lost step (or computing again the steps since the
//      kept one) with the same micro-batches.
// A worker lost during 3 (while the state travels) leaves every process's state as it was, or
// whole at the newest: a process takes what it receives only once it holds it all, and the
// stripes stay kept until the state is taken. So the workers left go back to 1 and agree again,
// and the change is one: "workers 4 -> 2 at step 17 (rank 2, rank 3 lost: ...)".
// The new chief prints one line: "cohort: workers 4 -> 3 at step 17 (rank 2 lost: ...)", and the
// timeline (core/trace.hpp) has a "regroup" span from the failure to the newest state taken.
// Below min_workers every process left saves its state into the checkpoint directory, where there
// is one and the state is the worker's own (not a parameter server's), and fails with the
// regroup's CommError.
//
// take_in: when processes wait at the chief's door, every member at the step boundary where the
// vote counted them (trainer/vote.hpp). The strategy admits them (strategy::Grows), the
// micro-batches are dealt over the grown job, and every replica takes the state as above: the
// joiners' first fit (join_fit) runs the same agreement, from the step its program's fit begins
// at, so that the members' state, whose step is the newest, is the job's. The chief prints
// "cohort: workers 3 -> 4 at step 17 (1 joined)", and the timeline has a "regroup" span.
#pragma once

#include <algorithm>
#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "cohort/core/error.hpp"
#include "cohort/core/model.hpp"
#include "cohort/core/reduce_op.hpp"
#include "cohort/core/trace.hpp"
#include "cohort/device/device.hpp"
#include "cohort/strategy/elastic.hpp"
#include "cohort/trainer/agreement.hpp"
#include "cohort/trainer/periodic_checkpoints.hpp"
#include "cohort/trainer/progress.hpp"

namespace cohort::trainer {

// Below min_workers: this process's state after `applied` steps into the checkpoint directory,
// with a line that says where; a write that fails says why, and the job's own error follows.
template <class R>
[[gnu::cold]] void save_last_step(const R& run, std::uint64_t applied,
                                  PeriodicCheckpoints<R>& checkpoints) {
  const int rank = run.strategy.cluster().rank;
  try {
    const std::filesystem::path file = checkpoints.save_alone(run, applied);
    std::fprintf(stderr,
                 "cohort: rank %d: the job fell below min_workers: its state after step %llu is "
                 "saved to %s, where the job started again goes on\n",
                 rank, static_cast<unsigned long long>(applied), file.c_str());
  } catch (const Error& error) {
    std::fprintf(stderr,
                 "cohort: rank %d: the job fell below min_workers, and its state could "
                 "not be saved: %s\n",
                 rank, error.what());
  }
}

// What take_newest_state took.
struct NewestState {
  std::uint64_t step = 0;
  bool from_kept_state = false;  // rebuilt from what the lost membership kept (KeepsStripes)
};

// Whether a worker holds the job's whole state between steps, which it can save alone: not where
// parameter servers hold the optimizer state (strategy::ServesFit), which the job's last
// checkpoint then restores.
template <class R>
inline constexpr bool kHoldsOwnState =
    !strategy::ServesFit<typename R::Strategy, typename R::value_type, typename R::Optimizer>;

template <class R>
inline constexpr bool kKeepsStripes =
    strategy::KeepsStripes<typename R::Strategy, typename R::value_type>;

// Local replica `local`'s parameters and optimizer state after `steps` steps, rebuilt from what
// the lost membership kept (strategy::KeepsStripes).
template <class R>
[[gnu::cold]] void rebuild_from_kept_state(R& run, std::size_t local, std::uint64_t steps) {
  run.strategy.rebuild_from_kept_state(
      ModelTraits<typename R::Model>::parameters(run.models[local]),
      run.optimizer_states[local].span(), steps);
}

// Below min_workers, alone: the steps of the state this process holds whole, to save. Where its
// state was current only on its stripes (strategy::KeepsStripes), the newest state it knows every
// worker kept, rebuilt into every local replica; no other process agrees, each saves what it knows.
template <class R>
[[gnu::cold]] std::uint64_t whole_state_alone(R& run, std::uint64_t applied) {
  if constexpr (kKeepsStripes<R>) {
    if (run.strategy.stripes_spread()) {
      const auto step = static_cast<std::uint64_t>(run.strategy.kept_step());
      for (std::size_t local = 0; local < run.models.size(); ++local) {
        rebuild_from_kept_state(run, local, step);
      }
      run.strategy.forget_stripes();
      return step;
    }
  }
  return applied;
}

// Whether this process holds the job's state after `step` steps already: its state, of `applied`
// steps, is whole (not spread over the stripes of a sharded update) at that step. So does a
// process whose agreement finished where a later loss ended it on others: it rebuilt that state,
// and let go of the stripes it came from.
template <class R>
bool holds_whole_state(const R& run, std::uint64_t applied, std::uint64_t step) {
  if constexpr (kKeepsStripes<R>) {
    if (run.strategy.stripes_spread()) return false;
  }
  return applied == step;
}

// Every replica of every process: the parameters and optimizer state of the first worker that
// holds the most steps, `applied` being this process's, or the newest state the lost membership
// kept in its stripes, rebuilt; run.step is then that state's count of steps. A process behind
// the newest receives it beside its own state and takes it only once every local replica holds
// it whole: where a worker is lost while the state travels (a CommError), this process's state
// and its count of steps are as they were, for the workers left to agree again (go_on_without).
template <class R>
[[gnu::cold]] NewestState take_newest_state(R& run, std::uint64_t applied) {
  using T = typename R::value_type;
  using Device = typename R::Device;
  NewestState newest;
  // Per local replica behind the newest: its parameters, then its optimizer state, as received.
  std::vector<device::Buffer<Device, T>> received(run.models.size());
  run.strategy.run([&](auto& replica) {
    const std::size_t local = replica.index() - run.strategy.first_local_replica();
    Agreement<Device> agreement(run.place(local));
    // In one agreement, each the most over the job (exact: steps stay far below 2^53): the steps
    // applied, and their fewest (negated); whether any process's state is spread over stripes;
    // the newest step kept in them.
    std::array<double, 4> agreed{static_cast<double>(applied), -static_cast<double>(applied), 0.0,
                                 -1.0};
    if constexpr (kKeepsStripes<R>) {
      agreed[2] = run.strategy.stripes_spread() ? 1.0 : 0.0;
      agreed[3] = static_cast<double>(run.strategy.kept_step());
    }
    agreement.all_reduce(replica.communicator(), std::span<double>(agreed), ReduceOp::kMax);
    const double most = agreed[0];
    if constexpr (kKeepsStripes<R>) {
      if (agreed[2] != 0.0) {
        const auto step = static_cast<std::uint64_t>(agreed[3]);
        if (!holds_whole_state(run, applied, step)) rebuild_from_kept_state(run, local, step);
        if (local == 0) newest = {.step = step, .from_kept_state = true};
        return;
      }
    }
    double source = most == static_cast<double>(applied)
                        ? static_cast<double>(run.strategy.first_local_replica())
                        : std::numeric_limits<double>::infinity();
    agreement.all_reduce(replica.communicator(), std::span<double>(&source, 1), ReduceOp::kMin);
    const int root = static_cast<int>(source);
    std::span<T> parameters = ModelTraits<typename R::Model>::parameters(run.models[local]);
    std::span<T> state = run.optimizer_states[local].span();
    if (most != static_cast<double>(applied)) {
      received[local] =
          device::Buffer<Device, T>(parameters.size() + state.size(), run.place(local));
      parameters = received[local].span().first(parameters.size());
      state = received[local].span().subspan(parameters.size());
    }
    // The segment that follows starts with replica 0's parameters (strategy.hpp, start): they
    // travel here only where another replica holds the newest, or a process is behind it (so
    // that a loss before that start leaves no process with parameters older than its steps).
    if (root != 0 || -agreed[1] != most) replica.communicator().broadcast(parameters, root);
    replica.communicator().broadcast(state, root);
    if (local == 0) newest.step = static_cast<std::uint64_t>(most);
  });
  for (std::size_t local = 0; local < received.size(); ++local) {
    const std::span<const T> taken = received[local].span();
    if (taken.empty()) continue;
    const std::span<T> parameters = ModelTraits<typename R::Model>::parameters(run.models[local]);
    Device::copy(run.place(local), taken.first(parameters.size()), parameters);
    Device::copy(run.place(local), taken.subspan(parameters.size()),
                 run.optimizer_states[local].span());
  }
  if constexpr (kKeepsStripes<R>) run.strategy.forget_stripes();
  run.step = newest.step;
  return newest;
}

// After a membership change that began at `start`: the micro-batches dealt over the job's
// replicas, the newest state taken, the change recorded and printed by the chief.
template <class R>
[[gnu::cold]] strategy::MembershipChange changed_membership(
    R& run, strategy::MembershipChange change, std::uint64_t applied,
    trace::Recorder::Clock::time_point start) {
  run.deal();
  const NewestState newest = take_newest_state(run, applied);
  const auto end = trace::Recorder::Clock::now();
  change.step = newest.step;
  change.from_kept_state = newest.from_kept_state;
  change.seconds = std::chrono::duration<double>(end - start).count();
  if (run.recorder) {
    run.recorder->record(trace::Phase::kRegroup, start, end,
                         {.step = newest.step, .index = change.workers_after});
  }
  if (run.strategy.is_chief()) {
    std::fprintf(stderr, "cohort: %s\n", membership_text(change).c_str());
  }
  return change;
}

// The change from `first`'s membership to `second`'s, which regrouped `first`'s workers left (its
// ranks in the order of their ranks in `first`), as one: the ranks lost in `first`'s numbering,
// the cause that began it.
inline strategy::MembershipChange one_change(strategy::MembershipChange first,
                                             const strategy::MembershipChange& second) {
  std::vector<int> members;  // by rank in `second`'s membership: the rank in `first`'s
  for (int rank = 0; rank < static_cast<int>(first.workers_before); ++rank) {
    if (std::ranges::find(first.lost, rank) == first.lost.end()) members.push_back(rank);
  }
  for (const int rank : second.lost) first.lost.push_back(members[static_cast<std::size_t>(rank)]);
  std::ranges::sort(first.lost);
  first.workers_after = second.workers_after;
  return first;
}

// After `cause` ended a segment, with `applied` the steps of the run this process's state holds:
// the job's next membership, and run.step the step it goes on from; the change counts its time
// from `start` (a failed growth's began before the loss was noticed). A worker lost while the
// newest state travels makes the workers left regroup again, as one change. Throws CommError
// where fewer than min_workers are left, after saving this process's state into the checkpoint
// directory, where there is one (PeriodicCheckpoints::save_alone).
template <class R>
[[gnu::cold]] strategy::MembershipChange go_on_without(
    R& run, CommError cause, std::uint64_t applied, PeriodicCheckpoints<R>& checkpoints,
    trace::Recorder::Clock::time_point start = trace::Recorder::Clock::now()) {
  std::optional<strategy::MembershipChange> change;
  for (;;) {
    std::optional<strategy::MembershipChange> regrouped;
    try {
      regrouped = run.strategy.regroup(cause);
    } catch (const CommError&) {
      if (checkpoints.enabled() && kHoldsOwnState<R>) {
        save_last_step(run, whole_state_alone(run, applied), checkpoints);
      }
      throw;
    }
    change = change ? one_change(std::move(*change), *regrouped) : std::move(*regrouped);
    try {
      return changed_membership(run, *change, applied, start);
    } catch (const CommError& lost) {
      // What this process received it did not take, and the stripes stay kept
      // (take_newest_state): its state and `applied` are what the next agreement starts from.
      std::fprintf(stderr,
                   "cohort: rank %d: a worker was lost while the job took the newest state; "
                   "regrouping again\n",
                   run.strategy.cluster().rank);
      cause = lost;
    }
  }
}

// Every process of an elastic job at the step boundary where the vote counted `joiners` waiting:
// the job with them, and run.step unchanged. Where a newcomer or a member is lost on the way (it
// left after the vote, or the state could not reach it), the workers left go on without it, as
// after any loss.
template <class R>
[[gnu::cold]] strategy::MembershipChange take_in(R& run, std::size_t joiners,
                                                 PeriodicCheckpoints<R>& checkpoints) {
  const auto start = trace::Recorder::Clock::now();
  try {
    return changed_membership(run, run.strategy.admit(joiners), run.step, start);
  } catch (const CommError& cause) {
    return go_on_without(run, cause, run.step, checkpoints, start);
  }
}

// The first fit of a process that joined a running job through its door (strategy::Grows,
// joined()): the agreement the members run in take_in, and the step the job is at.
template <class R>
[[gnu::cold]] void join_fit(R& run) {
  const auto start = trace::Recorder::Clock::now();
  const std::uint64_t step = take_newest_state(run, run.step).step;
  if (run.recorder) {
    run.recorder->record(
        trace::Phase::kRegroup, start, trace::Recorder::Clock::now(),
        {.step = step, .index = static_cast<std::uint64_t>(run.strategy.cluster().size)});
  }
  std::fprintf(stderr, "cohort: rank %d joined the job of %d workers at step %llu\n",
               run.strategy.cluster().rank, run.strategy.cluster().size,
               static_cast<unsigned long long>(step));
}

// The first fit of a process started again for a lost worker's place, which it took back
// (strategy::TakesWorkersBack): it goes on from the step after the lost process's last push, with
// that step's examples, and the parameters its first pull brings.
template <class R>
[[gnu::cold]] void rejoin_fit(R& run) {
  const auto start = trace::Recorder::Clock::now();
  run.rejoined_from = run.step;
  run.step = run.strategy.resume_step(run.step);
  if (run.recorder) {
    run.recorder->record(trace::Phase::kRegroup, start, trace::Recorder::Clock::now(),
                         {.step = run.step, .index = run.strategy.replicas()});
  }
  std::fprintf(stderr, "cohort: worker %d took its place back, at step %llu\n",
               run.strategy.worker(), static_cast<unsigned long long>(run.step));
}

}  // namespace cohort::trainer
