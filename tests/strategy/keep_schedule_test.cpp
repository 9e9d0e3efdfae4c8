// How often an elastic job's workers keep their own copies of the whole state
// (strategy/detail/keep_schedule.hpp): as often as 1% of the step time allows, at most every 16
// steps, the longest interval any worker needs. The steps' ends are given, not timed.
#include <doctest/doctest.h>

#include <chrono>
#include <cohort/collective/local.hpp>
#include <cohort/strategy/detail/keep_schedule.hpp>
#include <cstdint>
#include <thread>
#include <vector>

namespace {

using cohort::strategy::detail::keep_interval;
using cohort::strategy::detail::KeepSchedule;
using namespace std::chrono_literals;

// A schedule whose steps each ended `step` after the last, `steps` of them, that then kept a copy
// of their state in `keep_seconds` over `communicator`.
template <class Communicator>
KeepSchedule scheduled(std::uint64_t steps, KeepSchedule::Clock::duration step, double keep_seconds,
                       Communicator& communicator) {
  KeepSchedule schedule;
  KeepSchedule::Clock::time_point now{};
  for (std::uint64_t ended = 0; ended < steps; ++ended) {
    now += step;
    schedule.step_finished(now);
  }
  schedule.kept(steps, keep_seconds, communicator);
  return schedule;
}

}  // namespace

TEST_CASE("the interval keeps a copy's cost within the share of the step time, from 16 steps") {
  // The examples' MLP sharing over TCP: a copy of 10 ms, steps of 27 ms.
  CHECK(keep_interval(0.010, 0.027, 0.01, 16) == 38);
  // A copy cheap next to a step, or no step time: every 16 steps.
  CHECK(keep_interval(0.0001, 0.1, 0.01, 16) == 16);
  CHECK(keep_interval(0.5, 0.0, 0.01, 16) == 16);
  // No step to speak of beside the copy: as rarely as the interval can say.
  CHECK(keep_interval(1.0, 1e-12, 0.01, 16) == 1'000'000'000);
}

TEST_CASE(
    "workers keep every 16 steps until they have timed 8 steps of the segment, then at the "
    "longest interval any of them needs, counted from the copy that agreed it") {
  const cohort::collective::Local alone({.ranks = 1});
  auto communicator = alone.communicator(0);
  // 8 steps ended, 7 timed: the default stays.
  const KeepSchedule early = scheduled(8, 10ms, 0.05, communicator);
  CHECK(early.every() == 16);
  CHECK(early.keeps(32));
  CHECK_FALSE(early.keeps(40));
  // 9 ended, 8 timed: 50 ms a copy beside steps of 10 ms keeps every 500 steps, from step 9.
  const KeepSchedule timed = scheduled(9, 10ms, 0.05, communicator);
  CHECK(timed.every() == 500);
  CHECK_FALSE(timed.keeps(32));
  CHECK_FALSE(timed.keeps(500));
  CHECK(timed.keeps(509));

  // Two workers, one of which needs 100 steps and the other 500: both take 500.
  const cohort::collective::Local pair({.ranks = 2});
  std::vector<std::uint64_t> every(2);
  std::vector<std::thread> workers;
  for (int rank = 0; rank < 2; ++rank) {
    workers.emplace_back([&, rank] {
      auto mine = pair.communicator(rank);
      every[static_cast<std::size_t>(rank)] =
          scheduled(16, 10ms, rank == 0 ? 0.01 : 0.05, mine).every();
    });
  }
  for (std::thread& worker : workers) worker.join();
  CHECK(every == std::vector<std::uint64_t>{500, 500});
}
