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

TEST_CASE(
    "ring and deterministic collectives, over TCP and through shared memory, are exact across 2, 3 "
    "and 4 processes, deterministic's with the canonical tree's bits, and leave nothing in "
    "/dev/shm") {
  TemporaryDirectory directory("cohort-collective-processes");
  const auto segments = cohort::testing::shared_memory_segments();
  for (const char* algorithm : {"deterministic", "ring", "shared"}) {
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
  CHECK(cohort::testing::segments_left_since(segments).empty());
}

// Through shared memory, the set-up's three collectives come first.
TEST_CASE("processes that call different collectives fail naming both calls") {
  TemporaryDirectory directory("cohort-collective-mismatch");
  for (const bool shared : {false, true}) {
    CAPTURE(shared);
    const std::string sequence = shared ? "#4" : "#1";
    const auto result = cohort::testing::run_to_completion(
        {COHORT_RUN, "--np", "2", "--", COHORT_COLLECTIVE_RANK, "mismatch", shared ? "shared" : ""},
        directory.path / "log", {}, 60s);
    REQUIRE(result.has_value());
    CAPTURE(result->second);
    CHECK(result->first.code != 0);
    CHECK(result->second.find("rank 0: all_reduce " + sequence +
                              ": called all_reduce(float, 7, sum) but rank 1 called "
                              "broadcast(float, 7, root 1) " +
                              sequence) != std::string::npos);
  }
}

TEST_CASE_TEMPLATE_DEFINE(
    "a process killed mid-all-reduce makes every other fail naming it, none "
    "left running",
    Medium, killed_mid_all_reduce) {
  TemporaryDirectory directory("cohort-collective-kill");
  const std::string port = std::to_string(cohort::testing::free_port());
  std::vector<std::unique_ptr<Process>> ranks;
  for (int rank = 0; rank < 3; ++rank) {
    ranks.push_back(std::make_unique<Process>(
        std::vector<std::string>{COHORT_COLLECTIVE_RANK, "loop", Medium::kArgument},
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

struct OverTcp {
  static constexpr const char* kArgument = "";
};
struct ThroughSharedMemory {
  static constexpr const char* kArgument = "shared";
};
TEST_CASE_TEMPLATE_INVOKE(killed_mid_all_reduce, OverTcp, ThroughSharedMemory);
