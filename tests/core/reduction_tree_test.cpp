#include "cohort/core/reduction_tree.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cstddef>
#include <string>
#include <vector>

namespace {

std::string leaf_name(std::size_t i) {
  std::string name = "x";
  name += std::to_string(i);
  return name;
}

// Appends piece by piece: "(" + a + "+" + b + ")" trips GCC 12's false -Wrestrict (bug 105329).
std::string join(const std::string& a, const std::string& b) {
  std::string joined = "(";
  joined += a;
  joined += '+';
  joined += b;
  joined += ')';
  return joined;
}

// The expression fold builds over n named leaves.
std::string fold_expression(std::size_t n) { return cohort::tree::fold(n, leaf_name, join); }

// The same tree built another way, as the header describes it: add neighbours level by level,
// an odd last node carried up unchanged.
std::string level_by_level_expression(std::size_t n) {
  std::vector<std::string> level;
  for (std::size_t i = 0; i < n; ++i) level.push_back(leaf_name(i));
  while (level.size() > 1) {
    std::vector<std::string> next;
    for (std::size_t i = 0; i + 1 < level.size(); i += 2)
      next.push_back(join(level[i], level[i + 1]));
    if (level.size() % 2 == 1) next.push_back(level.back());
    level = std::move(next);
  }
  return level.front();
}

std::string streaming_fold_expression(
    cohort::tree::StreamingFold<std::string, void (*)(std::string&, const std::string&)>& fold,
    std::size_t n) {
  fold.reset();
  for (std::size_t i = 0; i < n; ++i) {
    fold.push([i](std::string& slot) { slot = leaf_name(i); });
  }
  return fold.result();
}

void join_into(std::string& left, const std::string& right) { left = join(left, right); }

}  // namespace

TEST_CASE("split is the largest power of two below n") {
  CHECK(cohort::tree::split(2) == 1);
  CHECK(cohort::tree::split(3) == 2);
  CHECK(cohort::tree::split(4) == 2);
  CHECK(cohort::tree::split(5) == 4);
  CHECK(cohort::tree::split(6) == 4);
  CHECK(cohort::tree::split(7) == 4);
  CHECK(cohort::tree::split(8) == 4);
  CHECK(cohort::tree::split(9) == 8);
  CHECK(cohort::tree::split(16) == 8);
  CHECK(cohort::tree::split(17) == 16);
  CHECK(cohort::tree::split(1000) == 512);
  CHECK(cohort::tree::split(1025) == 1024);
  static_assert(cohort::tree::split(12) == 8);
}

TEST_CASE("is_subtree accepts exactly the aligned power-of-two blocks") {
  CHECK(cohort::tree::is_subtree(0, 1));
  CHECK(cohort::tree::is_subtree(5, 1));
  CHECK(cohort::tree::is_subtree(4, 4));
  CHECK(cohort::tree::is_subtree(8, 8));
  CHECK_FALSE(cohort::tree::is_subtree(2, 4));  // not aligned
  CHECK_FALSE(cohort::tree::is_subtree(0, 3));  // not a power of two
  CHECK_FALSE(cohort::tree::is_subtree(0, 6));
}

TEST_CASE("fold combines n = 1..9 leaves in the canonical tree") {
  const std::vector<std::string> expected = {
      "x0",
      "(x0+x1)",
      "((x0+x1)+x2)",
      "((x0+x1)+(x2+x3))",
      "(((x0+x1)+(x2+x3))+x4)",
      "(((x0+x1)+(x2+x3))+(x4+x5))",
      "(((x0+x1)+(x2+x3))+((x4+x5)+x6))",
      "(((x0+x1)+(x2+x3))+((x4+x5)+(x6+x7)))",
      "((((x0+x1)+(x2+x3))+((x4+x5)+(x6+x7)))+x8)",
  };
  for (std::size_t n = 1; n <= expected.size(); ++n) {
    CAPTURE(n);
    CHECK(fold_expression(n) == expected[n - 1]);
  }
}

TEST_CASE("fold is the same tree as adding neighbours level by level, n = 1..70") {
  for (std::size_t n = 1; n <= 70; ++n) {
    CAPTURE(n);
    CHECK(fold_expression(n) == level_by_level_expression(n));
  }
}

TEST_CASE("fold of non-associative floating-point values follows the tree exactly") {
  // Chosen so that different orders give different doubles: 1e16 + 1 rounds back to 1e16.
  const std::vector<double> x = {1e16, 1.0, -1e16, 1.0, 1.0, 1.0, 3.0};
  auto leaf = [&](std::size_t i) { return x[i]; };
  auto add = [](double a, double b) { return a + b; };
  // Written out by hand from the tree; each line is the only order the result may come from.
  const double n5 = ((x[0] + x[1]) + (x[2] + x[3])) + x[4];
  const double n7 = ((x[0] + x[1]) + (x[2] + x[3])) + ((x[4] + x[5]) + x[6]);
  const double n5_left_to_right = (((x[0] + x[1]) + x[2]) + x[3]) + x[4];
  CHECK(cohort::tree::fold(5, leaf, add) == n5);
  CHECK(cohort::tree::fold(7, leaf, add) == n7);
  CHECK(n5 != n5_left_to_right);  // the values do tell orders apart
  CHECK(cohort::tree::fold(1, leaf, add) == x[0]);
}

// Only "exactly once": the order of the calls is unspecified (the two subtrees are arguments of
// one call to combine; GCC happens to evaluate the right one first), so leaf() must not rely on it.
TEST_CASE("fold evaluates every leaf exactly once") {
  for (std::size_t n = 1; n <= 17; ++n) {
    std::vector<std::size_t> visited;
    cohort::tree::fold(
        n,
        [&](std::size_t i) {
          visited.push_back(i);
          return 0;
        },
        [](int a, int b) { return a + b; });
    std::sort(visited.begin(), visited.end());
    CAPTURE(n);
    REQUIRE(visited.size() == n);
    for (std::size_t i = 0; i < n; ++i) CHECK(visited[i] == i);
  }
}

TEST_CASE("StreamingFold gives the fold's tree for n = 1..17, and again after reset") {
  cohort::tree::StreamingFold<std::string, void (*)(std::string&, const std::string&)> fold(
      join_into);
  for (int pass = 0; pass < 2; ++pass) {  // the second pass reuses the slots of the first
    for (std::size_t n = 1; n <= 17; ++n) {
      CAPTURE(pass);
      CAPTURE(n);
      CHECK(streaming_fold_expression(fold, n) == fold_expression(n));
    }
  }
  // Shrinking after a larger run must not see stale partial results.
  CHECK(streaming_fold_expression(fold, 17) == fold_expression(17));
  CHECK(streaming_fold_expression(fold, 3) == fold_expression(3));
}

TEST_CASE("StreamingFold of non-associative floating-point values equals fold") {
  std::vector<double> x;
  for (std::size_t i = 0; i < 17; ++i) x.push_back(i % 3 == 0 ? 1e16 : (i % 3 == 1 ? 1.0 : -1e16));
  auto add_into = [](double& left, const double& right) { left += right; };
  cohort::tree::StreamingFold<double, decltype(add_into)> streaming(add_into);
  for (std::size_t n = 1; n <= 17; ++n) {
    streaming.reset();
    for (std::size_t i = 0; i < n; ++i) streaming.push([&](double& slot) { slot = x[i]; });
    const double expected = cohort::tree::fold(
        n, [&](std::size_t i) { return x[i]; }, [](double a, double b) { return a + b; });
    CAPTURE(n);
    CHECK(streaming.result() == expected);
  }
}

TEST_CASE(
    "deal splits leaves into consecutive nodes, the largest first, as even as the tree allows") {
  using cohort::tree::deal;
  using Counts = std::vector<std::size_t>;
  CHECK(deal(8, 1) == Counts{8});
  CHECK(deal(8, 2) == Counts{4, 4});
  CHECK(deal(8, 3) == Counts{2, 2, 4});
  CHECK(deal(8, 4) == Counts{2, 2, 2, 2});
  CHECK(deal(8, 5) == Counts{1, 1, 2, 2, 2});
  CHECK(deal(8, 8) == Counts(8, 1));
  CHECK(deal(12, 3) == Counts{4, 4, 4});
  CHECK(deal(7, 3) == Counts{2, 2, 3});
  for (std::size_t leaves = 1; leaves <= 40; ++leaves) {
    for (std::size_t parts = 1; parts <= leaves; ++parts) {
      CAPTURE(leaves);
      CAPTURE(parts);
      const Counts counts = deal(leaves, parts);
      CHECK(counts.size() == parts);
      CHECK(cohort::tree::are_nodes(counts));
      // Parts of a power of two leaves each, where they exist, are the equal blocks that were the
      // only deal once.
      if (leaves % parts == 0 && cohort::tree::is_subtree(0, leaves / parts)) {
        CHECK(counts == Counts(parts, leaves / parts));
      }
    }
  }
}

TEST_CASE("are_nodes accepts consecutive nodes of the canonical tree only") {
  using Counts = std::vector<std::size_t>;
  CHECK(cohort::tree::are_nodes(Counts{4, 2, 2}));
  CHECK(cohort::tree::are_nodes(Counts(5, 1)));
  CHECK_FALSE(cohort::tree::are_nodes(Counts{1, 2, 1}));  // [1, 3) is no node
  CHECK_FALSE(cohort::tree::are_nodes(Counts{3, 1}));     // [0, 3) is no node of 4 leaves
  CHECK_FALSE(cohort::tree::are_nodes(Counts{}));
}

TEST_CASE("fold_parts over any deal is the fold over every leaf, n = 1..40") {
  for (std::size_t leaves = 1; leaves <= 40; ++leaves) {
    for (std::size_t parts = 1; parts <= leaves; ++parts) {
      CAPTURE(leaves);
      CAPTURE(parts);
      const std::vector<std::size_t> counts = cohort::tree::deal(leaves, parts);
      std::vector<std::size_t> first(parts, 0);
      for (std::size_t p = 1; p < parts; ++p) first[p] = first[p - 1] + counts[p - 1];
      // Each part folds its own leaves, as a replica folds its micro-batches.
      const auto part = [&](std::size_t p) {
        return cohort::tree::fold(
            counts[p], [&](std::size_t i) { return leaf_name(first[p] + i); }, join);
      };
      CHECK(cohort::tree::fold_parts(std::span<const std::size_t>(counts), part, join) ==
            fold_expression(leaves));
    }
  }
}
