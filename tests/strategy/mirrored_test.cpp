#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>

#include "error_message.hpp"
#include "processes.hpp"
#include "training.hpp"

namespace {

using cohort::testing::parameters_of;
using cohort::testing::small_model;
using cohort::testing::small_task_data;

template <class Optimizer>
struct Run {
  std::vector<float> parameters;
  cohort::Report report;
};

template <class Optimizer>
Run<Optimizer> train_mirrored(std::size_t replicas, std::uint64_t steps,
                              std::size_t micro_batches = 8) {
  cohort::Trainer trainer(small_model(), cohort::strategy::Mirrored<>({.replicas = replicas}),
                          cohort::testing::test_optimizer<Optimizer>(),
                          {.global_batch = 64,
                           .micro_batches = micro_batches,
                           .seed = 11,
                           .progress = cohort::Progress::kSilent});
  cohort::Report report = trainer.fit(small_task_data(), {.steps = steps});
  return {parameters_of(trainer.model()), std::move(report)};
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Adam with global-norm clipping (test_optimizer), 30 steps.
template <class Model>
std::vector<float> train_adam(Model model, std::size_t replicas) {
  cohort::Trainer trainer(std::move(model), cohort::strategy::Mirrored<>({.replicas = replicas}),
                          cohort::testing::test_optimizer<cohort::optimizer::Adam>(),
                          {.global_batch = 64, .seed = 11, .progress = cohort::Progress::kSilent});
  trainer.fit(small_task_data(), {.steps = 30});
  return parameters_of(trainer.model());
}

std::string refusal(std::vector<std::pair<std::size_t, std::size_t>> ranges) {
  return cohort::testing::config_error_message([&] {
    train_adam(cohort::testing::ScriptedReadiness{small_model(), std::move(ranges)}, 1);
  });
}

}  // namespace

// 3, 5, 6 and 7 replicas are dealt the 8 micro-batches unevenly (core/sharding.hpp, Deal: 3 take
// 2, 2 and 4), and the collective folds each replica as a node of its count.
TEST_CASE_TEMPLATE(
    "Mirrored on 1 to 8 replicas gives bit-identical parameters and losses after 50 steps",
    Optimizer, cohort::optimizer::Sgd, cohort::optimizer::Momentum, cohort::optimizer::Adam,
    cohort::optimizer::AdamW) {
  const Run<Optimizer> one = train_mirrored<Optimizer>(1, 50);
  REQUIRE(one.report.steps == 50);
  REQUIRE(one.report.loss.size() == 50);
  CHECK(one.report.loss.back() < one.report.loss.front());  // it trains
  CHECK_FALSE(same_bits(one.parameters, parameters_of(small_model())));
  for (std::size_t replicas : {2, 3, 4, 5, 6, 7, 8}) {
    CAPTURE(replicas);
    const Run<Optimizer> many = train_mirrored<Optimizer>(replicas, 50);
    CHECK(same_bits(many.parameters, one.parameters));
    CHECK(many.report.loss == one.report.loss);
  }
}

TEST_CASE(
    "replicas of a model of 64 KiB or more share the update in stripes and end with one "
    "replica's parameters and optimizer state, clipped or not") {
  cohort::testing::TemporaryDirectory directory("cohort-mirrored-stripes");
  // 26,628 parameters: above LocalCommunicator::kShareMinimumBytes, so the update is shared out.
  static_assert((8 * 2048 + 2048 + 2048 * 4 + 4) * sizeof(float) >=
                cohort::collective::LocalCommunicator::kShareMinimumBytes);
  const auto checkpoint_of = [&](std::size_t replicas, double max_norm) {
    cohort::Trainer trainer(
        example::Mlp({8, 2048, 4}, 7), cohort::strategy::Mirrored<>({.replicas = replicas}),
        cohort::optimizer::Adam({.learning_rate = 3e-3, .max_gradient_norm = max_norm}),
        {.global_batch = 64, .seed = 11, .progress = cohort::Progress::kSilent});
    trainer.fit(small_task_data(), {.steps = 20});
    const auto file = directory.path / ("replicas-" + std::to_string(replicas) + ".ckpt");
    trainer.save(file);  // the optimizer state gathered from the stripes
    return cohort::testing::read_file(file);
  };
  for (const double max_norm : {0.0, 0.05}) {
    CAPTURE(max_norm);
    const std::string one = checkpoint_of(1, max_norm);
    for (std::size_t replicas : {2, 3}) {
      CAPTURE(replicas);
      CHECK(checkpoint_of(replicas, max_norm) == one);
    }
  }
}

TEST_CASE("the micro-batch count is part of the result's definition") {
  // The guarantee is per micro_batches: a different split is a different sum order, and this test
  // shows the comparison above is sharp enough to see it.
  const auto eight = train_mirrored<cohort::optimizer::Adam>(2, 20, 8);
  const auto four = train_mirrored<cohort::optimizer::Adam>(2, 20, 4);
  CHECK_FALSE(same_bits(eight.parameters, four.parameters));
}

TEST_CASE("fit counts epochs and steps from the beginning of the run") {
  cohort::Trainer trainer(small_model(), cohort::strategy::Mirrored<>({.replicas = 2}),
                          cohort::testing::test_optimizer<cohort::optimizer::Sgd>(),
                          {.global_batch = 64, .progress = cohort::Progress::kSilent});
  const std::uint64_t steps_per_epoch = small_task_data().size() / 64;  // remainder dropped
  CHECK(trainer.fit(small_task_data(), {.epochs = 1}).steps == steps_per_epoch);
  CHECK(trainer.fit(small_task_data(), {.steps = steps_per_epoch + 5}).steps == 5);
  CHECK(trainer.fit(small_task_data(), {.steps = 3}).steps == 0);
  CHECK(trainer.step() == steps_per_epoch + 5);
}

TEST_CASE("invalid options raise ConfigError naming the field") {
  const auto message_of = [](auto&& make) { return cohort::testing::config_error_message(make); };
  CHECK(message_of([] { cohort::strategy::Mirrored<>({.replicas = 0}); }).find("replicas") !=
        std::string::npos);
  CHECK(message_of([] {
          cohort::Trainer trainer(small_model(), cohort::strategy::Mirrored<>({.replicas = 1}),
                                  cohort::testing::test_optimizer<cohort::optimizer::Sgd>(),
                                  {.global_batch = 4, .micro_batches = 8});
        }).find("global_batch") != std::string::npos);
  CHECK(message_of([] {
          cohort::optimizer::Sgd({.learning_rate = std::nan("")});
        }).find("learning_rate") != std::string::npos);
  CHECK(message_of([] {
          cohort::Trainer trainer(small_model(), cohort::strategy::Mirrored<>({.replicas = 9}),
                                  cohort::testing::test_optimizer<cohort::optimizer::Sgd>(),
                                  {.global_batch = 64, .micro_batches = 8});
        }).find("micro_batches") != std::string::npos);
  CHECK(message_of([] {
          cohort::Trainer trainer(small_model(), cohort::strategy::Mirrored<>({.replicas = 1}),
                                  cohort::testing::test_optimizer<cohort::optimizer::Sgd>(),
                                  {.global_batch = 4096, .micro_batches = 8});
          trainer.fit(small_task_data(), {.steps = 1});
        }).find("global_batch") != std::string::npos);
}

namespace {

// Wraps the small task so that one example fails or stalls when a replica asks for it.
struct FaultyData {
  enum class Fault { kThrow, kStall };
  Fault fault;
  std::size_t size() const { return small_task_data().size(); }
  example::Batch batch(std::span<const std::size_t> indices) const {
    for (std::size_t index : indices) {
      if (index != 5) continue;
      if (fault == Fault::kThrow) throw std::runtime_error("example 5 is unreadable");
      std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    }
    return small_task_data().batch(indices);
  }
};

}  // namespace

TEST_CASE("a replica that throws releases the others and fit rethrows its error") {
  cohort::Trainer trainer(small_model(), cohort::strategy::Mirrored<>({.replicas = 4}),
                          cohort::testing::test_optimizer<cohort::optimizer::Sgd>(),
                          {.global_batch = 64, .progress = cohort::Progress::kSilent});
  CHECK_THROWS_WITH_AS(trainer.fit(FaultyData{FaultyData::Fault::kThrow}, {.epochs = 1}),
                       "example 5 is unreadable", std::runtime_error);
}

TEST_CASE("after a failed fit, save and fit refuse until a restore") {
  cohort::testing::TemporaryDirectory directory("cohort-unsettled");
  const std::filesystem::path before = directory.path / "before.ckpt";
  const std::filesystem::path after = directory.path / "after.ckpt";
  cohort::Trainer trainer(small_model(), cohort::strategy::Mirrored<>({.replicas = 2}),
                          cohort::testing::test_optimizer<cohort::optimizer::Adam>(),
                          {.global_batch = 64, .progress = cohort::Progress::kSilent});
  trainer.fit(small_task_data(), {.steps = 1});
  trainer.save(before);
  CHECK_THROWS(trainer.fit(FaultyData{FaultyData::Fault::kThrow}, {.epochs = 1}));
  const auto refusal = [](const cohort::ConfigError& error) {
    const std::string message = error.what();
    CAPTURE(message);
    CHECK(message.find("the fit begun at step 1 failed (example 5 is unreadable)") !=
          std::string::npos);
    CHECK(message.find("restore a checkpoint first") != std::string::npos);
  };
  try {
    trainer.save(after);
    FAIL("save wrote the state of a failed fit");
  } catch (const cohort::ConfigError& error) {
    refusal(error);
    CHECK(std::string(error.what()).starts_with("Trainer::save: "));
  }
  CHECK_FALSE(std::filesystem::exists(after));
  try {
    trainer.fit(small_task_data(), {.steps = 2});
    FAIL("fit trained on the state of a failed fit");
  } catch (const cohort::ConfigError& error) {
    refusal(error);
    CHECK(std::string(error.what()).starts_with("Trainer::fit: "));
  }
  trainer.restore(before);
  CHECK(trainer.fit(small_task_data(), {.steps = 2}).steps == 1);
  CHECK_NOTHROW(trainer.save(after));
}

// The failing replica aborts its group as its step unwinds, before its failure reaches the
// threads' bookkeeping, so another replica's "abandoned because ..." can be recorded first: the
// cause is still what goes up.
TEST_CASE("replica threads rethrow the cause, not a collective abandoned because of it") {
  struct Communicator {
    void abort(std::string_view) {}
  };
  struct Replica {
    std::size_t index;
    Communicator communicator_;
    Communicator& communicator() { return communicator_; }
  };
  auto body = [](Replica& replica) {
    if (replica.index == 0) {
      throw cohort::CommError({.rank = 0,
                               .peer = 2,
                               .operation = "all_reduce",
                               .sequence = 7,
                               .detail = "abandoned because rank 2 aborted: example 5 is "
                                         "unreadable"});
    }
    if (replica.index == 2) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));  // recorded after replica 0
      throw std::runtime_error("example 5 is unreadable");
    }
  };
  CHECK_THROWS_WITH_AS(cohort::strategy::detail::run_replica_threads(
                           4,
                           [](std::size_t index) {
                             return Replica{index, {}};
                           },
                           body),
                       "example 5 is unreadable", std::runtime_error);
}

TEST_CASE("a replica that stalls past the timeout fails the step with a CommError naming it") {
  cohort::Trainer trainer(
      small_model(),
      cohort::strategy::Mirrored<>({.replicas = 2, .timeout = std::chrono::milliseconds(300)}),
      cohort::testing::test_optimizer<cohort::optimizer::Sgd>(),
      {.global_batch = 64, .progress = cohort::Progress::kSilent});
  try {
    trainer.fit(FaultyData{FaultyData::Fault::kStall}, {.epochs = 1});
    FAIL("fit returned");
  } catch (const cohort::CommError& error) {
    const std::string message = error.what();
    CAPTURE(message);
    CHECK(message.find("all_reduce") != std::string::npos);
    CHECK(message.find("rank") != std::string::npos);
    CHECK(message.find('#') != std::string::npos);
  }
}

TEST_CASE("gradient readiness changes no bit: Mirrored 1, 2 and 4 with global-norm clipping") {
  const std::vector<float> reference =
      train_adam(cohort::testing::WithoutReadiness{small_model()}, 1);
  for (std::size_t replicas : {1, 2, 4}) {
    CAPTURE(replicas);
    CHECK(same_bits(train_adam(small_model(), replicas), reference));
    CHECK(same_bits(train_adam(cohort::testing::WithoutReadiness{small_model()}, replicas),
                    reference));
  }
}

TEST_CASE(
    "a model reporting a range twice, overlapping, backwards, out of bounds or never is refused "
    "naming the range") {
  const std::size_t n = parameters_of(small_model()).size();
  CHECK(refusal({{0, n}, {5, 9}}) == "forward_backward: gradient range [5, 9) overlaps [0, " +
                                         std::to_string(n) + "), reported before");
  CHECK(refusal({{0, 10}, {0, 10}, {10, n}}) ==
        "forward_backward: gradient range [0, 10) was reported twice");
  CHECK(refusal({{10, 5}, {0, n}}) ==
        "forward_backward: gradient range [10, 5) ends before it begins");
  CHECK(refusal({{0, n + 1}}) == "forward_backward: gradient range [0, " + std::to_string(n + 1) +
                                     ") is out of bounds: the model has " + std::to_string(n) +
                                     " gradients");
  CHECK(refusal({{10, n}}) == "forward_backward: gradient range [0, 10) was never reported ready");
  CHECK(refusal({{0, 10}, {20, n}}) ==
        "forward_backward: gradient range [10, 20) was never reported ready");
  CHECK(refusal({}) ==
        "forward_backward: gradient range [0, " + std::to_string(n) + ") was never reported ready");
  // In any order and in any pieces, a complete report trains.
  CHECK(refusal({{100, n}, {0, 3}, {3, 100}}) == "(no error)");
}

namespace {

// Mirrored with the poisoned example 5 (its first feature NaN), seed 11, global batch 64.
template <class Optimizer>
cohort::Trainer<example::Mlp, cohort::strategy::Mirrored<>, Optimizer> nan_trainer(
    std::size_t replicas, cohort::NonFinite policy) {
  return {small_model(),
          cohort::strategy::Mirrored<>({.replicas = replicas}),
          cohort::testing::test_optimizer<Optimizer>(),
          {.global_batch = 64,
           .micro_batches = 8,
           .seed = 11,
           .progress = cohort::Progress::kSilent,
           .on_nonfinite = policy}};
}

bool all_finite(const std::vector<float>& values) {
  return std::all_of(values.begin(), values.end(), [](float v) { return std::isfinite(v); });
}

}  // namespace

// Sgd: the check rides on the optimizer's update; Adam (test_optimizer clips): on the sum of
// squares.
TEST_CASE_TEMPLATE("a NaN example under on_nonfinite = raise stops fit naming the step and index",
                   Optimizer, cohort::optimizer::Sgd, cohort::optimizer::Adam) {
  const std::vector<std::uint64_t> poisoned = cohort::testing::steps_with_example(5, 11, 64, 8, 1);
  REQUIRE(poisoned.size() == 1);
  cohort::testing::TemporaryDirectory directory("cohort-nan-raise");
  for (std::size_t replicas : {1, 2, 4}) {
    CAPTURE(replicas);
    auto trainer = nan_trainer<Optimizer>(replicas, cohort::NonFinite::kRaise);
    try {
      trainer.fit(cohort::testing::PoisonedData{.poisoned = 5}, {.epochs = 1});
      FAIL("fit returned");
    } catch (const cohort::NumericError& error) {
      CAPTURE(std::string(error.what()));
      CHECK(error.code() == cohort::Errc::kNumeric);
      CHECK(error.where() == cohort::NumericError::Where::kGradient);
      CHECK(error.step() == poisoned[0]);
      CHECK(error.index() < parameters_of(small_model()).size());
      CHECK(std::string(error.what()).find("step " + std::to_string(poisoned[0])) !=
            std::string::npos);
    }
    // Sgd: the check rode on the update, which every replica applied, and a state with NaN is
    // never saved. Adam: clipping's check came before the update, and the finite state is saved.
    const std::filesystem::path file =
        directory.path / ("state-" + std::to_string(replicas) + ".ckpt");
    if (std::is_same_v<Optimizer, cohort::optimizer::Sgd>) {
      CHECK_FALSE(all_finite(parameters_of(trainer.model())));
      try {
        trainer.save(file);
        FAIL("save wrote a state with NaN");
      } catch (const cohort::NumericError& error) {
        CHECK(error.where() == cohort::NumericError::Where::kParameters);
        CHECK(std::string(error.what()).find("not written") != std::string::npos);
      }
      CHECK_FALSE(std::filesystem::exists(file));
    } else {
      CHECK(all_finite(parameters_of(trainer.model())));
      CHECK_NOTHROW(trainer.save(file));
      CHECK(std::filesystem::exists(file));
    }
  }
}

TEST_CASE_TEMPLATE(
    "a NaN example under on_nonfinite = skip_step is skipped by every replica, with "
    "the same bits on 1, 2 and 4 replicas",
    Optimizer, cohort::optimizer::Sgd, cohort::optimizer::Adam) {
  const std::vector<std::uint64_t> poisoned = cohort::testing::steps_with_example(5, 11, 64, 8, 2);
  REQUIRE(poisoned.size() == 2);
  std::vector<float> reference;
  for (std::size_t replicas : {1, 2, 4}) {
    CAPTURE(replicas);
    // Up to the poisoned step, then past it: the skipped step changes nothing.
    auto trainer = nan_trainer<Optimizer>(replicas, cohort::NonFinite::kSkipStep);
    const cohort::testing::PoisonedData data{.poisoned = 5};
    CHECK(trainer.fit(data, {.steps = poisoned[0]}).skipped_steps == 0);
    const std::vector<float> before = parameters_of(trainer.model());
    const cohort::Report skipped = trainer.fit(data, {.steps = poisoned[0] + 1});
    CHECK(skipped.skipped_steps == 1);
    CHECK(same_bits(parameters_of(trainer.model()), before));
    const cohort::Report rest = trainer.fit(data, {.epochs = 2});
    CHECK(rest.skipped_steps == 1);
    const std::vector<float> after = parameters_of(trainer.model());
    CHECK(all_finite(after));
    CHECK_FALSE(same_bits(after, before));  // it trains on
    if (reference.empty()) reference = after;
    CHECK(same_bits(after, reference));
  }
}
