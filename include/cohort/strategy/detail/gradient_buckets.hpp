// The buckets of a step's gradient, for replicas that communicate it while the backward pass goes
// on: consecutive pieces that tile the gradient, taken from its end (a backward pass finishes the
// last layers first), each started once every element in it is final and every bucket before it
// has started. The mirrored replicas cut fixed pieces of bucket_elements; a parameter-server
// worker's buckets are the chunks of its layout. The buckets and their order depend only on how
// the gradient is cut, never on the order in which ranges became ready, so every replica starts
// the same buckets in the same order.
#pragma once

#include <algorithm>
#include <cstddef>
#include <functional>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include "cohort/core/error.hpp"

namespace cohort::strategy::detail {

// How long the mirrored replicas' buckets are: `bytes`, or longer where a gradient would cut into
// more than `most` of them. Each bucket is a collective call, with its wake-ups of the
// communication thread among the replica threads, so a fixed size costs a large model many (an
// 80 MB gradient, 306 buckets of 256 KiB); a bounded count keeps the share of the synchronization
// that the last bucket leaves exposed at 1 / most. The bits do not depend on it.
struct BucketSize {
  std::size_t bytes = std::numeric_limits<std::size_t>::max();
  std::size_t most = std::numeric_limits<std::size_t>::max();

  // The elements of each bucket of a gradient of `elements` values of `element_bytes`.
  std::size_t elements(std::size_t elements, std::size_t element_bytes) const {
    const std::size_t fixed = std::max<std::size_t>(1, bytes / element_bytes);
    return std::max(fixed, elements / most + (elements % most != 0 ? 1 : 0));
  }

  // In words, for the lines that say how a gradient goes: "the whole gradient once the backward
  // pass ends", or "in buckets of N bytes, at most M of them, during the backward pass".
  std::string describe() const {
    constexpr std::size_t kUnbounded = std::numeric_limits<std::size_t>::max();
    if (bytes == kUnbounded) return "the whole gradient once the backward pass ends";
    return "in buckets of " + std::to_string(bytes) + " bytes" +
           (most == kUnbounded ? "" : ", at most " + std::to_string(most) + " of them,") +
           " during the backward pass";
  }

  bool operator==(const BucketSize&) const = default;
};

class GradientBuckets {
 public:
  // A new step over `elements` elements, cut into buckets of `bucket_elements` (>= 1) from the
  // end (the first bucket, the shortest, at 0).
  void begin(std::size_t elements, std::size_t bucket_elements) {
    COHORT_ASSERT(bucket_elements >= 1);
    edges_.clear();
    for (std::size_t end = elements; end > 0; end -= std::min(end, bucket_elements)) {
      edges_.push_back(end);
    }
    edges_.push_back(0);
    restart();
  }

  // A new step over buckets given by their edges: from the gradient's length down to 0, strictly
  // decreasing; bucket k is [edges[k + 1], edges[k]).
  void begin(std::span<const std::size_t> edges) {
    COHORT_ASSERT(!edges.empty() && edges.back() == 0);
    COHORT_ASSERT(std::adjacent_find(edges.begin(), edges.end(), std::less_equal<>()) ==
                  edges.end());
    edges_.assign(edges.begin(), edges.end());
    restart();
  }

  // Elements [begin, end) are final (ranges never overlap: the Trainer checks the model's).
  // Calls start(bucket, bucket_begin, bucket_end) for each bucket that can start now, in order.
  template <class Start>
  void ready(std::size_t begin, std::size_t end, Start&& start) {
    if (begin == end) return;
    // The buckets that overlap [begin, end): from the first whose lower edge is below `end` to
    // the last whose upper edge is above `begin`.
    const auto first = static_cast<std::size_t>(
        std::upper_bound(edges_.begin() + 1, edges_.end(), end, std::greater<>()) - edges_.begin() -
        1);
    const auto last = static_cast<std::size_t>(
        std::lower_bound(edges_.begin(), edges_.end(), begin, std::greater<>()) - edges_.begin() -
        1);
    for (std::size_t bucket = first; bucket <= last; ++bucket) {
      covered_[bucket] += std::min(end, edges_[bucket]) - std::max(begin, edges_[bucket + 1]);
    }
    while (started_ < covered_.size() &&
           covered_[started_] == edges_[started_] - edges_[started_ + 1]) {
      const std::size_t bucket = started_++;
      start(bucket, edges_[bucket + 1], edges_[bucket]);
    }
  }

  bool complete() const { return started_ == covered_.size(); }

 private:
  void restart() {
    covered_.assign(edges_.size() - 1, 0);
    started_ = 0;
  }

  std::vector<std::size_t> edges_{0};
  std::vector<std::size_t> covered_;
  std::size_t started_ = 0;
};

}  // namespace cohort::strategy::detail
