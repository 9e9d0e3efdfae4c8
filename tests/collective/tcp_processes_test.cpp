// The process collectives across real processes over TCP on 127.0.0.1.
#include <doctest/doctest.h>

#include <memory>
#include <string>
#include <vector>

#include "processes.hpp"

namespace {

using cohort::testing::Process;
using cohort::testing::read_file;
using cohort::testing::TemporaryDirectory;
using namespace std::chrono_literals;

}  // namespace

TEST_CASE("ring and deterministic collectives are exact across 2, 3 and 4 processes") {
  TemporaryDirectory directory("cohort-collective-processes");
  for (const char* algorithm : {"deterministic", "ring"}) {
    for (const char* processes : {"2", "3", "4"}) {
      CAPTURE(algorithm);
      CAPTURE(processes);
      const auto result = cohort::testing::run_to_completion(
          {COHORT_RUN, "--np", processes, "--", COHORT_COLLECTIVE_RANK, "exact", algorithm},
          directory.path / "log");
      REQUIRE(result.has_value());
      CAPTURE(result->second);
      CHECK(result->first.exited);
      CHECK(result->first.code == 0);
    }
  }
}

TEST_CASE("processes that call different collectives fail naming both calls") {
  TemporaryDirectory directory("cohort-collective-mismatch");
  const auto result = cohort::testing::run_to_completion(
      {COHORT_RUN, "--np", "2", "--", COHORT_COLLECTIVE_RANK, "mismatch"}, directory.path / "log",
      {}, 60s);
  REQUIRE(result.has_value());
  CAPTURE(result->second);
  CHECK(result->first.code != 0);
  CHECK(result->second.find("rank 0: all_reduce #1: called all_reduce(float, 7, sum) but rank 1 "
                            "called broadcast(float, 7, root 1) #1") != std::string::npos);
}

TEST_CASE("a process killed mid-all-reduce makes every other fail naming it, none left running") {
  TemporaryDirectory directory("cohort-collective-kill");
  const std::string port = std::to_string(cohort::testing::free_port());
  std::vector<std::unique_ptr<Process>> ranks;
  for (int rank = 0; rank < 3; ++rank) {
    ranks.push_back(std::make_unique<Process>(
        std::vector<std::string>{COHORT_COLLECTIVE_RANK, "loop"},
        std::map<std::string, std::string>{{"COHORT_RANK", std::to_string(rank)},
                                           {"COHORT_WORLD_SIZE", "3"},
                                           {"COHORT_MASTER_ADDR", "127.0.0.1"},
                                           {"COHORT_MASTER_PORT", port},
                                           {"COHORT_JOB_ID", "kill-test"}},
        directory.path / ("rank" + std::to_string(rank) + ".log")));
  }
  std::this_thread::sleep_for(1s);
  for (const auto& rank : ranks) REQUIRE_FALSE(rank->wait(0ms).has_value());
  ranks[1]->kill(SIGKILL);
  for (int rank : {0, 2}) {
    CAPTURE(rank);
    const auto exit = ranks[static_cast<std::size_t>(rank)]->wait(15s);
    REQUIRE(exit.has_value());
    CHECK(exit->code == 1);
    const std::string log = read_file(directory.path / ("rank" + std::to_string(rank) + ".log"));
    CAPTURE(log);
    CHECK(log.find("rank " + std::to_string(rank) + ": all_reduce #") != std::string::npos);
    CHECK(log.find("rank 1") != std::string::npos);
  }
}
