#include "cohort/core/sharding.hpp"

#include <doctest/doctest.h>

#include <cstddef>
#include <string>
#include <vector>

#include "error_message.hpp"

namespace {

using Counts = std::vector<std::size_t>;

Counts counts_of(std::span<const std::size_t> counts) { return {counts.begin(), counts.end()}; }

}  // namespace

TEST_CASE("a deal gives workers nodes first, then each worker's node to its local replicas") {
  const cohort::sharding::Deal deal(8, 6, 2);  // 3 workers of 2 replicas
  CHECK(counts_of(deal.worker_counts()) == Counts{2, 2, 4});
  CHECK(counts_of(deal.counts()) == Counts{1, 1, 1, 1, 2, 2});
  CHECK(deal.first(4) == 4);
  CHECK(deal.count(4) == 2);
  // Equal blocks where micro_batches / replicas is a power of two.
  CHECK(counts_of(cohort::sharding::Deal(16, 4, 2).counts()) == Counts(4, 4));
}

TEST_CASE("a deal over more shares than workers gives the workers the first shares") {
  // 3 workers of 2 replicas left of a job dealt over 4, whose steps aggregate 3 shares: each keeps
  // a quarter of the 16 micro-batches, and the last quarter goes undealt.
  const cohort::sharding::Deal deal(16, 6, 2, {.dealt = 4, .aggregated = 3});
  CHECK(counts_of(deal.share_counts()) == Counts(4, 4));
  CHECK(counts_of(deal.worker_counts()) == Counts{4, 4, 4});
  CHECK(counts_of(deal.counts()) == Counts(6, 2));
  CHECK(deal.first(5) == 10);
  // As many shares as workers: the deal over the workers.
  CHECK(counts_of(cohort::sharding::Deal(8, 6, 2, cohort::sharding::Shares::of(3)).counts()) ==
        counts_of(cohort::sharding::Deal(8, 6, 2).counts()));
}

TEST_CASE(
    "fewer workers than the shares a step aggregates take consecutive shares each, a node of the "
    "tree over them") {
  // A job dealt over 4 shares of 4 micro-batches, aggregating the first 3: 2 workers take 2 shares
  // and 1, the nodes of the tree over 3 leaves, and the last share goes undealt.
  const cohort::sharding::Shares shares{.dealt = 4, .aggregated = 3};
  const cohort::sharding::Deal two(16, 4, 2, shares);
  CHECK(counts_of(two.worker_counts()) == Counts{8, 4});
  CHECK(counts_of(two.counts()) == Counts{4, 4, 2, 2});
  CHECK(two.first(3) == 10);
  // One worker takes the 3 shares, 12 micro-batches: the tree over 12 leaves splits them as the
  // tree over the 3 shares does, (4 + 4) + 4.
  CHECK(counts_of(cohort::sharding::Deal(16, 1, 1, shares).worker_counts()) == Counts{12});
  // 7 of 8 shares over 3 workers: 2, 2 and 3 shares, the largest node split first.
  CHECK(
      counts_of(cohort::sharding::Deal(16, 3, 1, {.dealt = 8, .aggregated = 7}).worker_counts()) ==
      Counts{4, 4, 6});
}

TEST_CASE("a deal that leaves a replica without a micro-batch is refused, naming what would do") {
  // 2 workers of 2 replicas: 5 micro-batches deal them 4 and 1.
  const std::string message =
      cohort::testing::config_error_message([] { cohort::sharding::Deal::validate(5, 4, 2); });
  CHECK(message.find("micro_batches") != std::string::npos);
  CHECK(message.find("deals a worker 1 micro-batches, fewer than its 2 local replicas: 4") !=
        std::string::npos);
  CHECK(cohort::testing::config_error_message([] { cohort::sharding::Deal::validate(4, 5, 1); })
            .find("must be at least the replicas (5)") != std::string::npos);
  // A process that runs no replica (a parameter server) checks what does not depend on a
  // worker's replicas.
  CHECK(cohort::testing::config_error_message([] { cohort::sharding::Deal::validate(5, 4, 0); }) ==
        "(no error)");
  CHECK(cohort::testing::config_error_message([] {
          cohort::sharding::Deal::validate(3, 4, 0);
        }).find("must be at least the replicas (4)") != std::string::npos);
}
