#include <doctest/doctest.h>
#include <spawn.h>
#include <sys/wait.h>

#include <cohort/checkpoint/checkpoint.hpp>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "training.hpp"

extern char** environ;

namespace {

namespace fs = std::filesystem;
using cohort::testing::parameters_of;
using cohort::testing::small_model;
using cohort::testing::small_task_data;

struct TemporaryDirectory {
  fs::path path =
      fs::temp_directory_path() / ("cohort-checkpoint-test-" + std::to_string(::getpid()));
  TemporaryDirectory() { fs::create_directories(path); }
  ~TemporaryDirectory() { fs::remove_all(path); }
};

auto make_trainer(std::size_t replicas = 2, std::uint64_t seed = 5) {
  return cohort::Trainer(small_model(), cohort::strategy::Mirrored<>({.replicas = replicas}),
                         cohort::optimizer::Adam({.learning_rate = 3e-3}),
                         {.global_batch = 64, .seed = seed, .progress = cohort::Progress::kSilent});
}

std::string bytes_of(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void overwrite(const fs::path& file, const std::string& bytes) {
  std::ofstream(file, std::ios::binary | std::ios::trunc) << bytes;
}

// Runs the worker program and returns its wait status.
int run_worker(std::vector<std::string> arguments) {
  arguments.insert(arguments.begin(), COHORT_RESUME_WORKER);
  std::vector<char*> argv;
  for (auto& argument : arguments) argv.push_back(argument.data());
  argv.push_back(nullptr);
  pid_t pid = 0;
  REQUIRE(::posix_spawn(&pid, argv[0], nullptr, nullptr, argv.data(), environ) == 0);
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  return status;
}

template <class Trainer>
std::string refusal(Trainer& trainer, const fs::path& file) {
  try {
    trainer.restore(file);
  } catch (const cohort::CheckpointError& error) {
    return error.what();
  }
  return "restored";
}

}  // namespace

TEST_CASE("save at step k, kill the process, restore and continue equals an uninterrupted run") {
  TemporaryDirectory directory;
  const fs::path checkpoint = directory.path / "run.ckpt";
  const fs::path uninterrupted = directory.path / "uninterrupted.bin";
  const fs::path resumed = directory.path / "resumed.bin";

  const int run_status = run_worker({"run", "50", uninterrupted});
  REQUIRE(WIFEXITED(run_status));
  REQUIRE(WEXITSTATUS(run_status) == 0);

  const int killed_status = run_worker({"save-and-die", "20", checkpoint});
  REQUIRE(WIFSIGNALED(killed_status));
  CHECK(WTERMSIG(killed_status) == SIGKILL);
  REQUIRE(fs::exists(checkpoint));

  const int resume_status = run_worker({"resume", checkpoint, "50", resumed});
  REQUIRE(WIFEXITED(resume_status));
  REQUIRE(WEXITSTATUS(resume_status) == 0);

  const std::string expected = bytes_of(uninterrupted);
  REQUIRE(expected.size() == parameters_of(small_model()).size() * sizeof(float));
  CHECK(bytes_of(resumed) == expected);
}

TEST_CASE("a checkpoint restored in process continues bit-identically, on any replica count") {
  TemporaryDirectory directory;
  const fs::path checkpoint = directory.path / "run.ckpt";
  auto uninterrupted = make_trainer(4);
  uninterrupted.fit(small_task_data(), {.steps = 45});

  auto first = make_trainer(4);
  first.fit(small_task_data(), {.steps = 17});
  first.save(checkpoint);
  auto second = make_trainer(1);
  second.restore(checkpoint);
  CHECK(second.step() == 17);
  CHECK(parameters_of(second.model()) == parameters_of(first.model()));
  second.fit(small_task_data(), {.steps = 45});
  CHECK(parameters_of(second.model()) == parameters_of(uninterrupted.model()));
}

TEST_CASE("save writes atomically and leaves no temporary file") {
  TemporaryDirectory directory;
  const fs::path checkpoint = directory.path / "run.ckpt";
  auto trainer = make_trainer();
  trainer.fit(small_task_data(), {.steps = 3});
  trainer.save(checkpoint);
  trainer.fit(small_task_data(), {.steps = 6});
  trainer.save(checkpoint);  // replaces the earlier one
  CHECK(std::distance(fs::directory_iterator(directory.path), fs::directory_iterator()) == 1);
  CHECK(cohort::checkpoint::read<float>(checkpoint).step == 6);
}

TEST_CASE("a corrupted, truncated or foreign checkpoint is refused and the model is unchanged") {
  TemporaryDirectory directory;
  const fs::path checkpoint = directory.path / "run.ckpt";
  auto source = make_trainer();
  source.fit(small_task_data(), {.steps = 5});
  source.save(checkpoint);
  const std::string good = bytes_of(checkpoint);

  auto target = make_trainer();
  const auto before = parameters_of(target.model());

  std::string corrupted = good;
  corrupted[corrupted.size() / 2] ^= 0x10;
  overwrite(checkpoint, corrupted);
  std::string message = refusal(target, checkpoint);
  CHECK(message.find(checkpoint.string()) != std::string::npos);
  CHECK(message.find("checksum mismatch") != std::string::npos);

  overwrite(checkpoint, good.substr(0, good.size() - 9));
  CHECK(refusal(target, checkpoint).find("truncated") != std::string::npos);

  overwrite(checkpoint, "just some text that is long enough to hold a header");
  CHECK(refusal(target, checkpoint).find("not a cohort checkpoint") != std::string::npos);

  CHECK(refusal(target, directory.path / "missing.ckpt").find("cannot open") != std::string::npos);

  CHECK(parameters_of(target.model()) == before);
  CHECK(target.step() == 0);
}

TEST_CASE("a checkpoint of another run is refused naming what differs") {
  TemporaryDirectory directory;
  const fs::path checkpoint = directory.path / "run.ckpt";
  auto source = make_trainer();
  source.fit(small_task_data(), {.steps = 2});
  source.save(checkpoint);

  auto other_seed = make_trainer(2, 6);
  CHECK(refusal(other_seed, checkpoint).find("seed is 5 in the file but 6") != std::string::npos);

  cohort::Trainer other_optimizer(small_model(), cohort::strategy::Mirrored<>({.replicas = 2}),
                                  cohort::optimizer::Sgd({.learning_rate = 0.1}),
                                  {.global_batch = 64, .seed = 5});
  CHECK(refusal(other_optimizer, checkpoint).find("optimizer is adam") != std::string::npos);

  cohort::Trainer other_model(
      example::Mlp({8, 32, 4}, 7), cohort::strategy::Mirrored<>({.replicas = 2}),
      cohort::optimizer::Adam({.learning_rate = 3e-3}), {.global_batch = 64, .seed = 5});
  const auto before = parameters_of(other_model.model());
  CHECK(refusal(other_model, checkpoint).find("parameter count") != std::string::npos);
  CHECK(parameters_of(other_model.model()) == before);

  cohort::checkpoint::TrainingState<double> doubles;
  doubles.optimizer = "adam";
  cohort::checkpoint::write(checkpoint, doubles);
  CHECK(refusal(source, checkpoint).find("holds double parameters, the model has float") !=
        std::string::npos);
}
