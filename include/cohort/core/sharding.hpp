// Which examples each replica sees: the deterministic data schedule.
//
// Epoch e visits the data set in the order random::permutation(size, derive(seed, e)). Its
// floor(size / global_batch) global batches are consecutive slices of that order; the remainder
// (size mod global_batch examples) is dropped for that epoch, and since every epoch draws a new
// order, every example is still visited over the run. Each global batch is split into
// micro_batches micro-batches whose sizes differ by at most one (micro-batch j holds positions
// [j*B/M, (j+1)*B/M)), and the micro-batches are dealt to the replicas as consecutive nodes of the
// canonical tree over them (Deal, below).
//
// None of this depends on the replica count, which is what lets the gradient sum be the same tree
// (core/reduction_tree.hpp) for any replica count up to micro_batches.
#pragma once

#include <algorithm>
#include <bit>
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

// The shares of micro-batches a job deals its workers: `dealt` consecutive nodes of the
// canonical tree over the micro-batches (tree::deal), of which each step aggregates the first
// `aggregated`. Every worker takes one share where the workers are at least `aggregated` (the
// shares past the workers go undealt), else consecutive shares that together make a node of the
// tree over the aggregated ones. A job without backup workers deals one share per worker and
// aggregates them all.
struct Shares {
  std::size_t dealt;
  std::size_t aggregated;
  static Shares of(std::size_t workers) { return {workers, workers}; }
};

// Which micro-batches each replica folds. The job's workers (replicas / local_replicas processes)
// are dealt consecutive nodes of the canonical tree over the micro-batches (tree::deal), and each
// worker's node is dealt to its local replicas the same way, so that a worker's replicas together
// fold one node and a reduction across workers folds whole workers. Where micro_batches / replicas
// is a power of two every replica folds that many (equal blocks); otherwise the counts differ, at
// most twice the smallest, and the collectives fold each replica as a node of its count
// (strategy::FoldsAnyDeal). Valid for the counts validate() accepts.
//
// `shares`: the workers' shares of the micro-batches (Shares), where the job keeps shares of
// workers it lost (a parameter-server job with backup workers, strategy::KeepsShares).
class Deal {
 public:
  Deal(std::size_t micro_batches, std::size_t replicas, std::size_t local_replicas)
      : Deal(micro_batches, replicas, local_replicas, Shares::of(replicas / local_replicas)) {}
  Deal(std::size_t micro_batches, std::size_t replicas, std::size_t local_replicas, Shares shares)
      : share_counts_(tree::deal(micro_batches, shares.dealt)) {
    const std::size_t workers = replicas / local_replicas;
    COHORT_ASSERT(shares.aggregated <= shares.dealt && workers <= shares.dealt);
    if (workers >= shares.aggregated) {
      worker_counts_.assign(share_counts_.begin(),
                            share_counts_.begin() + static_cast<std::ptrdiff_t>(workers));
    } else {
      // Each worker takes consecutive shares, a node of the canonical tree over the aggregated
      // ones, which is a node over their micro-batches too where the shares are equal blocks.
      std::size_t share = 0;
      for (const std::size_t taken : tree::deal(shares.aggregated, workers)) {
        std::size_t count = 0;
        for (const std::size_t end = share + taken; share < end; ++share) {
          count += share_counts_[share];
        }
        worker_counts_.push_back(count);
      }
    }
    for (const std::size_t node : worker_counts_) {
      const std::vector<std::size_t> parts = tree::deal(node, local_replicas);
      counts_.insert(counts_.end(), parts.begin(), parts.end());
    }
    firsts_.push_back(0);
    for (const std::size_t count : counts_) firsts_.push_back(firsts_.back() + count);
  }

  // The checks of a deal of positive counts: names the field that makes it impossible.
  // local_replicas 0: a process that runs no replica (a parameter server), which checks what does
  // not depend on a worker's replicas.
  static void validate(std::size_t micro_batches, std::size_t replicas,
                       std::size_t local_replicas) {
    if (micro_batches < replicas) {
      options::reject("micro_batches", micro_batches,
                      "must be at least the replicas (" + std::to_string(replicas) +
                          "), so that every replica folds a micro-batch");
    }
    if (local_replicas == 0) return;
    const std::size_t workers = replicas / local_replicas;
    const std::vector<std::size_t> nodes = tree::deal(micro_batches, workers);
    if (const std::size_t least = *std::min_element(nodes.begin(), nodes.end());
        least < local_replicas) {
      options::reject(
          "micro_batches", micro_batches,
          "deals a worker " + std::to_string(least) + " micro-batches, fewer than its " +
              std::to_string(local_replicas) +
              " local replicas: " + std::to_string(local_replicas * std::bit_ceil(workers)) +
              " (local_replicas times the workers rounded up to a power of two) deal "
              "every worker enough");
    }
  }

  // Each replica's micro-batch count, in replica order: the leaf counts of the replicas' folds.
  std::span<const std::size_t> counts() const { return counts_; }
  // Each worker's, in worker order.
  std::span<const std::size_t> worker_counts() const { return worker_counts_; }
  // Each share's, in share order.
  std::span<const std::size_t> share_counts() const { return share_counts_; }
  std::size_t first(std::size_t replica) const { return firsts_[replica]; }
  std::size_t count(std::size_t replica) const { return counts_[replica]; }

 private:
  std::vector<std::size_t> share_counts_;
  std::vector<std::size_t> counts_;
  std::vector<std::size_t> worker_counts_;
  std::vector<std::size_t> firsts_;
};

class Plan {
 public:
  // Validates the split: names the field that makes it impossible. `any_deal`: whether the
  // strategy folds replicas of different micro-batch counts (strategy::FoldsAnyDeal); without it
  // micro_batches / replicas must be a power of two. `shares`: the workers' shares (Deal), dealt
  // over at least replicas / local_replicas.
  Plan(std::size_t dataset_size, std::size_t global_batch, std::size_t micro_batches,
       std::size_t replicas, std::size_t local_replicas, Shares shares, bool any_deal)
      : dataset_size_(dataset_size),
        global_batch_(global_batch),
        micro_batches_(micro_batches),
        deal_(validated_deal(global_batch, micro_batches, replicas, local_replicas, shares,
                             any_deal)) {
    if (global_batch > dataset_size) {
      options::reject("global_batch", global_batch,
                      "exceeds the data set's " + std::to_string(dataset_size) + " examples");
    }
  }

  // The checks that do not need the data set, shared with Trainer's constructor (on every process:
  // a parameter server's too, which runs no replica: local_replicas 0).
  static void validate_split(std::size_t global_batch, std::size_t micro_batches,
                             std::size_t replicas, std::size_t local_replicas, bool any_deal) {
    options::require_positive("replicas", replicas);
    options::require_positive("micro_batches", micro_batches);
    options::require_positive("global_batch", global_batch);
    if (global_batch < micro_batches) {
      options::reject("global_batch", global_batch,
                      "must be at least micro_batches (" + std::to_string(micro_batches) + ")");
    }
    if (any_deal) {
      Deal::validate(micro_batches, replicas, local_replicas);
    } else if (micro_batches % replicas != 0 || !tree::is_subtree(0, micro_batches / replicas)) {
      options::reject("micro_batches", micro_batches,
                      "must be replicas (" + std::to_string(replicas) +
                          ") times a power of two, so that every replica folds a whole subtree "
                          "of the reduction (core/reduction_tree.hpp): this strategy's "
                          "collectives fold equal blocks only");
    }
  }

  const Deal& deal() const { return deal_; }

  std::size_t steps_per_epoch() const { return dataset_size_ / global_batch_; }
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
  static Deal validated_deal(std::size_t global_batch, std::size_t micro_batches,
                             std::size_t replicas, std::size_t local_replicas, Shares shares,
                             bool any_deal) {
    validate_split(global_batch, micro_batches, shares.dealt * local_replicas, local_replicas,
                   any_deal);
    return Deal(micro_batches, replicas, local_replicas, shares);
  }

  std::size_t dataset_size_;
  std::size_t global_batch_;
  std::size_t micro_batches_;
  Deal deal_;
};

}  // namespace cohort::sharding
