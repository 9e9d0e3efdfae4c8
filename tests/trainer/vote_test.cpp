// trainer::Vote's schedule: how many steps pass between two votes, from the slowest step time the
// last vote agreed on.
#include "cohort/trainer/vote.hpp"

#include <doctest/doctest.h>

#include <cstdint>

using cohort::trainer::Vote;

TEST_CASE("votes come about every 0.1 s of steps, the interval at most doubling, at most 256") {
  // Steps of 10 ms: 10 steps, once the interval has grown there.
  CHECK(Vote::steps_between_votes(0.010, 1) == 2);
  CHECK(Vote::steps_between_votes(0.010, 8) == 10);
  CHECK(Vote::steps_between_votes(0.010, 100) == 10);
  // Steps of 1 s: every step.
  CHECK(Vote::steps_between_votes(1.0, 64) == 1);
  // Steps of 13 us, which would give 7,692: the interval doubles from 1, and stops at 256.
  std::uint64_t interval = 1;
  std::uint64_t step = 0;
  while (interval < Vote::kMostSteps) {
    const std::uint64_t next = Vote::steps_between_votes(13e-6, interval);
    CHECK(next == 2 * interval);
    interval = next;
    step += interval;
  }
  CHECK(interval == 256);
  CHECK(step < 512);  // a signal at step 100 is heard before step 512 (it was never, before)
  CHECK(Vote::steps_between_votes(13e-6, interval) == 256);
  // No step time measured (a vote before any step): the next step.
  CHECK(Vote::steps_between_votes(0.0, 256) == 1);
}
