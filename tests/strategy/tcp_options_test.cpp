#include "cohort/strategy/detail/tcp_options.hpp"

#include <doctest/doctest.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "captured_stderr.hpp"
#include "cohort/collective/deterministic.hpp"
#include "cohort/transport/loopback.hpp"

using cohort::cluster::Binding;
using cohort::cluster::Spec;

namespace {

struct Rank {
  std::string own;      // its own address
  int group = 0;        // 0 workers, 1 servers
  int local_rank = -1;  // given by the launcher; -1: not given
  int local_size = -1;
};

struct Outcome {
  Spec spec;
  std::string error;
};

// Every rank as a thread over a Loopback transport, each calling learn_local_ranks.
std::vector<Outcome> learn(const std::vector<Rank>& ranks) {
  const int size = static_cast<int>(ranks.size());
  cohort::transport::Loopback group({.ranks = size});
  std::vector<Outcome> outcomes(ranks.size());
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      const Rank& rank = ranks[static_cast<std::size_t>(r)];
      Spec spec;
      spec.rank = r;
      spec.size = size;
      spec.source = "COHORT_* variables";
      spec.local_given = rank.local_rank >= 0;
      spec.local_rank = spec.local_given ? rank.local_rank : r;
      spec.local_size = spec.local_given ? rank.local_size : size;
      const Binding binding{.address = rank.own, .origin = "test", .own = rank.own};
      cohort::collective::Deterministic<cohort::transport::Loopback::Endpoint> all(
          group.endpoint(r));
      Outcome& outcome = outcomes[static_cast<std::size_t>(r)];
      try {
        outcome.spec =
            cohort::strategy::detail::learn_local_ranks(all, spec, binding, r, rank.group);
      } catch (const cohort::ConfigError& error) {
        outcome.error = error.what();
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  return outcomes;
}

}  // namespace

TEST_CASE("ranks without local variables learn their local ranks from their own addresses") {
  const auto outcomes = learn({{"10.0.0.1"}, {"10.0.0.1"}, {"10.0.0.2"}, {"10.0.0.1"}});
  const int expected[][2] = {{0, 3}, {1, 3}, {0, 1}, {2, 3}};
  for (std::size_t r = 0; r < outcomes.size(); ++r) {
    CAPTURE(r);
    CHECK(outcomes[r].error.empty());
    CHECK(outcomes[r].spec.local_given);
    CHECK(outcomes[r].spec.local_rank == expected[r][0]);
    CHECK(outcomes[r].spec.local_size == expected[r][1]);
  }
}

TEST_CASE("workers and servers count their local ranks among their own role") {
  const auto outcomes =
      learn({{"10.0.0.1", 0}, {"10.0.0.2", 0}, {"10.0.0.1", 1}, {"10.0.0.1", 1}, {"10.0.0.1", 0}});
  const int expected[][2] = {{0, 2}, {0, 1}, {0, 2}, {1, 2}, {1, 2}};
  for (std::size_t r = 0; r < outcomes.size(); ++r) {
    CAPTURE(r);
    CHECK(outcomes[r].spec.local_rank == expected[r][0]);
    CHECK(outcomes[r].spec.local_size == expected[r][1]);
  }
}

TEST_CASE("a launcher's local ranks stand where they agree, and fail every rank where not") {
  const auto agree = learn({{"10.0.0.1", 0, 0, 2}, {"10.0.0.1", 0, 1, 2}, {"10.0.0.2", 0, 0, 1}});
  for (const Outcome& outcome : agree) CHECK(outcome.error.empty());
  CHECK(agree[1].spec.local_rank == 1);

  // One host's local variables copied to every host.
  const auto copied = learn({{"10.0.0.1", 0, 0, 2}, {"10.0.0.2", 0, 1, 2}});
  for (const Outcome& outcome : copied) {
    CHECK(outcome.error ==
          "local ranks: mesh rank 0 was given local rank 0 of 2 (COHORT_* variables), but at the "
          "rendezvous 1 rank(s) of its role share its address 10.0.0.1, where it is local rank "
          "0. Correct or unset the launcher's local variables (docs/launching.md, \"Local "
          "ranks\")");
  }

  // On loopback several ranks may stand for several hosts (tests): not checked.
  const auto pretend = learn({{"127.0.0.1", 0, 0, 1}, {"127.0.0.1", 0, 0, 1}});
  for (const Outcome& outcome : pretend) {
    CHECK(outcome.error.empty());
    CHECK(outcome.spec.local_size == 1);
  }
}

TEST_CASE("the start-up line names both deadlines: the rendezvous's and each transfer's") {
  // A user who sets COHORT_TIMEOUT=3s and whose peer never starts waits for the rendezvous's own
  // deadline: the first line the process prints says so, and which setting changes it.
  cohort::strategy::detail::TcpSetup setup;
  setup.options.connect_timeout = std::chrono::seconds(60);
  setup.options.operation_timeout = std::chrono::milliseconds(3000);
  setup.binding = {.address = "127.0.0.1", .origin = "a test", .own = "127.0.0.1"};
  cohort::testing::CapturedStderr log;
  cohort::strategy::detail::announce("rank 1 of 2", setup);
  CHECK(log.finish() ==
        "cohort: rank 1 of 2, listening on 127.0.0.1 (a test); meets the others within 60 s "
        "(connect_timeout or COHORT_CONNECT_TIMEOUT), then each transfer within 3 s (timeout or "
        "COHORT_TIMEOUT)\n");
}
