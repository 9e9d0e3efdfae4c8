// NcclCommunicator, MultiWorkerMirrored<device::Cuda> and ParameterServer<Sync, device::Cuda>
// across processes: one GPU per worker process, real processes over 127.0.0.1 (started by hand
// with COHORT_* variables, as a launcher would), the strategies against Mirrored<> on the CPU
// with as many replicas.
//
// Two workers need two GPUs only if they share a host. On a machine with one GPU each worker is
// a host of its own holding that GPU (local rank 0 of 1), and NCCL_HOSTID tells NCCL so: NCCL then
// carries their traffic over its socket transport on loopback, as between two hosts, instead of
// refusing two ranks on one GPU.
#include <doctest/doctest.h>
#include <signal.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "cohort/strategy/mirrored_cuda.hpp"
#include "cohort/strategy/multi_worker_mirrored_cuda.hpp"
#include "cohort/strategy/parameter_server_cuda.hpp"
#include "error_message.hpp"
#include "gpu.hpp"
#include "processes.hpp"
#include "twin_training.hpp"

namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using cohort::testing::bytes_of;
using cohort::testing::Process;
using cohort::testing::read_file;
using cohort::testing::TemporaryDirectory;

constexpr std::uint64_t kSteps = 30;

// The reference: Mirrored<> on the CPU with as many replicas (which Mirrored on as many GPUs
// equals: mirrored_test.cpp), after `steps`.
std::string mirrored_on_the_cpu(std::size_t replicas, std::uint64_t steps = kSteps) {
  auto cpu = cohort::test::make_twin_trainer<cohort::test::CpuTwin>(
      cohort::strategy::Mirrored<>({.replicas = replicas}),
      cohort::testing::test_optimizer<cohort::optimizer::Adam>());
  cpu.fit(cohort::testing::small_task_data(), {.steps = steps});
  return bytes_of(cpu.model().host_parameters());
}

// Two GPU worker processes of `command` (and, with servers > 0, that many parameter servers of
// ParameterServer<Sync, device::Cuda>), started by hand with COHORT_* variables as a launcher
// would; each worker drives gpus_per_worker GPUs.
class GpuJob {
 public:
  GpuJob(std::vector<std::string> command, int servers, int gpus_per_worker = 1)
      : directory_("cohort-cuda-multi-worker"),
        shared_gpu_(cohort::device::cuda::device_count() < 2),
        gpus_per_worker_(gpus_per_worker) {
    const std::string port = std::to_string(cohort::testing::free_port());
    if (servers > 0) command.push_back("ps");
    const auto start = [&](const std::string& role, int rank, int size) {
      std::map<std::string, std::string> env = {{"COHORT_RANK", std::to_string(rank)},
                                                {"COHORT_WORLD_SIZE", std::to_string(size)},
                                                {"COHORT_MASTER_ADDR", "127.0.0.1"},
                                                {"COHORT_MASTER_PORT", port},
                                                {"COHORT_JOB_ID", "cuda-multi-worker-test"}};
      if (servers > 0) {
        env["COHORT_ROLE"] = role;
        env[role == "ps" ? "COHORT_WORKER_COUNT" : "COHORT_PS_COUNT"] =
            std::to_string(role == "ps" ? 2 : servers);
      }
      if (role == "worker" && shared_gpu_) {
        env["COHORT_LOCAL_RANK"] = "0";
        env["COHORT_LOCAL_WORLD_SIZE"] = "1";
        env["NCCL_HOSTID"] = "cohort-test-host-" + std::to_string(rank);
        env["NCCL_SOCKET_IFNAME"] = "lo";
        env["NCCL_NET"] = "Socket";  // not an InfiniBand port whose fabric may be unreachable
      }
      logs_.push_back(directory_.path / (role + std::to_string(rank) + ".log"));
      processes_.push_back(std::make_unique<Process>(command, env, logs_.back()));
    };
    for (int rank = 0; rank < 2; ++rank) start("worker", rank, 2);
    for (int rank = 0; rank < servers; ++rank) start("ps", rank, servers);
  }

  const fs::path& directory() const { return directory_.path; }
  Process& process(std::size_t i) { return *processes_[i]; }
  std::string log(std::size_t i) const { return read_file(logs_[i]); }

  // Waits for every process to exit 0 with worker i on its GPUs (GPU 0 when they share one).
  void require_success() {
    for (std::size_t i = 0; i < processes_.size(); ++i) {
      CAPTURE(i);
      const auto exit = processes_[i]->wait(100s);
      const std::string text = log(i);
      CAPTURE(text);
      REQUIRE(exit.has_value());
      CHECK(exit->exited);
      CHECK(exit->code == 0);
      if (i < 2) CHECK(text.find(gpus_of(static_cast<int>(i))) != std::string::npos);
    }
  }

 private:
  // How worker `worker` names its GPUs in its log.
  std::string gpus_of(int worker) const {
    if (shared_gpu_) return "GPU 0";
    const int first = worker * gpus_per_worker_;
    if (gpus_per_worker_ == 1) return "GPU " + std::to_string(first);
    return "GPUs " + std::to_string(first) + " to " + std::to_string(first + gpus_per_worker_ - 1);
  }

  TemporaryDirectory directory_;
  bool shared_gpu_;
  int gpus_per_worker_;
  std::vector<fs::path> logs_;
  std::vector<std::unique_ptr<Process>> processes_;
};

// The chief's parameters after kSteps with 2 GPU workers of gpus_per_worker GPUs (and `servers`
// parameter servers).
std::string train_two_gpu_workers(int servers, int gpus_per_worker = 1) {
  TemporaryDirectory out("cohort-cuda-multi-worker-out");
  const fs::path parameters = out.path / "parameters.bin";
  GpuJob job({COHORT_GPU_TRAINER, std::to_string(kSteps), parameters.string(), "--local-replicas",
              std::to_string(gpus_per_worker)},
             servers, gpus_per_worker);
  job.require_success();
  return read_file(parameters);
}

// Once both workers of `job` have their GPUs, `settle` more; then both must still run.
void wait_until_training(GpuJob& job, std::chrono::milliseconds settle) {
  const auto announced = [&](std::size_t i) {
    return job.log(i).find("GPU ") != std::string::npos;
  };
  const auto deadline = std::chrono::steady_clock::now() + 60s;
  while (!(announced(0) && announced(1)) && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(100ms);
  }
  std::this_thread::sleep_for(settle);
  for (std::size_t i = 0; i < 2; ++i) {
    CAPTURE(job.log(i));
    REQUIRE_FALSE(job.process(i).wait(0ms).has_value());  // training under way
  }
}

}  // namespace

TEST_CASE(
    "NCCL collectives and point-to-point between 2 processes with a GPU each give exact results" *
    cohort::test::gpu_only()) {
  GpuJob job({COHORT_NCCL_PROCESS}, 0);
  job.require_success();
}

TEST_CASE(
    "MultiWorkerMirrored on 2 processes with a GPU each gives the bits of Mirrored<> on 2 CPU "
    "threads" *
    cohort::test::gpu_only()) {
  CHECK(train_two_gpu_workers(0) == mirrored_on_the_cpu(2));
}

TEST_CASE(
    "MultiWorkerMirrored on 2 processes with 2 GPUs each gives the bits of Mirrored<> on 4 CPU "
    "threads" *
    cohort::test::gpus_only(4)) {
  CHECK(train_two_gpu_workers(0, 2) == mirrored_on_the_cpu(4));
}

TEST_CASE(
    "MultiWorkerMirrored in one process with 2 GPUs gives the bits of Mirrored<> on 2 CPU threads" *
    cohort::test::gpus_only(2)) {
  auto trainer = cohort::test::make_twin_trainer<cohort::test::CudaTwin>(
      cohort::strategy::MultiWorkerMirrored<cohort::device::Cuda>(
          {.cluster = {.rank = 0, .size = 1, .master_port = cohort::testing::free_port()},
           .timeout = cohort::test::kTestTimeout,
           .local_replicas = 2}),
      cohort::testing::test_optimizer<cohort::optimizer::Adam>());
  trainer.fit(cohort::testing::small_task_data(), {.steps = kSteps});
  CHECK(bytes_of(trainer.model().host_parameters()) == mirrored_on_the_cpu(2));
}

TEST_CASE(
    "ParameterServer<Sync> with 2 GPU workers and a server on the host gives the bits of "
    "Mirrored<> on 2 CPU threads" *
    cohort::test::gpu_only()) {
  CHECK(train_two_gpu_workers(1) == mirrored_on_the_cpu(2));
}

TEST_CASE(
    "ParameterServer with 2 GPU workers makes each worker's GPU current on its replica's thread" *
    cohort::test::gpus_only(2)) {
  // Each worker first makes another GPU current on the thread that runs its replica.
  GpuJob job(
      {COHORT_GPU_TRAINER, "1", (fs::temp_directory_path() / "cohort-never-written.bin").string(),
       "--check-current-gpu"},
      1);
  job.require_success();
  for (std::size_t worker = 0; worker < 2; ++worker) {
    CHECK(job.log(worker).find("the replica's thread had the worker's GPU " +
                               std::to_string(worker) + " current") != std::string::npos);
  }
}

TEST_CASE(
    "a stalled GPU worker makes the other fail within its timeout naming the rank, the operation "
    "and its sequence number" *
    cohort::test::gpu_only()) {
  GpuJob job({COHORT_GPU_TRAINER, "1000000",
              (fs::temp_directory_path() / "cohort-never-written.bin").string(), "--timeout-ms",
              "10000", "--connect-timeout-ms", "10000"},
             0);
  // Give the rendezvous and NCCL's set-up time to finish too (they run under a 10 s timeout as
  // well, so that whichever wait the stall catches names 10000 ms).
  wait_until_training(job, 5s);
  job.process(1).kill(SIGSTOP);
  const auto exit = job.process(0).wait(40s);
  const std::string log = job.log(0);
  CAPTURE(log);
  REQUIRE(exit.has_value());
  CHECK(exit->exited);
  CHECK(exit->code != 0);
  CHECK(log.find("rank 0: ") != std::string::npos);
  CHECK(log.find(" #") != std::string::npos);  // the operation's sequence number
  CHECK(log.find("timed out after 10000 ms") != std::string::npos);
  job.process(1).kill(SIGKILL);
}

TEST_CASE(
    "elastic GPU workers: of 2, one SIGKILLed mid-fit; the other goes on at once without it and "
    "ends with the bits of Mirrored<> on 2 CPU threads" *
    cohort::test::gpu_only()) {
  // Each micro-batch at most every 20 ms: a fit of at least 6 s on any GPU.
  constexpr std::uint64_t kElasticSteps = 300;
  TemporaryDirectory out("cohort-cuda-elastic-out");
  const fs::path parameters = out.path / "parameters.bin";
  // A collective's timeout far beyond the wait below: only the watch over the TCP mesh ends the
  // survivor's NCCL wait in time.
  GpuJob job({COHORT_GPU_TRAINER, std::to_string(kElasticSteps), parameters.string(), "--elastic",
              "1", "--input-ms", "20", "--timeout-ms", "600000"},
             0);
  wait_until_training(job, 2s);
  job.process(1).kill(SIGKILL);
  const auto exit = job.process(0).wait(120s);
  const std::string log = job.log(0);
  CAPTURE(log);
  REQUIRE(exit.has_value());
  CHECK(exit->exited);
  CHECK(exit->code == 0);
  CHECK(log.find("workers 2 -> 1 at step") != std::string::npos);
  CHECK(log.find("rank 1 lost") != std::string::npos);
  CHECK(read_file(parameters) == mirrored_on_the_cpu(2, kElasticSteps));
}

TEST_CASE(
    "MultiWorkerMirrored<device::Cuda> with more local_replicas than GPUs is a ConfigError naming "
    "local_rank and the GPUs it sees") {
  const int visible = cohort::device::cuda::device_count();
  const std::string message = cohort::testing::config_error_message([&] {
    cohort::strategy::MultiWorkerMirrored<cohort::device::Cuda>(
        {.cluster = {.rank = 0, .size = 1},
         .local_replicas = static_cast<std::size_t>(visible) + 2});
  });
  CAPTURE(message);
  CHECK(cohort::testing::contains(message, "local_rank = 0"));
  CHECK(cohort::testing::contains(message, "has no GPU"));
  CHECK(cohort::testing::contains(message, std::to_string(visible + 2) + " GPUs (local_replicas)"));
}

TEST_CASE(
    "MultiWorkerMirrored<device::Cuda> with more than 64 GPUs in all is a ConfigError naming "
    "local_replicas") {
  const std::string message = cohort::testing::config_error_message([&] {
    cohort::strategy::MultiWorkerMirrored<cohort::device::Cuda>(
        {.cluster = {.rank = 0, .size = 9}, .local_replicas = 8});
  });
  CAPTURE(message);
  CHECK(cohort::testing::contains(message, "local_replicas = 8"));
  CHECK(cohort::testing::contains(message, "72 GPUs in all"));
}

TEST_CASE(
    "MultiWorkerMirrored<device::Cuda> without a GPU at local_rank is a ConfigError naming "
    "local_rank") {
  const int visible = cohort::device::cuda::device_count();
  const std::string message = cohort::testing::config_error_message([&] {
    cohort::strategy::MultiWorkerMirrored<cohort::device::Cuda>(
        {.cluster = {
             .rank = 0, .size = visible + 1, .local_rank = visible, .local_size = visible + 1}});
  });
  CAPTURE(message);
  CHECK(cohort::testing::contains(message, "local_rank = " + std::to_string(visible)));
  CHECK(cohort::testing::contains(message, "has no GPU"));
}
