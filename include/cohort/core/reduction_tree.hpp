// The reduction rule: the one order in which cohort adds gradients.
//
// Floating-point addition is not associative, so a sum is reproducible only if its order is fixed.
// cohort fixes it as the canonical pairwise tree over n leaves:
//
//     fold(leaves [0, n)) = fold([0, s)) + fold([s, n)),   s = the largest power of two below n
//
// (the same tree as adding neighbours level by level: (x0+x1), (x2+x3), ... then pairs of those,
// an odd last node carried up). For n = 5 it is ((x0+x1)+(x2+x3))+x4.
//
// The leaves of a training step are its micro-batches, numbered in the global batch. Any aligned
// block of 2^k leaves is one subtree, so a replica that owns such a block can fold it locally and
// contribute a single buffer: the cross-replica fold over replicas, in the same tree, then gives
// exactly the bits of the fold over all micro-batches. That is why parameters are bit-identical
// for 1, 2, 4 or 8 replicas, threads or processes; it is also why every collective in cohort
// combines ranks in this order.
//
// A replica count that is not a power of two is dealt nodes of different sizes (deal below: 8
// micro-batches over 3 replicas are the nodes of 2, 2 and 4 leaves), and the fold across replicas
// is then the canonical tree over the leaves, each replica's node taken whole (fold_parts): the
// same bits again, the collectives told each rank's leaf count.
#pragma once

#include <algorithm>
#include <bit>
#include <cstddef>
#include <numeric>
#include <span>
#include <utility>
#include <vector>

#include "cohort/core/error.hpp"

namespace cohort::tree {

// The size of the left subtree of a node over n >= 2 leaves.
constexpr std::size_t split(std::size_t n) { return std::bit_floor(n - 1); }

// True when leaves [first, first + count) form one node of the canonical tree over any number of
// leaves that contains them whole.
constexpr bool is_subtree(std::size_t first, std::size_t count) {
  return std::has_single_bit(count) && first % count == 0;
}

namespace detail {
template <class Leaf, class Combine>
auto fold_range(std::size_t first, std::size_t count, Leaf& leaf, Combine& combine) {
  if (count == 1) return leaf(first);
  const std::size_t left_count = split(count);
  // Named, so that leaves are visited in index order (function arguments have no fixed order).
  auto left = fold_range(first, left_count, leaf, combine);
  auto right = fold_range(first + left_count, count - left_count, leaf, combine);
  return combine(std::move(left), std::move(right));
}
}  // namespace detail

// Folds leaf(0) .. leaf(n - 1), n >= 1, in the canonical order, visiting leaves in index order;
// combine(a, b) returns a (+) b.
template <class Leaf, class Combine>
auto fold(std::size_t n, Leaf leaf, Combine combine) {
  COHORT_ASSERT(n >= 1);
  return detail::fold_range(0, n, leaf, combine);
}

// A deal of `leaves` leaves into `parts` consecutive nodes of the canonical tree, as even as the
// tree allows: from the root, the node with the most leaves (the leftmost of them) is split into
// its two children until there are `parts`. Each part's leaf count, in leaf order. Where
// leaves / parts is a whole power of two, every part has that many. Requires 1 <= parts <= leaves.
inline std::vector<std::size_t> deal(std::size_t leaves, std::size_t parts) {
  COHORT_ASSERT(parts >= 1 && parts <= leaves);
  std::vector<std::size_t> counts{leaves};
  counts.reserve(parts);
  while (counts.size() < parts) {
    const auto largest = std::max_element(counts.begin(), counts.end());
    const std::size_t count = *largest;
    *largest = split(count);
    counts.insert(largest + 1, count - split(count));
  }
  return counts;
}

// Whether `counts` are consecutive nodes of the canonical tree over their sum (a deal, or every
// count 1).
inline bool are_nodes(std::span<const std::size_t> counts) {
  std::size_t next = 0;
  const auto covers = [&](const auto& self, std::size_t leaves) -> bool {
    if (next == counts.size() || counts[next] > leaves) return false;
    if (counts[next] == leaves) {
      ++next;
      return true;
    }
    return self(self, split(leaves)) && self(self, leaves - split(leaves));
  };
  const std::size_t total = std::accumulate(counts.begin(), counts.end(), std::size_t{0});
  return total >= 1 && covers(covers, total) && next == counts.size();
}

namespace detail {
template <class Part, class Combine>
auto fold_parts_range(std::span<const std::size_t> counts, std::size_t& next, std::size_t leaves,
                      Part& part, Combine& combine) {
  if (counts[next] == leaves) return part(next++);
  const std::size_t left_leaves = split(leaves);
  auto left = fold_parts_range(counts, next, left_leaves, part, combine);
  auto right = fold_parts_range(counts, next, leaves - left_leaves, part, combine);
  return combine(std::move(left), std::move(right));
}
}  // namespace detail

// Folds part(0) .. part(n - 1), the values of n consecutive nodes of the canonical tree with
// `counts` leaves each (are_nodes), in the canonical tree over all their leaves, visiting parts in
// order: fold(n, ...) where every count is 1.
template <class Part, class Combine>
auto fold_parts(std::span<const std::size_t> counts, Part part, Combine combine) {
  COHORT_ASSERT(are_nodes(counts));
  std::size_t next = 0;
  return detail::fold_parts_range(
      counts, next, std::accumulate(counts.begin(), counts.end(), std::size_t{0}), part, combine);
}

// Folds leaves that arrive one at a time, in order, keeping O(log n) partial results: the
// canonical tree computed as a binary counter. combine_into(left, right) sets left = left (+)
// right.
template <class Value, class CombineInto>
class StreamingFold {
 public:
  explicit StreamingFold(CombineInto combine_into) : combine_into_(std::move(combine_into)) {}

  // `assign(slot)` writes the next leaf into slot, a Value reused across steps (no allocation once
  // the stack has reached its depth).
  template <class Assign>
  void push(Assign&& assign) {
    if (depth_ == stack_.size()) stack_.emplace_back();
    assign(stack_[depth_].value);
    stack_[depth_].leaves = 1;
    ++depth_;
    while (depth_ >= 2 && stack_[depth_ - 1].leaves == stack_[depth_ - 2].leaves) merge_top();
  }

  // The fold of every leaf pushed since the last reset. Merging the right spine from the top is
  // what makes an incomplete tree (n not a power of two) match fold().
  Value& result() {
    COHORT_ASSERT(depth_ >= 1);
    while (depth_ >= 2) merge_top();
    return stack_[0].value;
  }

  void reset() { depth_ = 0; }

  // The last leaf, arriving in parts (a model that reports gradient readiness), so that each part
  // of the result is final as soon as that part of the leaf is:
  //   Value& leaf = fold.begin_last();          // the last leaf's slot
  //   Value& result = fold.result_slot();       // where the result will be (also before the
  //                                             // first leaf: the first leaf goes there)
  //   for each part: write it into leaf, then fold.finish_part(combine_part);
  //   fold.end_last();                          // once every part is done
  // finish_part runs the merges that push() and result() would run, in the same order, on the
  // part only: combine_part(left, right) sets that part of left to left (+) right. After
  // end_last() the fold is as after push() and result().
  Value& begin_last() {
    if (depth_ == stack_.size()) stack_.emplace_back();
    return stack_[depth_].value;
  }
  Value& result_slot() {
    if (stack_.empty()) stack_.emplace_back();
    return stack_[0].value;
  }
  template <class CombinePart>
  void finish_part(CombinePart&& combine_part) {
    for (std::size_t top = depth_; top >= 1; --top) {
      combine_part(stack_[top - 1].value, stack_[top].value);
    }
  }
  void end_last() {
    std::size_t leaves = 1;
    for (std::size_t node = 0; node < depth_; ++node) leaves += stack_[node].leaves;
    stack_[0].leaves = leaves;
    depth_ = 1;
  }

 private:
  struct Node {
    Value value{};
    std::size_t leaves = 0;
  };

  void merge_top() {
    Node& left = stack_[depth_ - 2];
    combine_into_(left.value, stack_[depth_ - 1].value);
    left.leaves += stack_[depth_ - 1].leaves;
    --depth_;
  }

  CombineInto combine_into_;
  std::vector<Node> stack_;
  std::size_t depth_ = 0;
};

}  // namespace cohort::tree
