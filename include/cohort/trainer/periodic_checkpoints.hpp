// Checkpoints during a fit (Options::checkpoint): a directory of the run's checkpoints
// (checkpoint/directory.hpp), one every every_steps steps and/or every `every` seconds, the newest
// `keep` kept, and one at the end of every fit. With resume, the Trainer's first fit continues
// from the newest checkpoint in the directory, as TensorFlow's BackupAndRestore does, so that the
// same command run again after a crash or a kill -9 of every process goes on from there, with the
// bits of a run that was never interrupted.
//
// By steps, every process knows after which step a checkpoint falls; by time, the job's vote
// (trainer/vote.hpp) agrees on the step. Under a strategy whose replicas hold the whole state
// between two steps (strategy::SnapshotsBetweenSteps: the mirrored strategies), the checkpoint is
// taken there, inside the fit: every replica makes its state whole (a sharded update gathers its
// optimizer state), the chief's replicas write a share of it each straight into the checkpoint's
// file, checking and checksumming their shares as they write (trainer/snapshot_write.hpp), and the
// fit goes on. A background thread finishes the file while the fit trains (the archive's small
// fields, the header, fsync, the rename), refusing it as Trainer::save does where it holds an
// infinity or NaN; the next checkpoint, and the end of the fit, wait for that write. A write that
// failed fails the chief's fit there (CheckpointError), and the other processes learn it as the
// chief's departure.
//
// Under a strategy that saves its own way (strategy::SavesOwnCheckpoint: a parameter server) the
// fit runs in segments instead, one between two checkpoints: every replica ends the segment as it
// ends a fit (the strategy's finish: the optimizer state comes home from the servers), every
// process saves together, as Trainer::save does (each server its shard, the chief the manifest
// last), and the servers serve the next segment. Workers that go at their own pace (Async,
// BoundedStaleness: not strategy::kLockstep) share no step to checkpoint at: refused.
// Preemption saves into the same directory when Options::preemption.checkpoint is empty.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <future>
#include <mutex>
#include <optional>
#include <string>
#include <utility>

#include "cohort/checkpoint/checkpoint.hpp"
#include "cohort/checkpoint/directory.hpp"
#include "cohort/core/options.hpp"
#include "cohort/strategy/strategy.hpp"
#include "cohort/trainer/checkpoints.hpp"
#include "cohort/trainer/options.hpp"
#include "cohort/trainer/snapshot_write.hpp"

namespace cohort::trainer {

template <class R>
class PeriodicCheckpoints {
  using T = typename R::value_type;
  using Clock = std::chrono::steady_clock;

 public:
  // Whether checkpoints are taken between two steps (snapshot), not at a segment's end.
  static constexpr bool kBetweenSteps = strategy::SnapshotsBetweenSteps<typename R::Strategy, T>;

  explicit PeriodicCheckpoints(const CheckpointPolicy& policy) : policy_(policy) {}

  // Refuses a policy that makes no sense, or that the strategy cannot follow (ConfigError naming
  // the field).
  void validate() const {
    const bool asked = policy_.every_steps != 0 || policy_.every.count() != 0 || policy_.resume;
    if (asked && policy_.directory.empty()) {
      options::reject("checkpoint.directory", "\"\"",
                      "must name a directory when checkpoint.every_steps, checkpoint.every or "
                      "checkpoint.resume is set");
    }
    if (policy_.every.count() < 0) {
      options::reject("checkpoint.every", policy_.every.count(), "must not be negative");
    }
    if constexpr (!strategy::kLockstep<typename R::Strategy>) {
      if (!policy_.directory.empty()) {
        options::reject("checkpoint.directory", policy_.directory.string(),
                        std::string("is not available under ") + std::string(R::Strategy::kName) +
                            " with workers at their own pace (Async, BoundedStaleness): no step "
                            "is every worker's; save between fits (Trainer::save) and on "
                            "preemption (preemption.checkpoint)");
      }
    }
  }

  bool enabled() const { return !policy_.directory.empty(); }

  // Where the segment that begins at `step` ends, for a fit to `target`.
  std::uint64_t segment_end(std::uint64_t step, std::uint64_t target) const {
    if (kBetweenSteps || policy_.every_steps == 0) return target;
    return std::min(target, (step / policy_.every_steps + 1) * policy_.every_steps);
  }

  // Whether a checkpoint by steps falls after `step` steps.
  bool due_by_steps(std::uint64_t step) const {
    return policy_.every_steps != 0 && step % policy_.every_steps == 0;
  }

  // Whether this process has gone checkpoint.every without a checkpoint (read by the first
  // replica of the process before the vote, the one that takes the checkpoints).
  bool due_by_time() const {
    return policy_.every.count() != 0 && Clock::now() - last_ >= policy_.every;
  }

  // On every process, at the Trainer's first fit, when asked: the run continues from the newest
  // checkpoint of the directory, if there is one.
  void resume(R& run) {
    if (!policy_.resume || resumed_) return;
    resumed_ = true;
    const auto newest = checkpoint::newest(policy_.directory);
    if (!newest) return;
    read_checkpoint(run, newest->file);
    saved_step_ = newest->step;
    if (run.strategy.is_chief()) {
      std::fprintf(stderr, "cohort: resuming from %s (step %llu)\n", newest->file.c_str(),
                   static_cast<unsigned long long>(newest->step));
    }
  }

  // On one thread, before the replicas of a segment start: the chief's snapshots (taken between
  // two steps, or at a segment's end where the strategy does not save its own way) readied for
  // `run`'s replicas, once the write in flight is done. Its failure, where the fit it failed did
  // not report it, fails nothing more: the next checkpoint writes again.
  void prepare(const R& run) {
    if constexpr (!strategy::SavesOwnCheckpoint<typename R::Strategy, T>) {
      if (!enabled() || !run.strategy.is_chief()) return;
      if (writing_.valid()) writing_.wait();
      writing_ = {};
      snapshot_.prepare(run.models.size());
    }
  }

  // Between two steps (kBetweenSteps), once every replica has made its state whole: on every
  // replica of every process, share `share` of `shares` (the replica's index in the process, and
  // their count); or after a fit on one thread, share 0 of 1. The chief's replicas write a share of
  // the state after `step` steps each into its file, and the last to finish has it finished in the
  // background. Whether this step had no checkpoint yet (share 0's answer; a fit's replicas never
  // take one twice).
  bool snapshot(const R& run, std::uint64_t step, std::size_t share, std::size_t shares) {
    if (share == 0 && !mark(step)) return false;
    if (!run.strategy.is_chief()) return true;
    // One checkpoint is written at a time; share 0 reports the previous one's failure.
    const std::shared_future<void> previous = write_in_flight();
    if (previous.valid()) share == 0 ? previous.get() : previous.wait();
    if (!snapshot_.write_share(run, step, share, shares, policy_.directory)) return true;
    const std::lock_guard lock(writing_mutex_);
    writing_ = std::async(std::launch::async, [this] {
                 snapshot_.commit();
                 if (policy_.keep != 0) checkpoint::keep_newest<T>(policy_.directory, policy_.keep);
               }).share();
    return true;
  }

  // After a segment, on every process: a snapshot of the run's state; under a strategy that saves
  // its own way (a parameter server's shards), every process saves together, as Trainer::save
  // does. Whether this step had no checkpoint yet.
  bool save(const R& run) {
    if constexpr (strategy::SavesOwnCheckpoint<typename R::Strategy, T>) {
      if (!mark(run.step)) return false;
      create_directory();  // every process writes there: the servers their shards
      write_checkpoint(run, checkpoint::file_for_step(policy_.directory, run.step));
      if (run.strategy.is_chief() && policy_.keep != 0) {
        checkpoint::keep_newest<T>(policy_.directory, policy_.keep);
      }
      return true;
    } else {
      return snapshot(run, run.step, 0, 1);
    }
  }

  // After a preemption: the save every process makes together (trainer/checkpoints.hpp), into
  // preemption.checkpoint or else this directory.
  void save_preempted(const R& run) {
    wait();
    const bool into_directory = run.options.preemption.checkpoint.empty() && enabled();
    if (into_directory) create_directory();
    save_preempted_to(run, into_directory ? checkpoint::file_for_step(policy_.directory, run.step)
                                          : run.options.preemption.checkpoint);
    if (into_directory && policy_.keep != 0 && run.strategy.is_chief()) {
      checkpoint::keep_newest<T>(policy_.directory, policy_.keep);
    }
  }

  // When an elastic job fell below min_workers (trainer/elastic.hpp), on every process left, where
  // checkpoints are on: its own state, the run's after `step` steps (the last step it applied,
  // whole: an elastic job shares out no update), written at once, so that the job started again
  // goes on from there. Each process's state is the run's bits at its step, so a file of that
  // step that another process wrote already is this one's too; two that write it at once each
  // write a temporary of their own, then rename it. Returns the file.
  std::filesystem::path save_alone(const R& run, std::uint64_t step) {
    if (writing_.valid()) writing_.wait();  // the chief's write in flight, which may have failed
    const std::filesystem::path file = checkpoint::file_for_step(policy_.directory, step);
    if (checkpoint::saved(file)) return file;
    checkpoint::TrainingState<T> state;
    fill_checkpoint_state(run, step, state);
    create_directory();
    write_state(state, file, step);
    return file;
  }

  // On one thread, once the replicas are done: waits for the write in flight; rethrows its
  // failure.
  void wait() {
    if (writing_.valid()) std::exchange(writing_, {}).get();
  }

 private:
  // Before a process writes there.
  void create_directory() const { create_checkpoint_directory(policy_.directory); }

  std::shared_future<void> write_in_flight() {
    const std::lock_guard lock(writing_mutex_);
    return writing_;
  }

  // Records a checkpoint after `step` steps; false where that step has one already.
  bool mark(std::uint64_t step) {
    last_ = Clock::now();
    if (step == saved_step_) return false;
    saved_step_ = step;
    return true;
  }

  CheckpointPolicy policy_;
  Clock::time_point last_ = Clock::now();
  std::uint64_t saved_step_ = static_cast<std::uint64_t>(-1);
  bool resumed_ = false;
  SnapshotWrite<R> snapshot_;  // the chief's checkpoint being written
  std::mutex writing_mutex_;  // between the replicas of a snapshot
  std::shared_future<void> writing_;
};

}  // namespace cohort::trainer
