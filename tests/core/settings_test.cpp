#include "cohort/core/settings.hpp"

#include <doctest/doctest.h>

#include <cohort/collective/local.hpp>
#include <cstddef>
#include <exception>
#include <string>
#include <thread>
#include <vector>

namespace {

// Runs require_same on `participants` threads of one process, participant i with fields(i);
// returns what each threw ("" when it returned).
template <class Fields>
std::vector<std::string> exchange(int participants, Fields&& fields) {
  cohort::collective::Local group({.ranks = participants});
  std::vector<std::string> thrown(static_cast<std::size_t>(participants));
  std::vector<std::thread> threads;
  for (int rank = 0; rank < participants; ++rank) {
    threads.emplace_back([&, rank] {
      auto communicator = group.communicator(rank);
      try {
        cohort::settings::require_same(fields(rank), "participant " + std::to_string(rank),
                                       static_cast<std::size_t>(rank),
                                       [&](std::span<double> values) {
                                         communicator.all_reduce(values, cohort::ReduceOp::kMax);
                                       });
      } catch (const cohort::ConfigError& error) {
        thrown[static_cast<std::size_t>(rank)] = error.what();
      }
    });
  }
  for (auto& thread : threads) thread.join();
  return thrown;
}

}  // namespace

TEST_CASE("settings that agree pass on every participant") {
  for (int participants : {1, 2, 3, 5}) {
    const auto thrown = exchange(participants, [](int) {
      return cohort::settings::Fields{{"seed", "11"}, {"micro_batches", "8"}};
    });
    for (const auto& what : thrown) CHECK(what.empty());
  }
}

TEST_CASE("a setting that differs is refused on every participant, naming it and both values") {
  const auto thrown = exchange(3, [](int rank) {
    return cohort::settings::Fields{
        {"seed", "11"}, {"micro_batches", rank == 2 ? "4" : "8"}, {"global_batch", "64"}};
  });
  for (const auto& what : thrown) {
    CAPTURE(what);
    CHECK(what.find("micro_batches is 8 on participant 0 but 4 on participant 2") !=
          std::string::npos);
    CHECK(what.find("before the first step") != std::string::npos);
  }
}

TEST_CASE("a list of options names the first option that differs") {
  const auto thrown = exchange(2, [](int rank) {
    return cohort::settings::Fields{{"optimizer option", rank == 0
                                                             ? "learning_rate=0.003 beta1=0.9"
                                                             : "learning_rate=0.01 beta1=0.9"}};
  });
  for (const auto& what : thrown) {
    CAPTURE(what);
    CHECK(what.find("optimizer option learning_rate is 0.003 on participant 0 but 0.01 on "
                    "participant 1") != std::string::npos);
  }
}
