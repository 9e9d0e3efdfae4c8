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

TEST_CASE("a value longer than what travels compares equal to itself after the trip") {
  const cohort::settings::Fields fields = {
      {"optimizer option", std::string(cohort::settings::kValueChars + 40, 'x')}};
  cohort::settings::Reference reference(fields, "parameter server 0");
  const auto sent = cohort::settings::decode(cohort::settings::encode(fields));
  REQUIRE(sent.has_value());
  CHECK(reference.compare(*sent, "worker 0") == "");
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

TEST_CASE("fields survive encode and decode; anything else is not a list of fields") {
  const cohort::settings::Fields fields = {
      {"seed", "11"}, {"optimizer option", "learning_rate=0.003 beta1=0.9"}, {"empty", ""}};
  const auto decoded = cohort::settings::decode(cohort::settings::encode(fields));
  REQUIRE(decoded.has_value());
  REQUIRE(decoded->size() == fields.size());
  for (std::size_t i = 0; i < fields.size(); ++i) {
    CHECK((*decoded)[i].name == fields[i].name);
    CHECK((*decoded)[i].value == fields[i].value);
  }
  CHECK(cohort::settings::decode({})->empty());
  auto bytes = cohort::settings::encode(fields);
  bytes.pop_back();  // a value without its end
  CHECK_FALSE(cohort::settings::decode(bytes).has_value());
  bytes = cohort::settings::encode({{"seed", "11"}});
  bytes.resize(bytes.size() - 3);  // a name without a value
  CHECK_FALSE(cohort::settings::decode(bytes).has_value());
  const std::vector<std::byte> huge(cohort::settings::kMaxEncodedBytes + 2, std::byte{0});
  CHECK_FALSE(cohort::settings::decode(huge).has_value());
}

TEST_CASE(
    "a reference names the first difference with its own fields, then with the first "
    "participant's") {
  cohort::settings::Reference reference({{"optimizer option", "learning_rate=0.003 beta1=0.9"}},
                                        "parameter server 0");
  const auto worker = [](const char* options, const char* seed) {
    return cohort::settings::Fields{{"seed", seed}, {"optimizer option", options}};
  };
  CHECK(reference.compare(worker("learning_rate=0.003 beta1=0.9", "11"), "worker 0") == "");
  CHECK(reference.compare(worker("learning_rate=0.003 beta1=0.9", "11"), "worker 1") == "");
  const std::string options = reference.compare(worker("learning_rate=0.01 beta1=0.9", "11"),
                                                "worker 2");
  CHECK(options.find("optimizer option learning_rate is 0.003 on parameter server 0 but 0.01 on "
                     "worker 2") != std::string::npos);
  const std::string seed = reference.compare(worker("learning_rate=0.003 beta1=0.9", "12"),
                                             "worker 3");
  CHECK(seed.find("seed is 11 on worker 0 but 12 on worker 3") != std::string::npos);
  CHECK(seed.find("before the first step") != std::string::npos);
  const std::string missing = reference.compare({{"seed", "11"}}, "worker 4");
  CHECK(missing.find("optimizer option is learning_rate=0.003 beta1=0.9 on parameter server 0 but "
                     "not given on worker 4") != std::string::npos);
}
