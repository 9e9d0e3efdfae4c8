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

// A sharded checkpoint written as a parameter-server job writes one: the manifest names two
// shards, each holding a range of the parameters and their optimizer state (Adam: 2 slots).
struct Sharded {
  fs::path manifest;
  cohort::checkpoint::TrainingState<float> complete;
  std::vector<fs::path> shards;
};

Sharded write_sharded(const fs::path& directory, std::uint64_t steps = 4) {
  fs::create_directories(directory);
  auto trainer = make_trainer();
  trainer.fit(small_task_data(), {.steps = steps});
  const fs::path complete = directory / "complete.ckpt";
  trainer.save(complete);
  Sharded sharded{directory / "run.ckpt", cohort::checkpoint::read<float>(complete), {}};
  const auto& state = sharded.complete;
  const std::size_t elements = state.parameters.size();
  auto manifest = state;
  manifest.parameters.clear();
  manifest.optimizer_state.clear();
  const std::size_t bounds[] = {0, elements / 3, elements};
  for (std::size_t shard = 0; shard < 2; ++shard) {
    cohort::checkpoint::ShardState<float> part;
    part.elements = elements;
    part.begin = bounds[shard];
    part.end = bounds[shard + 1];
    part.step = state.step;
    part.parameters.assign(state.parameters.begin() + static_cast<std::ptrdiff_t>(part.begin),
                           state.parameters.begin() + static_cast<std::ptrdiff_t>(part.end));
    for (std::size_t slot = 0; slot < 2; ++slot) {
      const auto first =
          state.optimizer_state.begin() + static_cast<std::ptrdiff_t>(slot * elements + part.begin);
      part.optimizer_state.insert(part.optimizer_state.end(), first,
                                  first + static_cast<std::ptrdiff_t>(part.end - part.begin));
    }
    const std::string name =
        cohort::checkpoint::shard_file_name(sharded.manifest, state.step, 0xabc, shard, 2);
    sharded.shards.push_back(directory / name);
    manifest.shards.push_back({.file = name,
                               .begin = part.begin,
                               .end = part.end,
                               .crc32 = cohort::checkpoint::write(directory / name, part)});
  }
  cohort::checkpoint::write(sharded.manifest, manifest);
  return sharded;
}

TEST_CASE("a sharded checkpoint reads back as the complete state it was cut from") {
  TemporaryDirectory directory;
  const auto sharded = write_sharded(directory.path);
  const auto read = cohort::checkpoint::read<float>(sharded.manifest);
  CHECK(read.parameters == sharded.complete.parameters);
  CHECK(read.optimizer_state == sharded.complete.optimizer_state);
  CHECK(read.step == sharded.complete.step);
  auto trainer = make_trainer(4);
  trainer.restore(sharded.manifest);
  CHECK(parameters_of(trainer.model()) == sharded.complete.parameters);

  // A complete checkpoint saved over the manifest takes the place of the shards too.
  trainer.save(sharded.manifest);
  for (const auto& shard : sharded.shards) CHECK_FALSE(fs::exists(shard));
  CHECK(cohort::checkpoint::read<float>(sharded.manifest).shards.empty());
}

TEST_CASE("a damaged sharded checkpoint is refused naming the shard and the model is unchanged") {
  TemporaryDirectory directory;
  const auto sharded = write_sharded(directory.path);
  auto target = make_trainer();
  const auto before = parameters_of(target.model());
  const std::string shard = bytes_of(sharded.shards[1]);

  SUBCASE("a corrupted shard") {
    std::string corrupted = shard;
    corrupted[corrupted.size() / 2] ^= 0x10;
    overwrite(sharded.shards[1], corrupted);
    const std::string message = refusal(target, sharded.manifest);
    CHECK(message.find(sharded.shards[1].string()) != std::string::npos);
    CHECK(message.find("checksum mismatch") != std::string::npos);
  }
  SUBCASE("a missing shard") {
    fs::remove(sharded.shards[1]);
    const std::string message = refusal(target, sharded.manifest);
    CHECK(message.find(sharded.shards[1].string()) != std::string::npos);
    CHECK(message.find("cannot open") != std::string::npos);
  }
  SUBCASE("a shard of another save, intact in itself") {
    const auto other = write_sharded(directory.path / "other", 5);
    fs::copy_file(other.shards[1], sharded.shards[1], fs::copy_options::overwrite_existing);
    const std::string message = refusal(target, sharded.manifest);
    CHECK(message.find(sharded.shards[1].string() + ": checksum is") != std::string::npos);
  }
  SUBCASE("a shard given instead of the manifest") {
    CHECK(refusal(target, sharded.shards[0]).find("restore its manifest") != std::string::npos);
  }
  CHECK(parameters_of(target.model()) == before);
  CHECK(target.step() == 0);
}
