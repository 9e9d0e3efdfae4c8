// MultiWorkerMirrored across real processes over TCP on 127.0.0.1, started by the local launcher,
// by mpirun, and by hand for the fault tests.
#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cohort/strategy/multi_worker_mirrored.hpp>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "jobs.hpp"
#include "processes.hpp"
#include "rendezvous_attacks.hpp"
#include "training.hpp"

namespace {

namespace fs = std::filesystem;
using cohort::testing::completed;
using cohort::testing::mirrored_parameters;
using cohort::testing::Process;
using cohort::testing::read_file;
using cohort::testing::TemporaryDirectory;
using namespace std::chrono_literals;

// `count` workers of 1 replica started by hand with COHORT_* variables, training until stopped;
// worker r logs to rank<r>.log in `directory`. Returns once every one has met the others, so
// that a worker stopped or killed next is lost during training, not during the rendezvous.
std::vector<std::unique_ptr<Process>> start_training_workers(
    const fs::path& directory, int count, const std::string& job_id,
    const std::map<std::string, std::string>& extra_environment = {}) {
  const std::string port = std::to_string(cohort::testing::free_port());
  std::vector<std::unique_ptr<Process>> workers;
  for (int rank = 0; rank < count; ++rank) {
    std::map<std::string, std::string> environment{{"COHORT_RANK", std::to_string(rank)},
                                                   {"COHORT_WORLD_SIZE", std::to_string(count)},
                                                   {"COHORT_MASTER_ADDR", "127.0.0.1"},
                                                   {"COHORT_MASTER_PORT", port},
                                                   {"COHORT_JOB_ID", job_id}};
    environment.insert(extra_environment.begin(), extra_environment.end());
    workers.push_back(std::make_unique<Process>(
        std::vector<std::string>{COHORT_TRAINER, "1", "1000000", directory / "never.bin"},
        environment, directory / ("rank" + std::to_string(rank) + ".log")));
  }
  for (int rank = 0; rank < count; ++rank) {
    const fs::path log = directory / ("rank" + std::to_string(rank) + ".log");
    REQUIRE_MESSAGE(
        cohort::testing::when_logged(log, "multi_worker_trainer: connected", 60s).has_value(),
        read_file(log));
  }
  for (const auto& worker : workers) REQUIRE_FALSE(worker->wait(0ms).has_value());
  return workers;
}

}  // namespace

TEST_CASE(
    "2 workers x 2 replicas, 4 x 1 and Mirrored 4 give bit-identical parameters, overlap or not, "
    "through shared memory or over TCP") {
  TemporaryDirectory directory("cohort-multi-worker");
  const std::string expected = mirrored_parameters(50);
  REQUIRE(expected.size() ==
          cohort::testing::parameters_of(cohort::testing::small_model()).size() * sizeof(float));
  const auto segments = cohort::testing::shared_memory_segments();
  for (const std::string shared : {"1", "0"}) {
    for (auto [workers, local] : {std::pair{"2", "2"}, std::pair{"4", "1"}}) {
      CAPTURE(shared);
      CAPTURE(workers);
      const fs::path out = directory.path / ("parameters-" + std::string(workers) + ".bin");
      const auto [exit, output] =
          completed({COHORT_RUN, "--np", workers, "--", COHORT_TRAINER, local, "50", out},
                    directory.path / "log.txt", {{"COHORT_SHARED_MEMORY", shared}});
      CAPTURE(output);
      REQUIRE(exit.exited);
      REQUIRE(exit.code == 0);
      CHECK(read_file(out) == expected);
      CHECK((output.find("cohort: the " + std::string(workers) +
                         " worker processes of this host all-reduce through shared memory") !=
             std::string::npos) == (shared == "1"));
      // Through shared memory, the gradient sum lies there (share_buffer): no line says otherwise.
      CHECK(output.find("the gradient goes in and out of shared memory") == std::string::npos);
    }
  }
  CHECK(cohort::testing::segments_left_since(segments).empty());
}

TEST_CASE(
    "3 workers of 1 or 2 replicas, dealt 8 micro-batches unevenly, give one replica's bits, "
    "through shared memory and over TCP") {
  TemporaryDirectory directory("cohort-multi-worker");
  const std::string expected = mirrored_parameters(30, 1, 8);
  const auto segments = cohort::testing::shared_memory_segments();
  for (const std::string shared : {"1", "0"}) {
    // The workers fold 2, 2 and 4 micro-batches; with 2 replicas each, 1, 1 | 1, 1 | 2, 2.
    for (const std::string local : {"1", "2"}) {
      CAPTURE(shared);
      CAPTURE(local);
      const fs::path out = directory.path / ("parameters-" + local + ".bin");
      const auto [exit, output] =
          completed({COHORT_RUN, "--np", "3", "--", COHORT_TRAINER, local, "30", out},
                    directory.path / "log.txt", {{"COHORT_SHARED_MEMORY", shared}});
      CAPTURE(output);
      REQUIRE(exit.exited);
      REQUIRE(exit.code == 0);
      CHECK(read_file(out) == expected);
    }
  }
  CHECK(cohort::testing::segments_left_since(segments).empty());
}

TEST_CASE(
    "gradients on the wire in bfloat16 or float16 (COHORT_WIRE=bf16, fp16) give one replica's bits "
    "of that format on any worker and replica count, through shared memory and over TCP") {
  TemporaryDirectory directory("cohort-multi-worker-bf16");
  const auto train = [&](const std::string& wire, const std::string& workers,
                         const std::string& local, const std::string& shared) {
    CAPTURE(wire);
    CAPTURE(workers);
    CAPTURE(local);
    CAPTURE(shared);
    const fs::path out = directory.path / ("parameters-" + workers + "x" + local + ".bin");
    const auto [exit, output] = completed(
        {COHORT_RUN, "--np", workers, "--", COHORT_TRAINER, local, "30", out},
        directory.path / "log.txt", {{"COHORT_WIRE", wire}, {"COHORT_SHARED_MEMORY", shared}});
    CAPTURE(output);
    REQUIRE(exit.exited);
    REQUIRE(exit.code == 0);
    return read_file(out);
  };
  // One process of one replica: every micro-batch's gradient and every sum rounded in its fold.
  const std::string expected = train("bf16", "1", "1", "1");
  // Other bits than the float tree's, yet a run of them: the rounding happened, on every path.
  CHECK(expected != mirrored_parameters(30));
  CHECK(train("bf16", "2", "2", "1") == expected);
  CHECK(train("bf16", "3", "1", "1") == expected);  // 2, 2 and 4 micro-batches: uneven nodes
  CHECK(train("bf16", "4", "1", "0") == expected);
  CHECK(train("bf16", "2", "2", "0") == expected);
  // float16: bits of its own, the same on every path.
  const std::string half = train("fp16", "1", "1", "1");
  CHECK(half != expected);
  CHECK(half != mirrored_parameters(30));
  CHECK(train("fp16", "2", "2", "1") == half);
  CHECK(train("fp16", "3", "1", "0") == half);

  // A checkpoint records the sum: the run resumed under bf16 ends with the uninterrupted run's
  // bits, and one resumed under float is refused, naming it, before it trains a step.
  const fs::path resumed = directory.path / "resumed.bin";
  const auto resume = [&](const std::string& steps, const std::string& wire) {
    return completed(
        {COHORT_RUN, "--np", "2", "--", COHORT_TRAINER, "1", steps, resumed,
         "--checkpoint-directory", directory.path / "checkpoints", "--checkpoint-every", "10"},
        directory.path / ("resumed-" + steps + "-" + wire + ".txt"), {{"COHORT_WIRE", wire}});
  };
  REQUIRE(resume("20", "bf16").first.code == 0);
  const auto [in_float, float_output] = resume("30", "fp32");
  CAPTURE(float_output);
  CHECK(in_float.code != 0);
  CHECK(float_output.find("gradient sum (the wire's) is sum_bf16 in the file but sum in this "
                          "trainer") != std::string::npos);
  REQUIRE(resume("30", "bf16").first.code == 0);
  CHECK(read_file(resumed) == expected);

  const auto [refused, refusal] = completed(
      {COHORT_RUN, "--np", "1", "--", COHORT_TRAINER, "1", "1", directory.path / "never.bin"},
      directory.path / "refused.txt", {{"COHORT_WIRE", "fp8"}});
  CAPTURE(refusal);
  CHECK(refused.code != 0);
  CHECK(refusal.find("COHORT_WIRE") != std::string::npos);
  CHECK(refusal.find("expected fp32, bf16 or fp16") != std::string::npos);
}

TEST_CASE("3 workers x 1 replica and Mirrored 3 give bit-identical parameters") {
  TemporaryDirectory directory("cohort-multi-worker");
  const fs::path out = directory.path / "parameters.bin";
  const auto [exit, output] = completed(
      {COHORT_RUN, "--np", "3", "--", COHORT_TRAINER, "1", "30", out, "--micro-batches", "3"},
      directory.path / "log.txt");
  CAPTURE(output);
  REQUIRE(exit.exited);
  REQUIRE(exit.code == 0);
  CHECK(read_file(out) == mirrored_parameters(30, 3, 3));
}

TEST_CASE(
    "workers that may not raise their communication thread's priority say so and keep the bits; "
    "asked for realtime, they stop naming the variable") {
  TemporaryDirectory directory("cohort-multi-worker-priority");
  // The job runs without CAP_SYS_NICE (gone from the bounding set, so also after exec) and with a
  // real-time limit of 0: what a process may not raise a thread's priority with.
  const std::vector<std::string> without_permission{"/usr/bin/setpriv",
                                                    "--bounding-set=-sys_nice",
                                                    "--inh-caps=-sys_nice",
                                                    "--",
                                                    "/usr/bin/prlimit",
                                                    "--rtprio=0",
                                                    "--"};
  std::vector<std::string> probe = without_permission;
  probe.push_back("/bin/true");
  if (!fs::exists(without_permission.front()) || !fs::exists(without_permission[4]) ||
      completed(probe, directory.path / "probe.txt").first.code != 0) {
    MESSAGE(
        "skipped: setpriv and prlimit (util-linux) cannot drop CAP_SYS_NICE and the real-time "
        "limit here (dropping the capability needs CAP_SETPCAP)");
    return;
  }
  const auto job = [&](const fs::path& out) {
    std::vector<std::string> command = without_permission;
    for (const std::string& word :
         {std::string(COHORT_RUN), std::string("--np"), std::string("2"), std::string("--"),
          std::string(COHORT_TRAINER), std::string("1"), std::string("20"), out.string()}) {
      command.push_back(word);
    }
    return command;
  };
  const fs::path out = directory.path / "parameters.bin";
  const auto [exit, output] = completed(job(out), directory.path / "log.txt");
  CAPTURE(output);
  REQUIRE(exit.exited);
  REQUIRE(exit.code == 0);
  for (const char* rank : {"rank 0", "rank 1"}) {
    CHECK(output.find(std::string("cohort: ") + rank +
                      ": the communication thread runs at normal priority") != std::string::npos);
  }
  CHECK(output.find("real-time priority (SCHED_FIFO 1) was refused: Operation not permitted") !=
        std::string::npos);
  CHECK(read_file(out) == mirrored_parameters(20, 2));

  const auto [refused, refusal] =
      completed(job(directory.path / "never.bin"), directory.path / "refused.txt",
                {{"COHORT_COMMUNICATION_PRIORITY", "realtime"}});
  CAPTURE(refusal);
  CHECK(refused.exited);
  CHECK(refused.code != 0);
  CHECK(refusal.find("communication_priority (or COHORT_COMMUNICATION_PRIORITY) = realtime: "
                     "real-time priority (SCHED_FIFO 1) was refused") != std::string::npos);
}

namespace {

// 2 workers of 1 replica training 20 steps, in a mount namespace of the job's own whose /dev/shm
// is a tmpfs of `size` (mount's size=): required to succeed with Mirrored 2's bits. Their output,
// or nothing where unshare (util-linux) cannot make one here (it needs root), said by a MESSAGE.
std::optional<std::string> trained_with_dev_shm_of(const std::string& size,
                                                   const fs::path& directory) {
  const fs::path out = directory / "parameters.bin";
  std::vector<std::string> command{
      "/usr/bin/unshare",
      "--mount",
      "--",
      "/bin/sh",
      "-c",
      "mount -t tmpfs -o size=" + size + " cohort-test /dev/shm && exec \"$@\"",
      "sh"};
  std::vector<std::string> probe = command;
  probe.push_back("/bin/true");
  if (!fs::exists(command.front()) || completed(probe, directory / "probe.txt").first.code != 0) {
    MESSAGE("skipped: unshare (util-linux) cannot make a mount namespace here (needs root)");
    return std::nullopt;
  }
  for (const std::string& word :
       {std::string(COHORT_RUN), std::string("--np"), std::string("2"), std::string("--"),
        std::string(COHORT_TRAINER), std::string("1"), std::string("20"), out.string()}) {
    command.push_back(word);
  }
  const auto [exit, output] = completed(command, directory / "log.txt");
  CAPTURE(output);
  REQUIRE(exit.exited);
  REQUIRE(exit.code == 0);
  CHECK(read_file(out) == mirrored_parameters(20, 2));
  return output;
}

}  // namespace

TEST_CASE(
    "workers whose /dev/shm is too small for the segment say why, all-reduce over TCP and keep "
    "the bits") {
  TemporaryDirectory directory("cohort-multi-worker-small-shm");
  // 64 KiB: the segment of 2 workers (4 MiB and 8 KiB) does not fit.
  const auto output = trained_with_dev_shm_of("64k", directory.path);
  if (!output) return;
  CAPTURE(*output);
  CHECK(output->find("cohort: rank 0: the worker processes of this host all-reduce over TCP, since "
                     "shared memory failed: posix_fallocate(/cohort-") != std::string::npos);
  CHECK(output->find("No space left on device") != std::string::npos);
  CHECK(output->find("cohort: rank 1: the worker processes of this host all-reduce over TCP, since "
                     "shared memory failed: rank 0 could not create or map the segment") !=
        std::string::npos);
}

TEST_CASE(
    "workers whose /dev/shm holds the segment but not their gradient beside it say why, copy the "
    "gradient through the slots and keep the bits") {
  TemporaryDirectory directory("cohort-multi-worker-no-gradient-shm");
  // 6 MiB: the segment of 2 workers (4 MiB and 8 KiB) fits, but the one that adds a region per
  // worker for the gradient sum does not fit beside it while it is made.
  const auto output = trained_with_dev_shm_of("6m", directory.path);
  if (!output) return;
  CAPTURE(*output);
  CHECK(output->find("cohort: the 2 worker processes of this host all-reduce through shared "
                     "memory") != std::string::npos);
  CHECK(output->find("cohort: replica 0: the gradient goes in and out of shared memory, since a "
                     "buffer for it there failed: posix_fallocate(/cohort-") != std::string::npos);
  CHECK(output->find("cohort: replica 1: the gradient goes in and out of shared memory, since a "
                     "buffer for it there failed: rank 0 could not create or map the segment") !=
        std::string::npos);
}

TEST_CASE(
    "encrypted frames, or frames under a MAC, train 2 workers x 2 replicas to the same bits") {
  TemporaryDirectory directory("cohort-multi-worker-encrypted");
  const std::string expected = mirrored_parameters(20);
  for (const char* encrypt : {"0", "1"}) {
    CAPTURE(encrypt);
    const fs::path out = directory.path / ("parameters-" + std::string(encrypt) + ".bin");
    const auto [exit, output] = completed(
        {COHORT_RUN, "--np", "2", "--", COHORT_TRAINER, "2", "20", out}, directory.path / "log.txt",
        {{"COHORT_SECRET", "s3cret"}, {"COHORT_ENCRYPT", encrypt}});
    CAPTURE(output);
    REQUIRE(exit.exited);
    REQUIRE(exit.code == 0);
    CHECK(read_file(out) == expected);
  }
}

TEST_CASE("the ring collective trains across processes too, with its own bits") {
  TemporaryDirectory directory("cohort-multi-worker-ring");
  const fs::path out = directory.path / "ring.bin";
  const auto [exit, output] =
      completed({COHORT_RUN, "--np", "4", "--", COHORT_TRAINER, "1", "20", out, "ring"},
                directory.path / "log");
  CAPTURE(output);
  REQUIRE(exit.exited);
  CHECK(exit.code == 0);
  CHECK(read_file(out).size() == mirrored_parameters(20).size());
}

TEST_CASE("the same binary runs under mpirun and gives the same bits") {
  if (std::string(COHORT_MPIRUN).empty()) {
    MESSAGE("skipped: mpirun (Open MPI) not found at configure time");
    return;
  }
  TemporaryDirectory directory("cohort-multi-worker-mpi");
  const fs::path out = directory.path / "mpi.bin";
  const auto [exit, output] =
      completed({COHORT_MPIRUN, "--oversubscribe", "--mca", "btl", "self,tcp", "-np", "2",
                 COHORT_TRAINER, "2", "50", out},
                directory.path / "log",
                {{"OMPI_ALLOW_RUN_AS_ROOT", "1"},
                 {"OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1"},
                 {"COHORT_MASTER_PORT", std::to_string(cohort::testing::free_port())}});
  CAPTURE(output);
  REQUIRE(exit.exited);
  REQUIRE(exit.code == 0);
  CHECK(output.find("from Open MPI variables") != std::string::npos);
  CHECK(read_file(out) == mirrored_parameters(50));
}

// Through shared memory, as the 4 workers of one host all-reduce by default: a peer that died is
// found by its connection's end while the others wait in the segment.
TEST_CASE("a worker killed mid-training makes every other worker exit non-zero naming it") {
  TemporaryDirectory directory("cohort-multi-worker-kill");
  const auto workers = start_training_workers(directory.path, 4, "kill-test");
  workers[1]->kill(SIGKILL);
  for (int rank : {0, 2, 3}) {
    CAPTURE(rank);
    const auto exit = workers[static_cast<std::size_t>(rank)]->wait(30s);
    REQUIRE(exit.has_value());
    CHECK(exit->exited);
    CHECK(exit->code != 0);
    const std::string log = read_file(directory.path / ("rank" + std::to_string(rank) + ".log"));
    CAPTURE(log);
    CHECK(log.find("rank 1") != std::string::npos);
    if (rank == 0) CHECK(log.find("all-reduce through shared memory") != std::string::npos);
    // Named as gone, not found silent at the timeout.
    CHECK(log.find("no progress within") == std::string::npos);
  }
}

namespace {

// Starts one worker process per entry of `extra` (the arguments after LOCAL_REPLICAS STEPS OUT),
// by hand, each with its own log, and waits for all within 60 s.
std::vector<std::pair<cohort::testing::Exit, std::string>> run_workers(
    const TemporaryDirectory& directory, const std::string& local, const std::string& steps,
    const std::vector<std::vector<std::string>>& extra,
    const std::map<std::string, std::string>& extra_environment = {}) {
  const std::string port = std::to_string(cohort::testing::free_port());
  const std::string size = std::to_string(extra.size());
  std::vector<std::unique_ptr<Process>> workers;
  for (std::size_t rank = 0; rank < extra.size(); ++rank) {
    std::vector<std::string> command{COHORT_TRAINER, local, steps,
                                     directory.path / ("parameters-" + std::to_string(rank))};
    command.insert(command.end(), extra[rank].begin(), extra[rank].end());
    std::map<std::string, std::string> environment{{"COHORT_RANK", std::to_string(rank)},
                                                   {"COHORT_WORLD_SIZE", size},
                                                   {"COHORT_MASTER_ADDR", "127.0.0.1"},
                                                   {"COHORT_MASTER_PORT", port},
                                                   {"COHORT_JOB_ID", "settings-test"}};
    environment.insert(extra_environment.begin(), extra_environment.end());
    workers.push_back(std::make_unique<Process>(
        command, environment, directory.path / ("rank" + std::to_string(rank) + ".log")));
  }
  std::vector<std::pair<cohort::testing::Exit, std::string>> results;
  for (std::size_t rank = 0; rank < extra.size(); ++rank) {
    const auto exit = workers[rank]->wait(60s);
    REQUIRE_MESSAGE(exit.has_value(), "worker " << rank << " still running after 60 s");
    results.emplace_back(*exit,
                         read_file(directory.path / ("rank" + std::to_string(rank) + ".log")));
  }
  return results;
}

// Mirrored in this process on the poisoned data under skip_step, as multi_worker_trainer trains.
std::string mirrored_skipping(std::uint64_t steps, std::size_t replicas) {
  cohort::Trainer trainer(cohort::testing::WithoutReadiness{cohort::testing::small_model()},
                          cohort::strategy::Mirrored<>({.replicas = replicas}),
                          cohort::optimizer::Adam({.learning_rate = 3e-3}),
                          {.global_batch = 64,
                           .micro_batches = 8,
                           .seed = 11,
                           .progress = cohort::Progress::kSilent,
                           .on_nonfinite = cohort::NonFinite::kSkipStep});
  const cohort::Report report =
      trainer.fit(cohort::testing::PoisonedData{.poisoned = 5}, {.steps = steps});
  CHECK(report.skipped_steps == 1);
  return cohort::testing::bytes_of(cohort::testing::parameters_of(trainer.model()));
}

// Mirrored in this process, as mirrored_parameters trains, with Adam's global-norm clipping at
// max_norm (0: none), saved to `file`: the checkpoint's bytes.
std::string mirrored_checkpoint(std::uint64_t steps, std::size_t replicas, double max_norm,
                                const fs::path& file) {
  cohort::Trainer trainer(
      cohort::testing::WithoutReadiness{cohort::testing::small_model()},
      cohort::strategy::Mirrored<>({.replicas = replicas}),
      cohort::optimizer::Adam({.learning_rate = 3e-3, .max_gradient_norm = max_norm}),
      {.global_batch = 64, .micro_batches = 8, .seed = 11, .progress = cohort::Progress::kSilent});
  trainer.fit(cohort::testing::small_task_data(), {.steps = steps});
  trainer.save(file);
  return read_file(file);
}

}  // namespace

TEST_CASE(
    "workers of one replica each, which update their own parts of the parameters (stripes through "
    "shared memory; over TCP, what each owns of the all-reduce; COHORT_SHARE_UPDATE_FROM=0 for "
    "this small model), end with Mirrored's parameters and optimizer state, clipped or not") {
  TemporaryDirectory directory("cohort-multi-worker-sharded-update");
  for (const std::string shared : {"1", "0"}) {
    for (const std::size_t workers : {2, 4}) {
      for (const double max_norm : {0.0, 0.05}) {
        CAPTURE(shared);
        CAPTURE(workers);
        CAPTURE(max_norm);
        const fs::path file = directory.path / "workers.ckpt";
        const std::vector<std::string> arguments{"--save-restore", file, "--max-gradient-norm",
                                                 std::to_string(max_norm)};
        const auto results = run_workers(
            directory, "1", "20", std::vector<std::vector<std::string>>(workers, arguments),
            {{"COHORT_SHARED_MEMORY", shared}, {"COHORT_SHARE_UPDATE_FROM", "0"}});
        for (const auto& [exit, log] : results) {
          CAPTURE(log);
          CHECK(exit.exited);
          CHECK(exit.code == 0);
          CHECK(log.find("the gradient goes in and out of shared memory") == std::string::npos);
        }
        CHECK(read_file(file) ==
              mirrored_checkpoint(20, workers, max_norm, directory.path / "mirrored.ckpt"));
      }
    }
  }
}

// Only the chief writes; the others must not return from save before the file is whole, or a
// restore right after would not find it (it did not, 8 runs in 8, before save waited).
TEST_CASE("every worker returns from save only once the chief's checkpoint is whole") {
  TemporaryDirectory directory("cohort-multi-worker-save-restore");
  const std::string expected = mirrored_parameters(20);
  for (int run = 0; run < 3; ++run) {
    CAPTURE(run);
    const std::string file = directory.path / ("checkpoint-" + std::to_string(run));
    const std::vector<std::string> save_restore{"--save-restore", file};
    const auto results = run_workers(directory, "2", "20", {save_restore, save_restore});
    for (const auto& [exit, log] : results) {
      CAPTURE(log);
      CHECK(exit.exited);
      CHECK(exit.code == 0);
    }
    CHECK(read_file(directory.path / "parameters-0") == expected);
  }
}

TEST_CASE("a checkpoint the chief cannot write fails every worker, quoting the chief's reason") {
  TemporaryDirectory directory("cohort-multi-worker-save-fails");
  const fs::path not_a_directory = directory.path / "a-file";
  std::ofstream(not_a_directory) << "not a directory";
  const std::vector<std::string> save_restore{"--save-restore", not_a_directory / "checkpoint"};
  const auto results = run_workers(directory, "1", "5", {save_restore, save_restore});
  for (const auto& [exit, log] : results) {
    CAPTURE(log);
    CHECK(exit.exited);
    CHECK(exit.code == 1);
    CHECK(log.find("error: checkpoint " + (not_a_directory / "checkpoint").string()) !=
          std::string::npos);
  }
  CHECK(results.at(1).second.find("was not written: the chief (rank 0) reports 'checkpoint ") !=
        std::string::npos);
}

TEST_CASE(
    "a NaN example under on_nonfinite = raise fails every worker process naming the step and the "
    "same first index, whether the workers update their own stripes or the whole") {
  TemporaryDirectory directory("cohort-multi-worker-nan-raise");
  const std::uint64_t step = cohort::testing::steps_with_example(5, 11, 64, 8, 1).at(0);
  const std::string error =
      "error: a non-finite value (infinity or NaN) in the reduced gradient of step " +
      std::to_string(step) + ", first at index";
  const std::vector<std::string> poison{"--poison", "5"};
  std::vector<std::string> indices;
  // 2 x 2: every replica updates the whole; 2 x 1: each worker its own stripes through shared
  // memory, or its own part of the all-reduce over TCP.
  for (const auto& [local, shared] :
       {std::pair{"2", "1"}, std::pair{"1", "1"}, std::pair{"1", "0"}}) {
    CAPTURE(local);
    CAPTURE(shared);
    const auto results =
        run_workers(directory, local, "31", {poison, poison},
                    {{"COHORT_SHARED_MEMORY", shared}, {"COHORT_SHARE_UPDATE_FROM", "0"}});
    for (const auto& [exit, log] : results) {
      CAPTURE(log);
      CHECK(exit.exited);
      CHECK(exit.code == 1);
      const std::size_t at = log.find(error);
      REQUIRE(at != std::string::npos);
      indices.push_back(
          log.substr(at + error.size(), log.find(':', at + error.size()) - at - error.size()));
      CHECK(log.find("on_nonfinite = raise") != std::string::npos);
    }
  }
  CAPTURE(indices);
  CHECK(std::all_of(indices.begin(), indices.end(),
                    [&](const std::string& index) { return index == indices.front(); }));
}

TEST_CASE(
    "a local replica whose backward pass throws while its buckets are on the wire fails every "
    "worker promptly, each with the model's error") {
  // 2 processes x 2 replicas, buckets of 64 bytes: readiness reports 21 to 26 fall in different
  // steps and layers, some while the communication thread reduces the replica's earlier buckets,
  // whose buffers the failing step must not free under it.
  for (const int report : {21, 22, 23, 24, 25, 26}) {
    CAPTURE(report);
    TemporaryDirectory directory("cohort-multi-worker-failing-backward");
    const auto results =
        run_workers(directory, "2", "31", {{}, {"--fail-in-backward", std::to_string(report)}});
    for (std::size_t rank = 0; rank < results.size(); ++rank) {
      const auto& [exit, log] = results[rank];
      CAPTURE(log);
      CHECK(exit.exited);  // not killed by a signal
      CHECK(exit.code == 1);
      // Released by the failure, not by the timeout.
      CHECK(log.find("no progress within") == std::string::npos);
    }
    // The model's error: the process's own, or the reason its other replica was released; and
    // on the other worker, the reason worker 1 left, not a closed connection.
    for (std::size_t rank = 0; rank < results.size(); ++rank) {
      CAPTURE(rank);
      CHECK(results[rank].second.find("backward failed at readiness report " +
                                      std::to_string(report)) != std::string::npos);
    }
    CHECK(results[0].second.find("rank 1 left: '") != std::string::npos);
  }
}

TEST_CASE(
    "a NaN example under on_nonfinite = skip_step is skipped by every worker, bit for bit "
    "as Mirrored") {
  TemporaryDirectory directory("cohort-multi-worker-nan-skip");
  const std::vector<std::string> skip{"--poison", "5", "--on-nonfinite", "skip_step"};
  // 2 x 2: every replica updates the whole; 2 x 1: each worker its own stripes through shared
  // memory, or its own part of the all-reduce over TCP.
  for (const auto& [local, replicas, shared] :
       {std::tuple{"2", 4, "1"}, std::tuple{"1", 2, "1"}, std::tuple{"1", 2, "0"}}) {
    CAPTURE(local);
    CAPTURE(shared);
    const auto results =
        run_workers(directory, local, "31", {skip, skip},
                    {{"COHORT_SHARED_MEMORY", shared}, {"COHORT_SHARE_UPDATE_FROM", "0"}});
    for (const auto& [exit, log] : results) {
      CAPTURE(log);
      CHECK(exit.exited);
      CHECK(exit.code == 0);
      CHECK(log.find("skipped 1") != std::string::npos);
    }
    CHECK(read_file(directory.path / "parameters-0") == mirrored_skipping(31, replicas));
  }
}

TEST_CASE(
    "processes given different seeds, micro-batches or learning rates are refused before "
    "the first step, every one naming both values") {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--seed", "12"}, "seed is 11 on worker 0 (replica 0) but 12 on worker 1 (replica 1)"},
      {{"--micro-batches", "4"},
       "micro_batches is 8 on worker 0 (replica 0) but 4 on worker 1 (replica 1)"},
      {{"--learning-rate", "0.01"},
       "optimizer option learning_rate is 0.003 on worker 0 (replica 0) but 0.01 on worker 1 "
       "(replica 1)"},
  };
  for (const auto& [different, expected] : cases) {
    CAPTURE(expected);
    TemporaryDirectory directory("cohort-multi-worker-settings");
    const auto results = run_workers(directory, "1", "20", {{}, different});
    for (const auto& [exit, log] : results) {
      CAPTURE(log);
      CHECK(exit.exited);
      CHECK(exit.code == 1);
      CHECK(log.find(expected) != std::string::npos);
      CHECK(log.find("before the first step") != std::string::npos);
    }
    CHECK_FALSE(fs::exists(directory.path / "parameters-0"));
  }
}

TEST_CASE(
    "a job under a secret, attacked by strangers during its rendezvous, still trains to "
    "Mirrored's bits") {
  // Rank 0 alone first: every attack of tests/transport's rendezvous test is made on it while it
  // waits for rank 1, and two attackers still hold their connections when rank 1 joins.
  TemporaryDirectory directory("cohort-multi-worker-attacked");
  const int port = cohort::testing::free_port();
  const fs::path out = directory.path / "parameters.bin";
  const auto start = [&](int rank) {
    return std::make_unique<Process>(
        std::vector<std::string>{COHORT_TRAINER, "2", "50", out},
        std::map<std::string, std::string>{{"COHORT_RANK", std::to_string(rank)},
                                           {"COHORT_WORLD_SIZE", "2"},
                                           {"COHORT_MASTER_ADDR", "127.0.0.1"},
                                           {"COHORT_MASTER_PORT", std::to_string(port)},
                                           {"COHORT_JOB_ID", "attacked"},
                                           {"COHORT_SECRET", "correct horse battery staple"}},
        directory.path / ("rank" + std::to_string(rank) + ".log"));
  };
  const auto rank_zero = start(0);
  REQUIRE(cohort::testing::listening(static_cast<std::uint16_t>(port), 30s));
  const auto open = cohort::testing::attack_rendezvous(static_cast<std::uint16_t>(port));
  const auto rank_one = start(1);
  for (Process* rank : {rank_zero.get(), rank_one.get()}) {
    const auto exit = rank->wait(60s);
    CAPTURE(read_file(directory.path / "rank0.log"));
    CAPTURE(read_file(directory.path / "rank1.log"));
    REQUIRE(exit.has_value());
    CHECK(exit->exited);
    CHECK(exit->code == 0);
  }
  for (const auto& socket : open) CHECK(cohort::testing::closed_in_silence(socket));
  CHECK(read_file(out) == mirrored_parameters(50));
  // Rank 0 refused the strangers (its log shows the first few, at a bounded rate), and their
  // words reach no log.
  const std::string log = read_file(directory.path / "rank0.log");
  CHECK(log.find("rank 0: refused a connection: a peer at 127.0.0.1:") != std::string::npos);
  CHECK(log.find("compromised") == std::string::npos);
}

TEST_CASE(
    "a stopped worker (SIGSTOP) is reported, then fails every other worker at the timeout, "
    "through shared memory or over TCP") {
  // Both jobs at once: each waits out its timeout, which takes time, not the cores.
  const std::array<bool, 2> shared_memory{true, false};
  std::vector<std::unique_ptr<TemporaryDirectory>> directories;
  std::vector<std::vector<std::unique_ptr<Process>>> jobs;
  for (const bool shared : shared_memory) {
    directories.push_back(std::make_unique<TemporaryDirectory>(
        shared ? "cohort-multi-worker-stop-shared" : "cohort-multi-worker-stop-tcp"));
    jobs.push_back(start_training_workers(directories.back()->path, 2, "stop-test",
                                          {{"COHORT_SHARED_MEMORY", shared ? "1" : "0"}}));
    jobs.back()[1]->kill(SIGSTOP);
  }
  for (std::size_t job = 0; job < jobs.size(); ++job) {
    const bool shared = shared_memory[job];
    CAPTURE(shared);
    const auto& workers = jobs[job];
    {
      const auto exit = workers[0]->wait(40s);
      REQUIRE(exit.has_value());
      CHECK(exit->exited);
      CHECK(exit->code != 0);
    }
    const std::string log = read_file(directories[job]->path / "rank0.log");
    CAPTURE(log);
    // The warning at a quarter of the timeout, then the error, both naming the stopped rank.
    const std::string waiting =
        shared ? "waiting for: rank 1 in shared memory" : "waiting for: receive from rank 1";
    CHECK(log.find("cohort: rank 0: no progress for ") != std::string::npos);
    CHECK(log.find(waiting) != std::string::npos);
    // The workers of one replica each also gather their parameters: through shared memory after
    // the all-reduce, over TCP as the second half of a bucket's all-reduce, whose first is a
    // reduce_scatter; so the stop may fall in any of them.
    const auto named = [&](const std::string& operation) {
      return log.find("rank 0: " + operation + " #") != std::string::npos;
    };
    CHECK((named("all_reduce") || named("all_gather") || (!shared && named("reduce_scatter"))));
    CHECK(log.find(": no progress within 10000 ms during sequence") != std::string::npos);
    workers[1]->kill(SIGKILL);
  }
}

namespace {

// A transport standing in for Tcp, as a shaped or emulated one would: the same, and it counts
// the payload bytes it sends.
class CountingTcp : public cohort::transport::tcp::Tcp {
 public:
  explicit CountingTcp(cohort::transport::tcp::Options options) : Tcp(std::move(options)) {}
  using Tcp::transfer;
  void transfer(std::span<const cohort::transport::Send> sends,
                std::span<const cohort::transport::Receive> receives) {
    count(sends);
    Tcp::transfer(sends, receives);
  }
  void transfer(std::span<const cohort::transport::Send> sends,
                std::span<const cohort::transport::Receive> receives,
                cohort::transport::Meanwhile meanwhile) {
    count(sends);
    Tcp::transfer(sends, receives, meanwhile);
  }
  static void count(std::span<const cohort::transport::Send> sends) {
    for (const auto& send : sends) sent += send.payload.size();
  }
  static inline std::atomic<std::size_t> sent{0};
};

}  // namespace

TEST_CASE("a transport of the user's standing in for TCP trains 2 workers to Mirrored's bits") {
  using Strategy =
      cohort::strategy::MultiWorkerMirrored<cohort::device::Cpu, cohort::collective::Deterministic,
                                            CountingTcp>;
  static_assert(cohort::strategy::Strategy<Strategy>);
  const int port = cohort::testing::free_port();
  std::vector<std::string> parameters(2), errors(2);
  std::vector<std::thread> workers;
  for (int rank = 0; rank < 2; ++rank) {
    workers.emplace_back([&, rank] {
      try {
        cohort::Trainer trainer(cohort::testing::small_model(),
                                Strategy({.cluster = {.rank = rank,
                                                      .size = 2,
                                                      .master_address = "127.0.0.1",
                                                      .master_port = port,
                                                      .job_id = "counting"},
                                          .connect_timeout = 30s,
                                          .timeout = 10s}),
                                cohort::optimizer::Adam({.learning_rate = 3e-3}),
                                {.global_batch = 64,
                                 .micro_batches = 8,
                                 .seed = 11,
                                 .progress = cohort::Progress::kSilent});
        trainer.fit(cohort::testing::small_task_data(), {.steps = 20});
        parameters[static_cast<std::size_t>(rank)] =
            cohort::testing::bytes_of(cohort::testing::parameters_of(trainer.model()));
      } catch (const std::exception& error) {
        errors[static_cast<std::size_t>(rank)] = error.what();
      }
    });
  }
  for (auto& worker : workers) worker.join();
  CHECK(errors[0] == "");
  CHECK(errors[1] == "");
  CHECK(parameters[0] == mirrored_parameters(20, 2));
  CHECK(parameters[1] == parameters[0]);
  CHECK(CountingTcp::sent.load() > 0);
}

TEST_CASE(
    "the default bucket grows with the workers past 8, 32 KiB a worker, and with the "
    "gradient past 64 buckets") {
  using Strategy = cohort::strategy::MultiWorkerMirrored<>;
  using cohort::strategy::detail::BucketSize;
  constexpr std::size_t kUnbounded = std::numeric_limits<std::size_t>::max();
  CHECK(Strategy::default_bucket_bytes(2) == 256 * 1024);
  CHECK(Strategy::default_bucket_bytes(8) == 256 * 1024);
  CHECK(Strategy::default_bucket_bytes(10) == 320 * 1024);
  CHECK(Strategy::default_bucket_bytes(1024) == 32 * 1024 * 1024);
  // 10 workers of a job over TCP take it; a bucket set by the program stays.
  constexpr int kWorkers = 10;
  const int port = cohort::testing::free_port();
  const int set_port = cohort::testing::free_port();
  std::vector<BucketSize> buckets(kWorkers), set_buckets(kWorkers);
  std::vector<std::string> errors(kWorkers);
  std::vector<std::thread> workers;
  for (int rank = 0; rank < kWorkers; ++rank) {
    workers.emplace_back([&, rank] {
      const auto at = static_cast<std::size_t>(rank);
      try {
        Strategy::Options options{.cluster = {.rank = rank,
                                              .size = kWorkers,
                                              .master_address = "127.0.0.1",
                                              .master_port = port,
                                              .job_id = "buckets"},
                                  .connect_timeout = 60s,
                                  .timeout = 60s};
        options.shared_memory = false;
        buckets[at] = Strategy(options).bucket();
        options.cluster.master_port = set_port;
        options.cluster.job_id = "buckets set";
        options.bucket_bytes = 64 * 1024;
        set_buckets[at] = Strategy(options).bucket();
      } catch (const std::exception& error) {
        errors[at] = error.what();
      }
    });
  }
  for (auto& worker : workers) worker.join();
  for (int rank = 0; rank < kWorkers; ++rank) {
    CAPTURE(rank);
    const auto at = static_cast<std::size_t>(rank);
    CHECK(errors[at] == "");
    CHECK(buckets[at] == BucketSize{.bytes = 320 * 1024, .most = Strategy::kMostBuckets});
    CHECK(set_buckets[at] == BucketSize{.bytes = 64 * 1024, .most = kUnbounded});
  }
}
