#include <doctest/doctest.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/wait.h>

#include <atomic>
#include <cohort/checkpoint/checkpoint.hpp>
#include <cohort/checkpoint/in_place_write.hpp>
#include <csignal>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <span>
#include <string>
#include <thread>
#include <utility>
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

template <class T>
std::string bytes_of_value(T value) {
  return {reinterpret_cast<const char*>(&value), sizeof value};
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

  // Gradients summed in bfloat16 (MultiWorkerMirrored's wire), here in float.
  auto state = cohort::checkpoint::read<float>(checkpoint);
  CHECK(state.gradient_sum == "sum");
  state.gradient_sum = "sum_bf16";
  cohort::checkpoint::write(directory.path / "bf16.ckpt", state);
  CHECK(refusal(source, directory.path / "bf16.ckpt")
            .find("gradient sum (the wire's) is sum_bf16 in the file but sum in this trainer") !=
        std::string::npos);

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

namespace {

// `payload` framed as write() frames a payload, with its true checksum: what a file damaged by
// someone who recomputes the checksum holds.
std::string container(const cohort::checkpoint::Magic& magic, std::uint32_t value_bytes,
                      std::string_view payload,
                      std::uint32_t version = cohort::checkpoint::kFormatVersion) {
  std::string bytes(magic.begin(), magic.end());
  const auto append = [&](auto value) {
    bytes.append(reinterpret_cast<const char*>(&value), sizeof value);
  };
  append(version);
  append(value_bytes);
  append(static_cast<std::uint64_t>(payload.size()));
  append(cohort::checkpoint::detail::crc32(payload));
  bytes += payload;
  return bytes;
}

template <class Trainer>
std::string save_refusal(const Trainer& trainer, const fs::path& file) {
  try {
    trainer.save(file);
  } catch (const cohort::CheckpointError& error) {
    return error.what();
  }
  return "saved";
}

}  // namespace

TEST_CASE(
    "a checkpoint of format 3, before the gradient sum was recorded, restores as summed in "
    "float; an older format is refused naming both") {
  TemporaryDirectory directory;
  const fs::path checkpoint = directory.path / "run.ckpt";
  auto source = make_trainer();
  source.fit(small_task_data(), {.steps = 2});
  source.save(checkpoint);
  // Format 3's payload is format 4's without its last field, the string "sum" (its length, then
  // its characters).
  const std::string payload = bytes_of(checkpoint).substr(cohort::checkpoint::kHeaderBytes);
  const std::string sum = bytes_of_value(std::size_t{3}) + "sum";
  REQUIRE(payload.ends_with(sum));
  const std::string old_payload = payload.substr(0, payload.size() - sum.size());
  overwrite(checkpoint, container(cohort::checkpoint::kMagic, 4, old_payload, 3));

  auto target = make_trainer();
  REQUIRE(refusal(target, checkpoint) == "restored");
  CHECK(target.step() == 2);
  CHECK(parameters_of(target.model()) == parameters_of(source.model()));

  overwrite(checkpoint, container(cohort::checkpoint::kMagic, 4, old_payload, 2));
  CHECK(refusal(target, checkpoint).find("format version 2, this build reads 3 to 4") !=
        std::string::npos);
}

TEST_CASE("a manifest naming shards outside its directory is refused and a save deletes nothing") {
  TemporaryDirectory directory;
  const auto sharded = write_sharded(directory.path / "run");
  auto manifest =
      cohort::checkpoint::detail::read_container<float, cohort::checkpoint::TrainingState<float>>(
          sharded.manifest, cohort::checkpoint::kManifestMagic)
          .payload;
  // The second shard, intact, moved out of the checkpoint's directory, and files a save must not
  // touch: one outside, one beside the manifest under a name no save of it gives.
  fs::create_directories(directory.path / "elsewhere");
  const fs::path moved = directory.path / "elsewhere" / sharded.shards[1].filename();
  fs::rename(sharded.shards[1], moved);
  const fs::path precious = directory.path / "precious.txt";
  const fs::path beside = directory.path / "run" / "precious.txt";
  overwrite(precious, "keep me");
  overwrite(beside, "keep me too");

  auto target = make_trainer();
  for (const std::string& name : {"../elsewhere/" + moved.filename().string(), moved.string()}) {
    CAPTURE(name);
    manifest.shards[1].file = name;
    cohort::checkpoint::write(sharded.manifest, manifest);
    const std::string message = refusal(target, sharded.manifest);
    CHECK(message.find("checkpoint " + sharded.manifest.string()) != std::string::npos);
    CHECK(message.find("names the shard file \"" + name + "\", which is not a plain file name") !=
          std::string::npos);
  }
  CHECK(target.step() == 0);

  manifest.shards = {{.file = "../precious.txt"},
                     {.file = precious.string()},
                     {.file = "precious.txt"},
                     {.file = ".."}};
  cohort::checkpoint::write(sharded.manifest, manifest);
  CHECK(refusal(target, sharded.manifest).find("which is not a plain file name") !=
        std::string::npos);
  CHECK(save_refusal(target, sharded.manifest) == "saved");
  CHECK(fs::exists(precious));
  CHECK(fs::exists(beside));
  CHECK(fs::exists(moved));
  CHECK(cohort::checkpoint::read<float>(sharded.manifest).step == 0);
}

TEST_CASE("a payload declaring more values than it holds is refused before they are allocated") {
  TemporaryDirectory directory;
  const fs::path checkpoint = directory.path / "run.ckpt";
  cohort::checkpoint::TrainingState<float> state;
  state.optimizer = "sgd";
  state.parameters = {1.5f, 2.5f, 3.5f};
  cohort::checkpoint::write(checkpoint, state);
  const std::string good = bytes_of(checkpoint);
  std::string payload = good.substr(cohort::checkpoint::kHeaderBytes);
  // The parameters' length, as Boost writes it: a 64-bit count before the values.
  std::string length(8, '\0');
  length[0] = 3;
  const std::size_t at = payload.find(length + bytes_of_value(1.5f));
  REQUIRE(at != std::string::npos);
  auto target = make_trainer();

  for (const std::uint64_t declared : {std::uint64_t{1} << 27, std::uint64_t{1} << 40}) {
    CAPTURE(declared);
    std::memcpy(payload.data() + at, &declared, sizeof declared);
    overwrite(checkpoint, container(cohort::checkpoint::kMagic, 4, payload));
    const std::string message = refusal(target, checkpoint);
    CHECK(message.find(checkpoint.string()) != std::string::npos);
    CHECK(message.find("parameters declares " + std::to_string(declared) + " elements") !=
          std::string::npos);
  }
  // A manifest's record count.
  cohort::checkpoint::TrainingState<float> manifest;
  manifest.optimizer = "adam";
  manifest.shards.assign(5, {.file = "x"});  // a count no other field of it holds
  cohort::checkpoint::write(checkpoint, manifest);
  std::string manifest_payload = bytes_of(checkpoint).substr(cohort::checkpoint::kHeaderBytes);
  const std::string count = bytes_of_value(std::uint64_t{5});
  const std::size_t count_at = manifest_payload.find(count);
  REQUIRE(count_at != std::string::npos);
  REQUIRE(manifest_payload.find(count, count_at + 1) == std::string::npos);
  const std::uint64_t records = std::uint64_t{1} << 40;
  std::memcpy(manifest_payload.data() + count_at, &records, sizeof records);
  overwrite(checkpoint, container(cohort::checkpoint::kManifestMagic, 4, manifest_payload));
  CHECK(refusal(target, checkpoint).find("shards declares 1099511627776 elements") !=
        std::string::npos);

  // A file shorter than the archive's own header, and one whose header declares 2^40 bytes of
  // signature.
  overwrite(checkpoint, container(cohort::checkpoint::kMagic, 4, payload.substr(0, 5)));
  CHECK(refusal(target, checkpoint).find("not a Boost.Serialization") != std::string::npos);
  payload[5] = 1;
  overwrite(checkpoint, container(cohort::checkpoint::kMagic, 4, payload));
  CHECK(refusal(target, checkpoint).find("not a Boost.Serialization") != std::string::npos);
  CHECK(target.step() == 0);
}

TEST_CASE("a shard declaring more parameters than the shard files hold is refused") {
  TemporaryDirectory directory;
  const fs::path manifest_file = directory.path / "run.ckpt";
  cohort::checkpoint::ShardState<float> shard;
  shard.elements = std::uint64_t{1} << 40;
  shard.begin = 0;
  shard.end = 2;
  shard.parameters = {1, 2};
  const std::string name = cohort::checkpoint::shard_file_name(manifest_file, 0, 1, 0, 1);
  cohort::checkpoint::TrainingState<float> manifest;
  manifest.optimizer = "sgd";
  manifest.shards = {{.file = name,
                      .begin = 0,
                      .end = 2,
                      .crc32 = cohort::checkpoint::write(directory.path / name, shard)}};
  cohort::checkpoint::write(manifest_file, manifest);
  std::string message;
  try {
    cohort::checkpoint::read<float>(manifest_file);
  } catch (const cohort::CheckpointError& error) {
    message = error.what();
  }
  CHECK(message.find("checkpoint " + manifest_file.string()) != std::string::npos);
  CHECK(message.find("declares 1099511627776 parameters") != std::string::npos);
}

namespace {

// What `run` returns while no file of this process may grow past `bytes` (a write past them fails
// with EFBIG instead of raising SIGXFSZ).
template <class Run>
std::string with_files_limited_to(rlim_t bytes, Run run) {
  rlimit limit{};
  REQUIRE(::getrlimit(RLIMIT_FSIZE, &limit) == 0);
  const rlimit saved = limit;
  const auto handler = std::signal(SIGXFSZ, SIG_IGN);
  limit.rlim_cur = bytes;
  REQUIRE(::setrlimit(RLIMIT_FSIZE, &limit) == 0);
  const std::string result = run();
  ::setrlimit(RLIMIT_FSIZE, &saved);
  std::signal(SIGXFSZ, handler);
  return result;
}

// A save of `file` that the file system refused midway: named with its errno, and `file` kept as
// it was (`before`), alone in its directory.
void check_refused_write(const std::string& message, const fs::path& file,
                         const std::string& before) {
  CAPTURE(message);
  CHECK(message.find("checkpoint " + file.string()) != std::string::npos);
  CHECK(message.find(std::string("write failed: ") + std::strerror(EFBIG)) != std::string::npos);
  CHECK(bytes_of(file) == before);
  CHECK(std::distance(fs::directory_iterator(file.parent_path()), fs::directory_iterator()) == 1);
}

}  // namespace

TEST_CASE("a save the file system refuses midway names the error and keeps the file it replaces") {
  TemporaryDirectory directory;
  const fs::path checkpoint = directory.path / "run.ckpt";
  auto trainer = make_trainer();
  trainer.fit(small_task_data(), {.steps = 2});
  trainer.save(checkpoint);
  const std::string before = bytes_of(checkpoint);
  trainer.fit(small_task_data(), {.steps = 4});
  // Files of this process may not grow past 64 bytes: the payload's write fails with EFBIG.
  const std::string message =
      with_files_limited_to(64, [&] { return save_refusal(trainer, checkpoint); });
  check_refused_write(message, checkpoint, before);
}

TEST_CASE("a checkpoint path that is a directory is refused naming it, by restore and by save") {
  TemporaryDirectory directory;
  auto trainer = make_trainer();
  trainer.fit(small_task_data(), {.steps = 2});
  const std::string restore_message = refusal(trainer, directory.path);
  CHECK(restore_message.find("checkpoint " + directory.path.string()) != std::string::npos);
  CHECK(restore_message.find("is a directory") != std::string::npos);
  const std::string save_message = save_refusal(trainer, directory.path);
  CHECK(save_message.find("checkpoint " + directory.path.string()) != std::string::npos);
  CHECK(save_message.find("is a directory") != std::string::npos);
  CHECK_THROWS_AS(cohort::checkpoint::saved(directory.path), cohort::CheckpointError);
  CHECK(trainer.step() == 2);
}

TEST_CASE("a save removes the temporary files that dead saves of the same checkpoint left") {
  TemporaryDirectory directory;
  const fs::path checkpoint = directory.path / "run.ckpt";
  const std::string shard = cohort::checkpoint::shard_file_name(checkpoint, 3, 0xab, 0, 2);
  const std::vector<std::string> stale = {"run.ckpt.tmp-12345", shard + ".tmp-999"};
  const std::vector<std::string> kept = {"other.ckpt.tmp-12345", "run.ckpt.tmp-",
                                         "run.ckpt.tmp-x1",      "run.ckpt.tmp-1.txt",
                                         "xrun.ckpt.tmp-12",     shard};
  for (const auto& name : stale) overwrite(directory.path / name, "left by a crash");
  for (const auto& name : kept) overwrite(directory.path / name, "not a temporary of run.ckpt");
  auto trainer = make_trainer();
  trainer.fit(small_task_data(), {.steps = 1});
  trainer.save(checkpoint);
  for (const auto& name : stale) CHECK_MESSAGE(!fs::exists(directory.path / name), name);
  for (const auto& name : kept) CHECK_MESSAGE(fs::exists(directory.path / name), name);
}

TEST_CASE("saved tells a new run from a continued one and reports shards without their manifest") {
  TemporaryDirectory directory;
  CHECK_FALSE(cohort::checkpoint::saved(directory.path / "run.ckpt"));
  CHECK_FALSE(cohort::checkpoint::saved(directory.path / "missing" / "run.ckpt"));
  const auto sharded = write_sharded(directory.path);
  CHECK(cohort::checkpoint::saved(sharded.manifest));

  fs::remove(sharded.manifest);
  std::string message;
  try {
    cohort::checkpoint::saved(sharded.manifest);
  } catch (const cohort::CheckpointError& error) {
    message = error.what();
  }
  CHECK(message.find("checkpoint " + sharded.manifest.string() + ": does not exist, but 2 shard") !=
        std::string::npos);
  for (const auto& shard : sharded.shards) CHECK(message.find(shard.string()) != std::string::npos);
  auto target = make_trainer();
  CHECK(refusal(target, sharded.manifest) == message);
  // Another checkpoint's shards are not this one's.
  CHECK_FALSE(cohort::checkpoint::saved(directory.path / "run"));
}

namespace {

// A state large enough that its values are written in several chunks and shares.
cohort::checkpoint::TrainingState<float> values_state() {
  cohort::checkpoint::TrainingState<float> state;
  state.optimizer = "adam";
  state.step = 41;
  state.seed = 7;
  state.schedule = "warmup_cosine";
  for (int i = 0; i < 100'003; ++i) state.parameters.push_back(0.25F * static_cast<float>(i));
  state.optimizer_state.assign(2 * state.parameters.size(), 1.5F);
  return state;
}

std::uint32_t crc32_of(std::span<const float> values) {
  return cohort::checkpoint::detail::crc32(
      std::string_view(reinterpret_cast<const char*>(values.data()), values.size_bytes()));
}

// `state` written in place, each block in `shares` shares from as many threads, the last share
// first, their checksums joined as a fit's replicas join theirs; `wrong` flips the parameters'.
void write_in_place(const fs::path& file, const cohort::checkpoint::TrainingState<float>& state,
                    std::size_t shares, bool wrong = false) {
  using cohort::checkpoint::Values;
  cohort::checkpoint::TrainingState<float> fields = state;
  fields.parameters.clear();
  fields.optimizer_state.clear();
  const std::span<const float> parameters(state.parameters);
  const std::span<const float> optimizer_state(state.optimizer_state);
  cohort::checkpoint::InPlaceWrite<float> write(file, fields, parameters, optimizer_state);
  const auto share_of = [&](std::span<const float> block, std::size_t share) {
    const std::size_t begin = block.size() * share / shares;
    return std::pair{begin, block.subspan(begin, block.size() * (share + 1) / shares - begin)};
  };
  std::atomic<bool> written = true;
  {
    std::vector<std::jthread> threads;
    for (std::size_t share = shares; share-- > 0;) {
      threads.emplace_back([&, share] {
        for (const auto& [which, block] : {std::pair{Values::kParameters, parameters},
                                           std::pair{Values::kOptimizerState, optimizer_state}}) {
          const auto [first, values] = share_of(block, share);
          if (!write.write(which, first, values)) written = false;
        }
      });
    }
  }
  REQUIRE(written);
  const auto joined = [&](std::span<const float> block) {
    std::uint32_t crc32 = 0;
    for (std::size_t share = 0; share < shares; ++share) {
      const auto values = share_of(block, share).second;
      crc32 =
          cohort::checkpoint::detail::crc32_append(crc32, crc32_of(values), values.size_bytes());
    }
    return crc32;
  };
  write.commit(joined(parameters) ^ (wrong ? 1U : 0U), joined(optimizer_state));
}

}  // namespace

TEST_CASE("a checkpoint written in place, in shares from several threads, is write's file") {
  TemporaryDirectory directory;
  const auto state = values_state();
  const fs::path plain = directory.path / "plain.ckpt";
  cohort::checkpoint::write(plain, state);
  for (const std::size_t shares : {1, 2, 3}) {
    CAPTURE(shares);
    const fs::path in_place = directory.path / ("in-place-" + std::to_string(shares) + ".ckpt");
    write_in_place(in_place, state, shares);
    CHECK(bytes_of(in_place) == bytes_of(plain));
    const auto read = cohort::checkpoint::read<float>(in_place);
    CHECK(read.parameters == state.parameters);
    CHECK(read.step == state.step);
  }
  // The checksums given are the ones the header carries: a wrong one makes a file read() refuses.
  const fs::path wrong = directory.path / "wrong.ckpt";
  write_in_place(wrong, state, 2, true);
  std::string message;
  try {
    cohort::checkpoint::read<float>(wrong);
  } catch (const cohort::CheckpointError& error) {
    message = error.what();
  }
  CHECK(message.find("checksum") != std::string::npos);
}

TEST_CASE("a checkpoint written in place leaves nothing when abandoned or refused") {
  TemporaryDirectory directory;
  const auto state = values_state();
  const fs::path file = directory.path / "run.ckpt";
  {
    cohort::checkpoint::InPlaceWrite<float> write(file, {},
                                                  std::span<const float>(state.parameters),
                                                  std::span<const float>(state.optimizer_state));
    CHECK(write.write(cohort::checkpoint::Values::kParameters, 0,
                      std::span<const float>(state.parameters)));
  }
  CHECK(fs::is_empty(directory.path));

  // A value write the file system refuses (files of this process may not grow past 4096 bytes):
  // named by commit, and the checkpoint it would replace is kept.
  cohort::checkpoint::write(file, state);
  const std::string before = bytes_of(file);
  const std::string message = with_files_limited_to(4096, [&] {
    try {
      cohort::checkpoint::InPlaceWrite<float> write(file, {},
                                                    std::span<const float>(state.parameters),
                                                    std::span<const float>(state.optimizer_state));
      CHECK_FALSE(write.write(cohort::checkpoint::Values::kParameters, 0,
                              std::span<const float>(state.parameters)));
      write.commit(crc32_of(state.parameters), crc32_of(state.optimizer_state));
    } catch (const cohort::CheckpointError& error) {
      return std::string(error.what());
    }
    return std::string();
  });
  check_refused_write(message, file, before);
}
