#include "cohort/trainer/progress.hpp"

#include <doctest/doctest.h>

#include <string>
#include <vector>

namespace {

std::string worker_and_rank(std::size_t index) {
  return "worker " + std::to_string(index / 2) + " (rank " + std::to_string(index / 2) +
         "), replica " + std::to_string(index);
}

}  // namespace

TEST_CASE("the fit summary names the straggler by worker, rank and replica") {
  // 4 replicas, 2 per worker, 10 s of compute each; replica 3 waited 0.1 s, the others 2 s: they
  // waited for it.
  const std::vector<double> times = {10, 2, 10, 2, 10, 2, 10, 0.1};
  CHECK(cohort::fit_summary(times, 100, worker_and_rank) ==
        "fit: 100 steps on 4 replica(s), per replica: compute 10.00 s, synchronization 1.52 s; "
        "the others waited most for worker 1 (rank 1), replica 3 (it waited 0.10 s, the others "
        "2.00 s on average)");
}

TEST_CASE(
    "the fit summary says no straggler where the waits differ by less than 5% of the time "
    "or than 0.01 s") {
  // The case that named someone before: 0.23 s waited against 0.25 s, 5 s of compute.
  const std::vector<double> times = {5, 0.25, 5, 0.23};
  CHECK(cohort::fit_summary(times, 50, worker_and_rank) ==
        "fit: 50 steps on 2 replica(s), per replica: compute 5.00 s, synchronization 0.24 s; no "
        "straggler (every replica waited 0.23 to 0.25 s at synchronization)");
  // The demo's small model, whose replicas synchronize longer than they compute: 4 ms apart.
  const std::vector<double> small = {0.04, 0.072, 0.04, 0.068, 0.04, 0.071, 0.04, 0.070};
  CHECK(cohort::fit_summary(small, 1560, worker_and_rank)
            .ends_with("; no straggler (every replica "
                       "waited 0.07 to 0.07 s at "
                       "synchronization)"));
  // A fit too short for its waits to show: 3 ms apart is more than 5% of 20 ms, but it would read
  // "it waited 0.00 s, the others 0.00 s".
  const std::vector<double> short_fit = {0.02, 0.004, 0.02, 0.001};
  CHECK(cohort::fit_summary(short_fit, 10, worker_and_rank)
            .ends_with("; no straggler (every replica waited 0.00 to 0.00 s at synchronization)"));
}

TEST_CASE("the fit summary of one replica names nobody") {
  CHECK(cohort::fit_summary({3, 0.5}, 10, worker_and_rank) ==
        "fit: 10 steps on 1 replica(s), per replica: compute 3.00 s, synchronization 0.50 s");
}
