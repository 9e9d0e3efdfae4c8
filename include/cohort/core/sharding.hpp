// Which examples each replica sees: the deterministic data schedule.
//
// Epoch e visits the data set in the order random::permutation(size, derive(seed, e)). Its
// floor(size / global_batch) global batches are consecutive slices of that order; the remainder
// (size mod global_batch examples) is dropped for that epoch, and since every epoch draws a new
// order, every example is still visited over the run. Each global batch is split into
// micro_batches micro-batches whose sizes differ by at most one (micro-batch j holds positions
// [j*B/M, (j+1)*B/M)), and replica r of R computes micro-batches [r*M/R, (r+1)*M/R).
//
// None of this depends on the replica count, which is what lets the gradient sum be the same tree
// (core/reduction_tree.hpp) for any R that divides M with a power-of-two quotient.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "cohort/core/options.hpp"
#include "cohort/core/random.hpp"
#include "cohort/core/reduction_tree.hpp"

namespace cohort::sharding {

inline constexpr std::uint64_t kEpochOrderStream = 1;

struct Range {
  std::size_t begin;
  std::size_t end;
};

class Plan {
 public:
  // Validates the split: names the field that makes it impossible.
  Plan(std::size_t dataset_size, std::size_t global_batch, std::size_t micro_batches,
       std::size_t replicas)
      : dataset_size_(dataset_size),
        global_batch_(global_batch),
        micro_batches_(micro_batches),
        replicas_(replicas) {
    validate_split(global_batch, micro_batches, replicas);
    if (global_batch > dataset_size) {
      options::reject("global_batch", global_batch,
                      "exceeds the data set's " + std::to_string(dataset_size) + " examples");
    }
  }

  // The checks that do not need the data set, shared with Trainer's constructor.
  static void validate_split(std::size_t global_batch, std::size_t micro_batches,
                             std::size_t replicas) {
    options::require_positive("replicas", replicas);
    options::require_positive("micro_batches", micro_batches);
    options::require_positive("global_batch", global_batch);
    if (global_batch < micro_batches) {
      options::reject("global_batch", global_batch,
                      "must be at least micro_batches (" + std::to_string(micro_batches) + ")");
    }
    if (micro_batches % replicas != 0 || !tree::is_subtree(0, micro_batches / replicas)) {
      options::reject("micro_batches", micro_batches,
                      "must be replicas (" + std::to_string(replicas) +
                          ") times a power of two, so that every replica folds a whole subtree "
                          "of the reduction (core/reduction_tree.hpp)");
    }
  }

  std::size_t steps_per_epoch() const { return dataset_size_ / global_batch_; }
  std::size_t micro_batches_per_replica() const { return micro_batches_ / replicas_; }
  std::size_t first_micro_batch(std::size_t replica) const {
    return replica * micro_batches_per_replica();
  }

  // Positions, in the epoch's order, of micro-batch `micro` of step `step_in_epoch`.
  Range micro_batch(std::size_t step_in_epoch, std::size_t micro) const {
    const std::size_t start = step_in_epoch * global_batch_;
    return {start + micro * global_batch_ / micro_batches_,
            start + (micro + 1) * global_batch_ / micro_batches_};
  }

  std::vector<std::size_t> epoch_order(std::uint64_t seed, std::uint64_t epoch) const {
    return random::permutation(dataset_size_,
                               random::derive(random::derive(seed, kEpochOrderStream), epoch));
  }

  std::size_t dataset_size() const { return dataset_size_; }
  std::size_t global_batch() const { return global_batch_; }

 private:
  std::size_t dataset_size_;
  std::size_t global_batch_;
  std::size_t micro_batches_;
  std::size_t replicas_;
};

}  // namespace cohort::sharding
