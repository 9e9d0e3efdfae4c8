// The buckets of a step's gradient, for replicas that reduce it while the backward pass goes on:
// fixed pieces of bucket_elements, cut from the end of the gradient (a backward pass finishes the
// last layers first), each started once every element in it is final and every bucket before it
// has started. The buckets and their order depend only on the gradient's length and the bucket
// size, never on the order in which ranges became ready, so every replica starts the same
// collectives in the same order.
#pragma once

#include <algorithm>
#include <cstddef>
#include <vector>

#include "cohort/core/error.hpp"

namespace cohort::strategy::detail {

class GradientBuckets {
 public:
  // A new step over `elements` elements, cut into buckets of `bucket_elements` (>= 1).
  void begin(std::size_t elements, std::size_t bucket_elements) {
    COHORT_ASSERT(bucket_elements >= 1);
    elements_ = elements;
    bucket_elements_ = bucket_elements;
    covered_.assign((elements + bucket_elements - 1) / bucket_elements, 0);
    started_ = 0;
  }

  // Elements [begin, end) are final (ranges never overlap: the Trainer checks the model's).
  // Calls start(bucket_begin, bucket_end) for each bucket that can start now, in order.
  template <class Start>
  void ready(std::size_t begin, std::size_t end, Start&& start) {
    if (begin == end) return;
    // Bucket k covers [elements - (k + 1) x size, elements - k x size), clipped at 0.
    const std::size_t first = (elements_ - end) / bucket_elements_;
    const std::size_t last = (elements_ - begin - 1) / bucket_elements_;
    for (std::size_t bucket = first; bucket <= last; ++bucket) {
      const Range range = bounds(bucket);
      covered_[bucket] += std::min(end, range.end) - std::max(begin, range.begin);
    }
    while (started_ < covered_.size() && covered_[started_] == bounds(started_).size()) {
      const Range range = bounds(started_++);
      start(range.begin, range.end);
    }
  }

  bool complete() const { return started_ == covered_.size(); }

 private:
  struct Range {
    std::size_t begin;
    std::size_t end;
    std::size_t size() const { return end - begin; }
  };

  Range bounds(std::size_t bucket) const {
    const std::size_t end = elements_ - bucket * bucket_elements_;
    return {end - std::min(end, bucket_elements_), end};
  }

  std::size_t elements_ = 0;
  std::size_t bucket_elements_ = 1;
  std::vector<std::size_t> covered_;
  std::size_t started_ = 0;
};

}  // namespace cohort::strategy::detail
