// Learning-rate schedules (optimizer/schedule.hpp): each factor, its refusals, and the bits of a
// scheduled run on every strategy.
#include <doctest/doctest.h>

#include <cohort/optimizer/schedule.hpp>
#include <cstdint>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "error_message.hpp"
#include "jobs.hpp"
#include "processes.hpp"
#include "training.hpp"

namespace {

namespace fs = std::filesystem;
using cohort::optimizer::Decay;
using cohort::optimizer::Schedule;

// The small task under `schedule` (Adam unless given), trained `steps` steps on Mirrored
// `replicas`; the parameters' bytes.
template <class Optimizer = cohort::optimizer::Adam>
std::string scheduled_parameters(std::size_t replicas, const Schedule& schedule,
                                 std::uint64_t steps = 30,
                                 Optimizer optimizer = cohort::testing::test_optimizer<Optimizer>(),
                                 std::size_t micro_batches = 8) {
  cohort::Trainer trainer(cohort::testing::small_model(),
                          cohort::strategy::Mirrored<>({.replicas = replicas}), optimizer,
                          {.global_batch = 64,
                           .micro_batches = micro_batches,
                           .seed = 11,
                           .progress = cohort::Progress::kSilent,
                           .schedule = schedule});
  trainer.fit(cohort::testing::small_task_data(), {.steps = steps});
  return cohort::testing::bytes_of(cohort::testing::parameters_of(trainer.model()));
}

Schedule constant_factor(double factor) {
  return {.custom = [factor](std::uint64_t) { return factor; }};
}

}  // namespace

TEST_CASE("each schedule's factor at chosen steps") {
  const Schedule constant;
  CHECK(constant.factor(0) == 1.0);
  CHECK(constant.factor(1'000'000) == 1.0);

  const Schedule warmup{.warmup_steps = 4};
  CHECK(warmup.factor(0) == 0.25);
  CHECK(warmup.factor(2) == 0.75);
  CHECK(warmup.factor(3) == 1.0);
  CHECK(warmup.factor(400) == 1.0);

  const Schedule cosine{
      .warmup_steps = 2, .decay = Decay::kCosine, .decay_steps = 4, .final_factor = 0.1};
  CHECK(cosine.factor(0) == 0.5);
  CHECK(cosine.factor(1) == 1.0);
  CHECK(cosine.factor(2) == 1.0);                    // the decay's first step
  CHECK(cosine.factor(4) == doctest::Approx(0.55));  // half way: (1 + 0.1) / 2
  CHECK(cosine.factor(5) == doctest::Approx(0.1 + 0.9 * (1 - 0.7071067811865476) / 2));
  CHECK(cosine.factor(6) == doctest::Approx(0.1));  // over
  CHECK(cosine.factor(1000) == doctest::Approx(0.1));

  const Schedule linear{.decay = Decay::kLinear, .decay_steps = 10};
  CHECK(linear.factor(0) == 1.0);
  CHECK(linear.factor(5) == 0.5);
  CHECK(linear.factor(10) == 0.0);
  CHECK(linear.factor(20) == 0.0);

  const Schedule step{.decay = Decay::kStep, .decay_steps = 3, .step_factor = 0.5};
  CHECK(step.factor(2) == 1.0);
  CHECK(step.factor(3) == 0.5);
  CHECK(step.factor(8) == 0.25);

  const Schedule custom{.custom = [](std::uint64_t s) { return 1.0 / static_cast<double>(s + 1); }};
  CHECK(custom.factor(3) == 0.25);
}

TEST_CASE("a schedule that makes no sense is refused, naming its field") {
  CHECK(cohort::testing::config_error_message([] {
          Schedule{.decay = Decay::kCosine}.validate();
        }).find("schedule.decay_steps") != std::string::npos);
  CHECK(cohort::testing::config_error_message([] {
          Schedule{.decay = Decay::kLinear, .decay_steps = 5, .final_factor = 2}.validate();
        }).find("schedule.final_factor") != std::string::npos);
  CHECK(cohort::testing::config_error_message([] {
          Schedule{.decay = Decay::kStep, .decay_steps = 5, .step_factor = 0}.validate();
        }).find("schedule.step_factor") != std::string::npos);
  const std::string negative =
      cohort::testing::config_error_message([] { constant_factor(-1).factor(7); });
  CHECK(negative.find("schedule.custom") != std::string::npos);
  CHECK(negative.find("at step 7") != std::string::npos);
  // Refused by the Trainer before anything trains.
  CHECK_THROWS_AS(scheduled_parameters(1, {.decay = Decay::kCosine}), cohort::ConfigError);
}

TEST_CASE("a description is equal exactly for schedules of the same factors") {
  CHECK(Schedule{}.description() == "warmup_steps=0 decay=constant");
  CHECK(Schedule{.warmup_steps = 3, .decay = Decay::kCosine, .decay_steps = 10}.description() ==
        "warmup_steps=3 decay=cosine decay_steps=10 final_factor=0");
  CHECK(constant_factor(0.5).description() == constant_factor(0.5).description());
  CHECK(constant_factor(0.5).description() != constant_factor(0.25).description());
}

TEST_CASE(
    "the factor reaches every optimizer's update: a factor of one half is half the "
    "learning rate, bit for bit") {
  using namespace cohort::optimizer;
  CHECK(scheduled_parameters(2, constant_factor(0.5), 20, Sgd({.learning_rate = 0.1})) ==
        scheduled_parameters(2, {}, 20, Sgd({.learning_rate = 0.05})));
  CHECK(scheduled_parameters(2, constant_factor(0.5), 20,
                             Momentum({.learning_rate = 0.1, .momentum = 0.9})) ==
        scheduled_parameters(2, {}, 20, Momentum({.learning_rate = 0.05, .momentum = 0.9})));
  CHECK(scheduled_parameters(2, constant_factor(0.5), 20, Adam({.learning_rate = 4e-3})) ==
        scheduled_parameters(2, {}, 20, Adam({.learning_rate = 2e-3})));
  CHECK(scheduled_parameters(2, constant_factor(0.5), 20,
                             AdamW({.learning_rate = 4e-3, .weight_decay = 0.25})) ==
        scheduled_parameters(2, {}, 20, AdamW({.learning_rate = 2e-3, .weight_decay = 0.25})));
  // A factor of one is no schedule at all.
  CHECK(scheduled_parameters(2, constant_factor(1.0)) == scheduled_parameters(2, {}));
}

TEST_CASE("under a schedule Mirrored 1, 2 and 4 give the same bits, unlike the unscheduled run") {
  const Schedule schedule = cohort::testing::test_schedule();
  const std::string one = scheduled_parameters(1, schedule);
  CHECK(scheduled_parameters(2, schedule) == one);
  CHECK(scheduled_parameters(4, schedule) == one);
  CHECK(scheduled_parameters(1, {}) != one);
}

TEST_CASE("a checkpoint keeps its schedule: a restore under another is refused, naming both") {
  cohort::testing::TemporaryDirectory directory("cohort-schedule");
  const fs::path file = directory.path / "run.ckpt";
  const auto trainer_with = [](const Schedule& schedule) {
    return cohort::Trainer(cohort::testing::small_model(), cohort::strategy::Mirrored<>({}),
                           cohort::testing::test_optimizer<cohort::optimizer::Adam>(),
                           {.global_batch = 64,
                            .seed = 11,
                            .progress = cohort::Progress::kSilent,
                            .schedule = schedule});
  };
  auto first = trainer_with(cohort::testing::test_schedule());
  first.fit(cohort::testing::small_task_data(), {.steps = 10});
  first.save(file);
  auto other = trainer_with({});
  std::string refused = "(no error)";
  try {
    other.restore(file);
  } catch (const cohort::CheckpointError& error) {
    refused = error.what();
  }
  CHECK(refused.find("schedule is warmup_steps=5 decay=cosine") != std::string::npos);
  CHECK(refused.find("but warmup_steps=0 decay=constant in this trainer") != std::string::npos);
  auto same = trainer_with(cohort::testing::test_schedule());
  same.restore(file);
  CHECK(same.step() == 10);
}

#if defined(COHORT_RUN)
TEST_CASE(
    "under a schedule MultiWorkerMirrored 2x1, 2x2 and 3x1 and a synchronous parameter server of "
    "2 servers give Mirrored's bits") {
  cohort::testing::TemporaryDirectory directory("cohort-schedule-jobs");
  const std::string expected = scheduled_parameters(
      4, cohort::testing::test_schedule(), 30, cohort::optimizer::Adam({.learning_rate = 3e-3}));
  const fs::path out = directory.path / "parameters.bin";
  const std::vector<std::vector<std::string>> jobs = {
      {COHORT_RUN, "--np", "2", "--", COHORT_TRAINER, "1", "30", out, "--schedule"},
      {COHORT_RUN, "--np", "2", "--", COHORT_TRAINER, "2", "30", out, "--schedule"},
      {COHORT_RUN, "--np", "2", "--ps", "2", "--timeout-s", "100", "--", COHORT_PS_TRAINER, "sync",
       "30", out, "--schedule"},
  };
  const auto check = [&](const std::vector<std::string>& command, const std::string& reference) {
    std::string line;
    for (const std::string& word : command) line += word + " ";
    CAPTURE(line);
    fs::remove(out);
    const std::string output =
        cohort::testing::output_of_success(command, directory.path / "log.txt");
    CAPTURE(output);
    CHECK(cohort::testing::read_file(out) == reference);
  };
  for (const auto& command : jobs) check(command, expected);
  // 3 workers of 1 replica: 3 micro-batches per step, as Mirrored 3.
  check({COHORT_RUN, "--np", "3", "--", COHORT_TRAINER, "1", "30", out, "--schedule",
         "--micro-batches", "3"},
        scheduled_parameters(3, cohort::testing::test_schedule(), 30,
                             cohort::optimizer::Adam({.learning_rate = 3e-3}), 3));
}
#endif
