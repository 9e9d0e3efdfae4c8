// Checkpoints during a fit (trainer/periodic_checkpoints.hpp, checkpoint/directory.hpp): the
// directory they fill, the bits they keep, and a job killed with SIGKILL that goes on from them.
#include <doctest/doctest.h>

#include <chrono>
#include <cohort/checkpoint/directory.hpp>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "error_message.hpp"
#include "jobs.hpp"
#include "processes.hpp"
#include "training.hpp"

namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using cohort::testing::TemporaryDirectory;

using Trainer =
    cohort::Trainer<example::Mlp, cohort::strategy::Mirrored<>, cohort::optimizer::Adam>;

// The small task on Mirrored `replicas` with the given checkpoint policy, as multi_worker_trainer
// trains it on 2 workers of 1 replica; the trainer, before any fit.
std::unique_ptr<Trainer> trainer_for(const cohort::CheckpointPolicy& policy,
                                     std::size_t replicas = 2) {
  return std::make_unique<Trainer>(
      cohort::testing::small_model(), cohort::strategy::Mirrored<>({.replicas = replicas}),
      cohort::optimizer::Adam({.learning_rate = 3e-3}),  // as multi_worker_trainer
      cohort::TrainerOptions{.global_batch = 64,
                             .seed = 11,
                             .log_every = 4,
                             .progress = cohort::Progress::kSilent,
                             .checkpoint = policy});
}

// The same, trained to `steps`.
std::unique_ptr<Trainer> trained(std::uint64_t steps, const cohort::CheckpointPolicy& policy,
                                 std::size_t replicas = 2) {
  auto trainer = trainer_for(policy, replicas);
  trainer->fit(cohort::testing::small_task_data(), {.steps = steps});
  return trainer;
}

// `file`, as Trainer::save writes it after a fit to `steps` on Mirrored 2.
fs::path saved_after(std::uint64_t steps, const fs::path& file) {
  trained(steps, {})->save(file);
  return file;
}

std::string parameters_of(const auto& trainer) {
  return cohort::testing::bytes_of(cohort::testing::parameters_of(trainer->model()));
}

std::vector<std::uint64_t> steps_in(const fs::path& directory) {
  std::vector<std::uint64_t> steps;
  for (const auto& saved : cohort::checkpoint::list(directory)) steps.push_back(saved.step);
  return steps;
}

}  // namespace

TEST_CASE("a checkpoint file's name gives its step; other names give none") {
  CHECK(cohort::checkpoint::file_for_step("d", 1200) == fs::path("d/step-000000001200.ckpt"));
  CHECK(cohort::checkpoint::step_of("step-000000001200.ckpt") == 1200u);
  CHECK_FALSE(cohort::checkpoint::step_of("step-000000001200.ckpt.tmp-42").has_value());
  CHECK_FALSE(cohort::checkpoint::step_of("step-.ckpt").has_value());
  CHECK_FALSE(cohort::checkpoint::step_of("step-12a.ckpt").has_value());
  CHECK_FALSE(cohort::checkpoint::step_of("notes.txt").has_value());
}

TEST_CASE(
    "checkpoints every N steps keep the newest K, ignore a torn temporary, and change no bit") {
  TemporaryDirectory directory("cohort-periodic");
  const fs::path checkpoints = directory.path / "checkpoints";
  fs::create_directories(checkpoints);
  // What a chief killed in the middle of a write leaves, and a file of the user's.
  std::ofstream(checkpoints / "step-000000000099.ckpt.tmp-4242") << "torn";
  std::ofstream(checkpoints / "notes.txt") << "mine";

  const auto uninterrupted = trained(23, {});
  const auto checkpointed = trained(23, {.directory = checkpoints, .every_steps = 5, .keep = 2});
  CHECK(parameters_of(checkpointed) == parameters_of(uninterrupted));
  // Every 5 steps, and at the end of the fit; the newest 2 kept.
  CHECK(steps_in(checkpoints) == std::vector<std::uint64_t>{20, 23});
  // Taken between two steps, without the fit's end: the parameters of a fit that stopped there.
  const auto at_20 = cohort::checkpoint::read<float>(checkpoints / "step-000000000020.ckpt");
  CHECK(at_20.step == 20);
  CHECK(cohort::testing::bytes_of(at_20.parameters) == parameters_of(trained(20, {})));
  CHECK(fs::exists(checkpoints / "notes.txt"));

  // The same run, resumed from the newest, goes on with an uninterrupted run's bits.
  const auto resumed =
      trained(40, {.directory = checkpoints, .every_steps = 5, .keep = 2, .resume = true});
  CHECK(parameters_of(resumed) == parameters_of(trained(40, {})));
  CHECK(steps_in(checkpoints) == std::vector<std::uint64_t>{35, 40});
}

TEST_CASE(
    "a checkpoint taken during a fit, written in place in a share per replica, is the file "
    "Trainer::save writes after a fit to that step") {
  TemporaryDirectory directory("cohort-periodic-shares");
  const fs::path saved = saved_after(12, directory.path / "saved.ckpt");
  for (const std::size_t replicas : {1, 2, 3, 4}) {
    CAPTURE(replicas);
    const fs::path checkpoints = directory.path / ("replicas-" + std::to_string(replicas));
    trained(15, {.directory = checkpoints, .every_steps = 6}, replicas);
    CHECK(cohort::testing::read_file(cohort::checkpoint::file_for_step(checkpoints, 12)) ==
          cohort::testing::read_file(saved));
  }
}

TEST_CASE(
    "a checkpoint during a fit refuses a state with an infinity, naming the first, in any "
    "replica's share") {
  TemporaryDirectory directory("cohort-periodic-infinity");
  // Adam's second moments are the optimizer state's second half. An infinite one leaves its
  // parameter as it is (its update is 0) and the gradient finite: only the checkpoint can see it.
  const auto finite =
      cohort::checkpoint::read<float>(saved_after(4, directory.path / "start.ckpt"));
  const std::size_t parameters = finite.parameters.size();
  // Mirrored 4: in the third replica's share (the fourth's holds one too), then in the fourth's.
  for (const std::size_t first : {parameters + 7, 2 * parameters - 3}) {
    CAPTURE(first);
    auto state = finite;
    state.optimizer_state[first] = std::numeric_limits<float>::infinity();
    state.optimizer_state[2 * parameters - 1] = std::numeric_limits<float>::infinity();
    const fs::path poisoned = directory.path / "poisoned.ckpt";
    cohort::checkpoint::write(poisoned, state);
    const fs::path checkpoints = directory.path / ("checkpoints-" + std::to_string(first));
    auto trainer = trainer_for({.directory = checkpoints, .every_steps = 6}, 4);
    trainer->restore(poisoned);
    try {
      trainer->fit(cohort::testing::small_task_data(), {.steps = 9});
      FAIL("fit returned");
    } catch (const cohort::NumericError& error) {
      CAPTURE(std::string(error.what()));
      CHECK(error.where() == cohort::NumericError::Where::kOptimizerState);
      CHECK(error.index() == first);
      CHECK(cohort::testing::contains(error.what(), "not written"));
    }
    CHECK(steps_in(checkpoints).empty());
  }
}

TEST_CASE("checkpoints by time, agreed at the job's vote, change no bit") {
  TemporaryDirectory directory("cohort-periodic-time");
  const fs::path checkpoints = directory.path / "checkpoints";
  cohort::Trainer trainer(
      cohort::testing::small_model(), cohort::strategy::Mirrored<>({.replicas = 2}),
      cohort::optimizer::Adam({.learning_rate = 3e-3}),
      {.global_batch = 64,
       .seed = 11,
       .progress = cohort::Progress::kSilent,
       .checkpoint = {.directory = checkpoints, .every = std::chrono::seconds(1), .keep = 0}});
  // 4 micro-batches of at least 5 ms on each replica a step: 100 steps last 2 s or more.
  trainer.fit(cohort::testing::PreemptedData{.pause = std::chrono::milliseconds(5)},
              {.steps = 100});
  CHECK(cohort::testing::bytes_of(cohort::testing::parameters_of(trainer.model())) ==
        parameters_of(trained(100, {})));
  // At least one checkpoint by time before the fit's last.
  const std::vector<std::uint64_t> steps = steps_in(checkpoints);
  REQUIRE(steps.size() >= 2);
  CHECK(steps.back() == 100);
  CHECK(steps.front() < 100);
}

TEST_CASE("checkpoint options without a directory are refused, naming the field") {
  CHECK(cohort::testing::contains(
      cohort::testing::config_error_message([] { trained(5, {.every_steps = 5}); }),
      "checkpoint.directory"));
  CHECK(cohort::testing::contains(
      cohort::testing::config_error_message([] { trained(5, {.resume = true}); }),
      "checkpoint.directory"));
}

#if defined(COHORT_RUN)
TEST_CASE(
    "a job whose every process is killed with SIGKILL at a random step resumes from its newest "
    "checkpoint to an uninterrupted run's bits") {
  TemporaryDirectory directory("cohort-periodic-kill");
  const fs::path checkpoints = directory.path / "checkpoints";
  const fs::path out = directory.path / "parameters.bin";
  constexpr std::uint64_t kSteps = 200;
  const auto start_job = [&](const std::string& name) {
    const std::string port = std::to_string(cohort::testing::free_port());
    std::vector<std::unique_ptr<cohort::testing::Process>> workers;
    for (int rank = 0; rank < 2; ++rank) {
      workers.push_back(std::make_unique<cohort::testing::Process>(
          std::vector<std::string>{COHORT_TRAINER, "1", std::to_string(kSteps), out,
                                   "--checkpoint-directory", checkpoints, "--checkpoint-every", "4",
                                   "--pause-ms", "2"},
          std::map<std::string, std::string>{{"COHORT_RANK", std::to_string(rank)},
                                             {"COHORT_WORLD_SIZE", "2"},
                                             {"COHORT_MASTER_ADDR", "127.0.0.1"},
                                             {"COHORT_MASTER_PORT", port},
                                             {"COHORT_JOB_ID", name}},
          directory.path / (name + "-rank" + std::to_string(rank) + ".log")));
    }
    return workers;
  };

  // Killed once a checkpoint at least a random number of steps in is on disk.
  std::mt19937_64 random(std::random_device{}());
  const std::uint64_t kill_after = 8 + random() % 120;
  CAPTURE(kill_after);
  {
    auto workers = start_job("killed");
    const auto deadline = std::chrono::steady_clock::now() + 120s;
    while (std::chrono::steady_clock::now() < deadline) {
      const auto newest = cohort::checkpoint::newest(checkpoints);
      if (newest && newest->step >= kill_after) break;
      std::this_thread::sleep_for(2ms);
    }
    for (auto& worker : workers) worker->kill(SIGKILL);
    for (int rank = 0; rank < 2; ++rank) {
      const auto exit = workers[static_cast<std::size_t>(rank)]->wait(60s);
      // A job that ended on its own before the kill says why in its logs.
      INFO(cohort::testing::read_file(directory.path /
                                      ("killed-rank" + std::to_string(rank) + ".log")));
      REQUIRE(exit.has_value());
      CHECK_FALSE(exit->exited);
    }
  }
  REQUIRE_FALSE(fs::exists(out));
  const auto newest = cohort::checkpoint::newest(checkpoints);
  REQUIRE(newest.has_value());
  CHECK(newest->step >= kill_after);
  CHECK(newest->step < kSteps);

  auto workers = start_job("resumed");
  for (auto& worker : workers) {
    const auto exit = worker->wait(120s);
    REQUIRE(exit.has_value());
    CHECK(exit->exited);
    CHECK(exit->code == 0);
  }
  const std::string log = cohort::testing::read_file(directory.path / "resumed-rank0.log");
  CAPTURE(log);
  CHECK(cohort::testing::contains(log, "cohort: resuming from " + newest->file.string()));
  // Mirrored 2 in this process: the bits of 2 workers of 1 replica.
  CHECK(cohort::testing::read_file(out) == parameters_of(trained(kSteps, {})));
}

TEST_CASE(
    "a synchronous parameter server checkpoints during a fit, a shard per server, keeps the "
    "newest K and resumes to Mirrored's bits") {
  TemporaryDirectory directory("cohort-periodic-ps");
  const fs::path checkpoints = directory.path / "checkpoints";
  const fs::path out = directory.path / "parameters.bin";
  const auto job = [&](const std::string& steps) {
    return cohort::testing::output_of_success(
        {COHORT_RUN, "--np", "2", "--ps", "2", "--timeout-s", "100", "--", COHORT_PS_TRAINER,
         "sync", steps, out, "--checkpoint-directory", checkpoints, "--checkpoint-every", "7"},
        directory.path / ("job-" + steps + ".log"));
  };
  const auto files_of_step = [&](std::uint64_t step) {
    const std::string name = cohort::checkpoint::file_for_step(checkpoints, step).filename();
    std::size_t count = 0;
    for (const auto& entry : fs::directory_iterator(checkpoints)) {
      count += entry.path().filename().string().starts_with(name) ? 1 : 0;
    }
    return count;
  };

  job("20");
  // Every 7 steps and at the end of the fit; each a manifest and a shard per server.
  CHECK(steps_in(checkpoints) == std::vector<std::uint64_t>{7, 14, 20});
  CHECK(files_of_step(20) == 3);
  CHECK(cohort::checkpoint::read<float>(cohort::checkpoint::file_for_step(checkpoints, 20)).step ==
        20);

  // The same command to 30 steps goes on from step 20, on workers and servers.
  const std::string output = job("30");
  CHECK(cohort::testing::contains(output, "cohort: resuming from"));
  CHECK(cohort::testing::read_file(out) == parameters_of(trained(30, {})));
  CHECK(steps_in(checkpoints) == std::vector<std::uint64_t>{21, 28, 30});
  // The checkpoints no longer kept took their shards with them.
  CHECK(files_of_step(7) == 0);
  CHECK(files_of_step(20) == 0);
  CHECK(files_of_step(30) == 3);
}
#endif
