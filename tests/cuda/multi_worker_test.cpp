// MultiWorkerMirrored<device::Cuda> and ParameterServer<Sync, device::Cuda>: one GPU per worker
// process, real processes over 127.0.0.1 (started by hand with COHORT_* variables, as a launcher
// would), against Mirrored on as many GPUs of one process and against Mirrored<> on the CPU.
#include <doctest/doctest.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
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
using cohort::testing::bytes_of;
using cohort::testing::Process;
using cohort::testing::read_file;
using cohort::testing::TemporaryDirectory;

constexpr std::uint64_t kSteps = 30;

// The reference: Mirrored on 2 GPUs of this process, which must equal Mirrored<> on the CPU.
std::string mirrored_on_two_gpus() {
  const auto& data = cohort::testing::small_task_data();
  auto gpus = cohort::test::make_twin_trainer<cohort::test::CudaTwin>(
      cohort::strategy::Mirrored<cohort::device::Cuda, cohort::collective::Nccl>({.replicas = 2}),
      cohort::testing::test_optimizer<cohort::optimizer::Adam>());
  gpus.fit(data, {.steps = kSteps});
  const std::string expected = bytes_of(gpus.model().host_parameters());
  auto cpu = cohort::test::make_twin_trainer<cohort::test::CpuTwin>(
      cohort::strategy::Mirrored<>({.replicas = 2}),
      cohort::testing::test_optimizer<cohort::optimizer::Adam>());
  cpu.fit(data, {.steps = kSteps});
  REQUIRE(bytes_of(cpu.model().host_parameters()) == expected);
  return expected;
}

// Two GPU worker processes of multi_worker_gpu_trainer (and, with servers > 0, that many
// parameter servers of ParameterServer<Sync, device::Cuda>), started by hand with COHORT_*
// variables as a launcher would; returns the chief's parameters.
std::string train_two_gpu_workers(int servers) {
  TemporaryDirectory directory("cohort-cuda-multi-worker");
  const fs::path out = directory.path / "parameters.bin";
  const std::string port = std::to_string(cohort::testing::free_port());
  std::vector<std::string> arguments = {COHORT_GPU_TRAINER, std::to_string(kSteps), out.string()};
  if (servers > 0) arguments.push_back("ps");
  std::vector<std::unique_ptr<Process>> processes;
  std::vector<fs::path> logs;
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
    logs.push_back(directory.path / (role + std::to_string(rank) + ".log"));
    processes.push_back(std::make_unique<Process>(arguments, env, logs.back()));
  };
  for (int rank = 0; rank < 2; ++rank) start("worker", rank, 2);
  for (int rank = 0; rank < servers; ++rank) start("ps", rank, servers);
  for (std::size_t i = 0; i < processes.size(); ++i) {
    CAPTURE(i);
    const auto exit = processes[i]->wait(std::chrono::seconds(180));
    const std::string log = read_file(logs[i]);
    CAPTURE(log);
    REQUIRE(exit.has_value());
    CHECK(exit->exited);
    CHECK(exit->code == 0);
    if (i < 2) CHECK(log.find("GPU " + std::to_string(i)) != std::string::npos);  // local rank
  }
  return read_file(out);
}

}  // namespace

TEST_CASE(
    "MultiWorkerMirrored on 2 processes with a GPU each gives the bits of Mirrored on 2 GPUs" *
    cohort::test::gpus_only(2)) {
  const std::string expected = mirrored_on_two_gpus();
  CHECK(train_two_gpu_workers(0) == expected);
}

TEST_CASE(
    "ParameterServer<Sync> with 2 GPU workers and a server on the host gives the bits of Mirrored "
    "on 2 GPUs" *
    cohort::test::gpus_only(2)) {
  const std::string expected = mirrored_on_two_gpus();
  CHECK(train_two_gpu_workers(1) == expected);
}

TEST_CASE(
    "MultiWorkerMirrored<device::Cuda> without a GPU at local_rank is a ConfigError naming "
    "local_rank") {
  const int visible = cohort::device::cuda::device_count();
  const std::string message = cohort::testing::config_error_message([&] {
    cohort::strategy::MultiWorkerMirrored<cohort::device::Cuda>(
        {.cluster = {.rank = 0, .size = 1, .local_rank = visible, .local_size = visible + 1}});
  });
  CAPTURE(message);
  CHECK(cohort::testing::contains(message, "local_rank = " + std::to_string(visible)));
  CHECK(cohort::testing::contains(message, "has no GPU"));
}
