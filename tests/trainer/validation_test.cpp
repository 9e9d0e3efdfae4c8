// Evaluation on held-out data inside fit (trainer/validation.hpp), early stopping, and the metrics
// log (trainer/metrics_log.hpp).
#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "error_message.hpp"
#include "jobs.hpp"
#include "processes.hpp"
#include "training.hpp"

namespace {

namespace fs = std::filesystem;

cohort::Report fit_with_validation(std::size_t replicas, std::uint64_t epochs,
                                   cohort::ValidationOptions validation = {},
                                   const fs::path& metrics = {}) {
  cohort::Trainer trainer(cohort::testing::small_model(),
                          cohort::strategy::Mirrored<>({.replicas = replicas}),
                          cohort::optimizer::Adam({.learning_rate = 3e-3}),
                          {.global_batch = 64,
                           .seed = 11,
                           .log_every = 4,
                           .progress = cohort::Progress::kSilent,
                           .metrics = metrics});
  return trainer.fit(
      cohort::testing::small_task_data(), {.epochs = epochs},
      cohort::validation(cohort::testing::small_held_out_data(), std::move(validation)));
}

// The evaluations' figures as bytes, to compare bit for bit.
std::string bytes_of(const std::vector<cohort::Evaluation>& evaluations) {
  std::string bytes;
  for (const auto& evaluation : evaluations) {
    bytes += std::to_string(evaluation.step) + ":";
    for (const auto& [name, mean] : evaluation.means) {
      bytes += name;
      bytes.append(reinterpret_cast<const char*>(&mean), sizeof mean);
    }
  }
  return bytes;
}

}  // namespace

TEST_CASE(
    "validation figures are the same bits on 1, 2, 3 and 4 replicas, each epoch and at the end") {
  const cohort::Report one = fit_with_validation(1, 2);
  // 31 steps per epoch: after each epoch; the end of the fit is the second.
  REQUIRE(one.validation.size() == 2);
  CHECK(one.validation[0].step == 31);
  CHECK(one.validation[1].step == 62);
  const double accuracy = one.validation.back().mean("correct");
  CHECK(accuracy > 0.8);
  CHECK(accuracy <= 1.0);
  CHECK(one.validation.back().mean("loss") < one.validation.front().mean("loss"));
  CHECK(bytes_of(fit_with_validation(2, 2).validation) == bytes_of(one.validation));
  // 3 replicas fold 2, 2 and 4 of the 8 micro-batches (core/sharding.hpp, Deal).
  CHECK(bytes_of(fit_with_validation(3, 2).validation) == bytes_of(one.validation));
  CHECK(bytes_of(fit_with_validation(4, 2).validation) == bytes_of(one.validation));
  CHECK(cohort::testing::contains(
      cohort::testing::config_error_message([&] { (void)one.validation[0].mean("accuracy"); }),
      "the model's evaluate gives loss, correct"));
}

TEST_CASE("validation every N steps, and a stop that ends the fit early") {
  const cohort::Report every = fit_with_validation(2, 1, {.every_steps = 10});
  std::vector<std::uint64_t> steps;
  for (const auto& evaluation : every.validation) steps.push_back(evaluation.step);
  CHECK(steps == std::vector<std::uint64_t>{10, 20, 30, 31});

  const cohort::Report stopped = fit_with_validation(
      2, 5, {.stop = [](const cohort::Report& report) { return report.validation.size() == 2; }});
  CHECK(stopped.stopped_early);
  CHECK(stopped.steps == 62);
  CHECK(stopped.loss.size() == 62);
  // A stop between two progress lines (every 4 steps here): the steps since the last are reported.
  const cohort::Report between =
      fit_with_validation(2, 5, {.every_steps = 7, .stop = [](const cohort::Report& report) {
                                   return report.validation.size() == 2;
                                 }});
  CHECK(between.stopped_early);
  CHECK(between.steps == 14);
  CHECK(between.loss.size() == 14);
  CHECK(stopped.validation.size() == 2);
}

TEST_CASE("the metrics file parses, one line per progress line and one per evaluation") {
  cohort::testing::TemporaryDirectory directory("cohort-metrics");
  const fs::path file = directory.path / "run" / "metrics.jsonl";
  fit_with_validation(2, 2, {}, file);
  std::ifstream in(file);
  std::vector<std::uint64_t> loss_steps;
  std::vector<std::uint64_t> validation_steps;
  for (std::string line; std::getline(in, line);) {
    const auto record = nlohmann::json::parse(line);
    if (record.contains("validation")) {
      validation_steps.push_back(record["step"]);
      CHECK(record["validation"]["correct"].get<double>() > 0.0);
    } else {
      loss_steps.push_back(record["step"]);
      CHECK(record["loss"].get<double>() > 0.0);
      CHECK(record["learning_rate"].get<double>() == 3e-3);
      CHECK(record["examples_per_second"].get<double>() > 0.0);
      CHECK(record["epoch"].get<double>() * 31 == doctest::Approx(record["step"].get<double>()));
    }
  }
  // Every 4 steps of an epoch, and at its end (31 steps).
  std::vector<std::uint64_t> expected;
  for (std::uint64_t epoch = 0; epoch < 2; ++epoch) {
    for (std::uint64_t step = 4; step < 31; step += 4) expected.push_back(epoch * 31 + step);
    expected.push_back(epoch * 31 + 31);
  }
  CHECK(loss_steps == expected);
  CHECK(validation_steps == std::vector<std::uint64_t>{31, 62});
}

#if defined(COHORT_RUN)
// The figures Mirrored 2 in this process gives, as the test programs train: Adam at 3e-3, 8
// micro-batches, seed 11, an evaluation every 10 of 30 steps.
std::vector<cohort::Evaluation> mirrored_evaluations() {
  cohort::Trainer trainer(cohort::testing::small_model(),
                          cohort::strategy::Mirrored<>({.replicas = 2}),
                          cohort::optimizer::Adam({.learning_rate = 3e-3}),
                          {.global_batch = 64, .seed = 11, .progress = cohort::Progress::kSilent});
  return trainer
      .fit(cohort::testing::small_task_data(), {.steps = 30},
           cohort::validation(cohort::testing::small_held_out_data(), {.every_steps = 10}))
      .validation;
}

TEST_CASE(
    "2 processes of MultiWorkerMirrored and 2 workers of a synchronous parameter server evaluate "
    "to Mirrored's figures, bit for bit") {
  cohort::testing::TemporaryDirectory directory("cohort-validation-jobs");
  const std::vector<cohort::Evaluation> expected = mirrored_evaluations();
  REQUIRE(expected.size() == 3);
  const fs::path out = directory.path / "out.bin";
  for (const auto& command : std::vector<std::vector<std::string>>{
           {COHORT_RUN, "--np", "2", "--", COHORT_TRAINER, "1", "30", out, "--validate-every",
            "10"},
           {COHORT_RUN, "--np", "2", "--ps", "2", "--timeout-s", "100", "--", COHORT_PS_TRAINER,
            "sync", "30", out, "--validate-every", "10"}}) {
    const std::string output =
        cohort::testing::output_of_success(command, directory.path / "log.txt");
    CAPTURE(output);
    for (const cohort::Evaluation& evaluation : expected) {
      CHECK(cohort::testing::contains(output, cohort::testing::describe(evaluation)));
    }
  }
}

TEST_CASE("a stop that one process says is agreed by every process of the job") {
  cohort::testing::TemporaryDirectory directory("cohort-early-stop");
  const fs::path out = directory.path / "parameters.bin";
  // The chief stops after 2 evaluations, every 5 steps; worker 1 never would.
  const std::string output =
      cohort::testing::output_of_success({COHORT_RUN, "--np", "2", "--", COHORT_TRAINER, "1", "100",
                                          out, "--validate-every", "5", "--chief-stops-after", "2"},
                                         directory.path / "log.txt");
  CAPTURE(output);
  // Both processes stopped after 10 steps, with the same figures.
  const std::string line = "stopped early after 10 steps, 2 evaluations";
  const auto first = output.find(line);
  REQUIRE(first != std::string::npos);
  CHECK(output.find(line, first + 1) != std::string::npos);
}
#endif
