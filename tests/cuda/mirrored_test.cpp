// Mirrored<device::Cuda, collective::Nccl> and the device-generic Trainer step against Mirrored<>
// on the CPU, with the twin models (twin_model.hpp): the same seed gives the same parameter and
// loss bits, on 1, 2 and 4 GPUs, and across save and restore. Cases that need GPUs are skipped by
// name where there are none (or too few); the ConfigError cases need only the count and run
// everywhere.
#include <doctest/doctest.h>
#include <unistd.h>

#include <chrono>
#include <cohort/cohort.hpp>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "cohort/strategy/mirrored_cuda.hpp"
#include "error_message.hpp"
#include "gpu.hpp"
#include "twin_training.hpp"

namespace {

namespace fs = std::filesystem;
using cohort::test::CpuTwin;
using cohort::test::CudaTwin;
using cohort::test::gpu_only;
using cohort::test::gpus_only;
using cohort::test::kTestTimeout;
using cohort::test::same_bits;
using GpuMirrored = cohort::strategy::Mirrored<cohort::device::Cuda, cohort::collective::Nccl>;

constexpr cohort::test::twin::Shape kShape = cohort::test::kTwinShape;
constexpr std::uint64_t kModelSeed = cohort::test::kTwinSeed;
constexpr std::uint64_t kMirroredSteps = 30;

template <class Optimizer, class Model, class Strategy>
auto make_trainer(Strategy strategy) {
  return cohort::test::make_twin_trainer<Model>(std::move(strategy),
                                                cohort::testing::test_optimizer<Optimizer>());
}

struct Run {
  std::vector<float> parameters;
  std::vector<double> loss;
};

template <class Optimizer>
Run on_cpu(std::size_t replicas, std::uint64_t steps = kMirroredSteps) {
  auto trainer =
      make_trainer<Optimizer, CpuTwin>(cohort::strategy::Mirrored<>({.replicas = replicas}));
  const cohort::Report report = trainer.fit(cohort::testing::small_task_data(), {.steps = steps});
  return {trainer.model().host_parameters(), report.loss};
}

template <class Optimizer>
Run on_gpus(std::size_t gpus, std::uint64_t steps = kMirroredSteps) {
  auto trainer =
      make_trainer<Optimizer, CudaTwin>(GpuMirrored({.replicas = gpus, .timeout = kTestTimeout}));
  const cohort::Report report = trainer.fit(cohort::testing::small_task_data(), {.steps = steps});
  return {trainer.model().host_parameters(), report.loss};
}

// The CPU reference on 1 replica (itself the bits of 2, 4 and 8: tests/strategy) against the GPUs.
template <class Optimizer>
void check_gpus_equal_cpu(std::size_t gpus) {
  CAPTURE(gpus);
  const Run cpu = on_cpu<Optimizer>(1);
  REQUIRE(cpu.loss.size() == kMirroredSteps);
  CHECK(cpu.loss.back() < cpu.loss.front());  // it trains
  CHECK_FALSE(same_bits(cpu.parameters, cohort::test::twin_initial_parameters(kShape, kModelSeed)));
  const Run gpu = on_gpus<Optimizer>(gpus);
  CHECK(same_bits(gpu.parameters, cpu.parameters));
  CHECK(same_bits(gpu.loss, cpu.loss));
}

void check_every_optimizer(std::size_t gpus) {
  SUBCASE("sgd") { check_gpus_equal_cpu<cohort::optimizer::Sgd>(gpus); }
  SUBCASE("momentum") { check_gpus_equal_cpu<cohort::optimizer::Momentum>(gpus); }
  SUBCASE("adam with clipping") { check_gpus_equal_cpu<cohort::optimizer::Adam>(gpus); }
  SUBCASE("adamw") { check_gpus_equal_cpu<cohort::optimizer::AdamW>(gpus); }
}

}  // namespace

// The twins themselves, one forward_backward: the premise of every comparison here.
TEST_CASE("the CUDA twin's forward_backward gives its CPU twin's gradient and loss bits" *
          gpu_only()) {
  CpuTwin cpu(kShape, kModelSeed);
  cohort::device::cuda::Stream stream(0);
  CudaTwin gpu = CudaTwin::replicate(CudaTwin(kShape, kModelSeed), stream.place());
  std::vector<std::size_t> indices(37);
  for (std::size_t i = 0; i < indices.size(); ++i) indices[i] = 3 * i;
  const example::Batch batch = cohort::testing::small_task_data().batch(indices);
  const double cpu_loss = cpu.forward_backward(batch);
  const double gpu_loss = gpu.forward_backward(batch);
  CHECK(std::memcmp(&cpu_loss, &gpu_loss, sizeof(double)) == 0);
  const auto cpu_gradients = cpu.gradients();
  std::vector<float> gpu_gradients(cpu_gradients.size());
  cohort::device::Cuda::to_host(stream.place(), gpu.gradients(), std::span<float>(gpu_gradients));
  CHECK(same_bits(gpu_gradients, {cpu_gradients.begin(), cpu_gradients.end()}));
}

TEST_CASE("Mirrored on 1 GPU gives the parameter and loss bits of Mirrored on the CPU" *
          gpu_only()) {
  check_every_optimizer(1);
}

TEST_CASE("Mirrored on 2 GPUs gives the parameter and loss bits of Mirrored on the CPU" *
          gpus_only(2)) {
  check_every_optimizer(2);
}

TEST_CASE("Mirrored on 4 GPUs gives the parameter and loss bits of Mirrored on the CPU" *
          gpus_only(4)) {
  check_every_optimizer(4);
}

TEST_CASE("Mirrored on every visible GPU by default gives the bits of 1 GPU" * gpu_only()) {
  const int visible = cohort::device::cuda::device_count();
  if ((visible & (visible - 1)) != 0 || visible > 8) {
    MESSAGE("8 micro-batches do not split over " << visible << " GPUs: nothing to compare");
    return;
  }
  auto trainer =
      make_trainer<cohort::optimizer::Adam, CudaTwin>(GpuMirrored({.timeout = kTestTimeout}));
  CHECK(trainer.strategy().replicas() == static_cast<std::size_t>(visible));
  trainer.fit(cohort::testing::small_task_data(), {.steps = 10});
  CHECK(same_bits(trainer.model().host_parameters(),
                  on_gpus<cohort::optimizer::Adam>(1, 10).parameters));
}

TEST_CASE("a placed replica's parameters and gradients are device memory of its own GPU" *
          gpu_only()) {
  const GpuMirrored strategy({});
  const CudaTwin prototype(kShape, kModelSeed);
  for (std::size_t r = 0; r < strategy.local_replicas(); ++r) {
    CAPTURE(r);
    const cohort::device::cuda::Place place = strategy.place(r);
    CHECK(place.device == static_cast<int>(r));
    CHECK(place.stream != nullptr);
    CudaTwin replica = cohort::replicate(prototype, place);
    for (const std::span<float> memory : {cohort::ModelTraits<CudaTwin>::parameters(replica),
                                          cohort::ModelTraits<CudaTwin>::gradients(replica)}) {
      cudaPointerAttributes attributes{};
      COHORT_CUDA_CHECK(cudaPointerGetAttributes(&attributes, memory.data()));
      CHECK(attributes.type == cudaMemoryTypeDevice);
      CHECK(attributes.device == static_cast<int>(r));
    }
    CHECK(same_bits(replica.host_parameters(),
                    cohort::test::twin_initial_parameters(kShape, kModelSeed)));
  }
}

TEST_CASE("the Trainer's replica on the GPU holds device parameters" * gpu_only()) {
  auto trainer = make_trainer<cohort::optimizer::Sgd, CudaTwin>(
      GpuMirrored({.replicas = 1, .timeout = kTestTimeout}));
  CudaTwin model = trainer.model();  // a copy: on the same GPU
  cudaPointerAttributes attributes{};
  COHORT_CUDA_CHECK(cudaPointerGetAttributes(
      &attributes, cohort::ModelTraits<CudaTwin>::parameters(model).data()));
  CHECK(attributes.type == cudaMemoryTypeDevice);
  CHECK(attributes.device == 0);
}

TEST_CASE("save on the GPU and restore continue with the bits of an uninterrupted run" *
          gpu_only()) {
  const fs::path directory =
      fs::temp_directory_path() / ("cohort-cuda-checkpoint-" + std::to_string(::getpid()));
  fs::create_directories(directory);
  const fs::path gpu_file = directory / "gpu.ckpt";
  const fs::path cpu_file = directory / "cpu.ckpt";
  const auto& data = cohort::testing::small_task_data();
  using Adam = cohort::optimizer::Adam;

  const std::vector<float> uninterrupted = on_cpu<Adam>(1, 2 * kMirroredSteps).parameters;

  auto first = make_trainer<Adam, CudaTwin>(GpuMirrored({.replicas = 1, .timeout = kTestTimeout}));
  first.fit(data, {.steps = kMirroredSteps});
  first.save(gpu_file);
  auto cpu_first = make_trainer<Adam, CpuTwin>(cohort::strategy::Mirrored<>({.replicas = 1}));
  cpu_first.fit(data, {.steps = kMirroredSteps});
  cpu_first.save(cpu_file);

  SUBCASE("a GPU checkpoint continues on the GPU") {
    auto resumed =
        make_trainer<Adam, CudaTwin>(GpuMirrored({.replicas = 1, .timeout = kTestTimeout}));
    resumed.restore(gpu_file);
    resumed.fit(data, {.steps = 2 * kMirroredSteps});
    CHECK(same_bits(resumed.model().host_parameters(), uninterrupted));
  }
  SUBCASE("a CPU checkpoint continues on the GPU, and a GPU checkpoint on the CPU") {
    auto on_gpu =
        make_trainer<Adam, CudaTwin>(GpuMirrored({.replicas = 1, .timeout = kTestTimeout}));
    on_gpu.restore(cpu_file);
    on_gpu.fit(data, {.steps = 2 * kMirroredSteps});
    CHECK(same_bits(on_gpu.model().host_parameters(), uninterrupted));
    auto on_cpu_again = make_trainer<Adam, CpuTwin>(cohort::strategy::Mirrored<>({.replicas = 1}));
    on_cpu_again.restore(gpu_file);
    on_cpu_again.fit(data, {.steps = 2 * kMirroredSteps});
    CHECK(same_bits(on_cpu_again.model().host_parameters(), uninterrupted));
  }
  fs::remove_all(directory);
}

TEST_CASE("Mirrored on more GPUs than are visible is a ConfigError naming replicas") {
  const int visible = cohort::device::cuda::device_count();
  const std::string message = cohort::testing::config_error_message(
      [&] { GpuMirrored({.replicas = static_cast<std::size_t>(visible) + 1}); });
  CAPTURE(message);
  CHECK(cohort::testing::contains(message, "replicas"));
  if (visible == 0) {
    // Without a GPU the message says why there is none.
    CHECK(cohort::testing::contains(message, cohort::device::cuda::unavailable()));
  } else {
    CHECK(cohort::testing::contains(message, "sees " + std::to_string(visible)));
  }
}

TEST_CASE("Mirrored on every visible GPU is a ConfigError naming replicas where there is none") {
  if (cohort::device::cuda::device_count() > 0) {
    CHECK_NOTHROW(GpuMirrored({}));
    return;
  }
  const std::string message = cohort::testing::config_error_message([] { GpuMirrored({}); });
  CAPTURE(message);
  CHECK(cohort::testing::contains(message, "replicas"));
  CHECK(cohort::testing::contains(message, "none"));
}

namespace {

// The small task, with one example that cannot be read.
struct UnreadableExample {
  std::size_t size() const { return cohort::testing::small_task_data().size(); }
  example::Batch batch(std::span<const std::size_t> indices) const {
    for (std::size_t index : indices) {
      if (index == 5) throw std::runtime_error("example 5 is unreadable");
    }
    return cohort::testing::small_task_data().batch(indices);
  }
};

}  // namespace

TEST_CASE("on 2 GPUs a replica that throws releases the other at once and fit rethrows its error" *
          gpus_only(2)) {
  auto trainer = make_trainer<cohort::optimizer::Sgd, CudaTwin>(
      GpuMirrored({.replicas = 2, .timeout = kTestTimeout}));
  const auto start = std::chrono::steady_clock::now();
  CHECK_THROWS_WITH_AS(trainer.fit(UnreadableExample{}, {.epochs = 1}), "example 5 is unreadable",
                       std::runtime_error);
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(60));  // not the timeout
}

TEST_CASE(
    "on 2 GPUs a replica that throws after the last collective releases the other's teardown at "
    "once" *
    gpus_only(2)) {
  using namespace std::chrono_literals;
  GpuMirrored strategy({.replicas = 2, .timeout = 30s});
  const auto start = std::chrono::steady_clock::now();
  // Replica 0 returns and ends its communicator (NCCL's finalize waits for every rank); replica 1
  // fails meanwhile, and never finalizes.
  CHECK_THROWS_WITH_AS(strategy.run([&](GpuMirrored::Replica& replica) {
    cohort::device::cuda::Buffer<float> values(4099, replica.place());
    replica.communicator().all_reduce(values.span(), cohort::ReduceOp::kSum);
    if (replica.index() == 1) {
      std::this_thread::sleep_for(500ms);
      throw std::runtime_error("replica 1 failed after the last collective");
    }
  }),
                       "replica 1 failed after the last collective", std::runtime_error);
  CHECK(std::chrono::steady_clock::now() - start < 15s);  // not the 30 s timeout
}
