// One process of the GPU multi-worker tests (multi_worker_test.cpp): trains the CUDA twin on the
// GPU at its local rank with MultiWorkerMirrored<device::Cuda>, or (ps) as a worker or server of
// ParameterServer<Sync, device::Cuda> (COHORT_ROLE says which); the chief writes the final
// parameters. --timeout-ms bounds every collective's wait (default 60000), --connect-timeout-ms
// the rendezvous and NCCL's set-up (default 30000); --local-replicas is MultiWorkerMirrored's GPUs
// per process (default 1). --check-current-gpu (ps): a worker checks, instead of training, that
// its replica's thread has the worker's GPU current when the replica starts, another GPU having
// been made current on that thread before (as by a program that used another GPU in between);
// it starts and ends one fit, which the server serves. Exits 1 when the GPU was not current.
// --elastic N: MultiWorkerMirrored's job goes on down to N workers (Options::elastic);
// --input-ms N: each micro-batch reaches its replica at most every N ms (example::PacedData), so
// that a fit lasts long enough to lose a worker in its middle on any GPU.
//   multi_worker_gpu_trainer STEPS OUT [ps] [--timeout-ms N] [--connect-timeout-ms N]
//                            [--local-replicas N] [--check-current-gpu] [--elastic N]
//                            [--input-ms N]
#include <chrono>
#include <cohort/strategy/multi_worker_mirrored_cuda.hpp>
#include <cohort/strategy/parameter_server_cuda.hpp>
#include <cstdio>
#include <string>
#include <vector>

#include "paced_data.hpp"
#include "twin_training.hpp"

namespace {

template <class Strategy>
int train(Strategy strategy, std::uint64_t steps, const char* out,
          std::chrono::milliseconds input_interval) {
  const bool chief = strategy.is_chief();
  auto trainer = cohort::test::make_twin_trainer<cohort::test::CudaTwin>(
      std::move(strategy), cohort::testing::test_optimizer<cohort::optimizer::Adam>());
  trainer.fit(example::PacedData(cohort::testing::small_task_data(), input_interval),
              {.steps = steps});
  if (chief) {
    cohort::testing::write_parameters(out, trainer.model().host_parameters());
  }
  return 0;
}

// See --check-current-gpu above.
template <class Strategy>
int check_current_gpu(Strategy& strategy) {
  const cohort::device::cuda::Place place = strategy.place(0);
  if (cohort::device::cuda::device_count() > 1)
    cohort::device::cuda::use(place.device == 0 ? 1 : 0);
  const std::size_t count = cohort::test::kTwinShape.parameters();
  int current = -1;
  strategy.run([&](auto& replica) {
    COHORT_CUDA_CHECK(cudaGetDevice(&current));
    cohort::device::cuda::Buffer<float> parameters(count, place);
    cohort::device::cuda::Buffer<float> state(cohort::optimizer::Adam::kStateSlots * count, place);
    replica.start(parameters.span(), state.span(), 0);
  });
  if (current != place.device) {
    std::fprintf(stderr,
                 "error: the replica's thread had GPU %d current, not the worker's GPU %d\n",
                 current, place.device);
    return 1;
  }
  std::fprintf(stderr, "the replica's thread had the worker's GPU %d current\n", current);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<std::string> arguments(argv + 1, argv + argc);
  bool parameter_server = false;
  bool check_gpu = false;
  std::chrono::milliseconds timeout = std::chrono::seconds(60);
  std::chrono::milliseconds connect_timeout = std::chrono::seconds(30);
  std::size_t local_replicas = 1;
  std::size_t min_workers = 0;
  std::chrono::milliseconds input_interval{0};
  std::vector<std::string> positional;
  for (std::size_t i = 0; i < arguments.size(); ++i) {
    if (arguments[i] == "ps") {
      parameter_server = true;
    } else if (arguments[i] == "--timeout-ms" && i + 1 < arguments.size()) {
      timeout = std::chrono::milliseconds(std::stoll(arguments[++i]));
    } else if (arguments[i] == "--connect-timeout-ms" && i + 1 < arguments.size()) {
      connect_timeout = std::chrono::milliseconds(std::stoll(arguments[++i]));
    } else if (arguments[i] == "--local-replicas" && i + 1 < arguments.size()) {
      local_replicas = std::stoul(arguments[++i]);
    } else if (arguments[i] == "--elastic" && i + 1 < arguments.size()) {
      min_workers = std::stoul(arguments[++i]);
    } else if (arguments[i] == "--input-ms" && i + 1 < arguments.size()) {
      input_interval = std::chrono::milliseconds(std::stoll(arguments[++i]));
    } else if (arguments[i] == "--check-current-gpu") {
      check_gpu = true;
    } else {
      positional.push_back(arguments[i]);
    }
  }
  if (positional.size() != 2) {
    std::fprintf(stderr,
                 "usage: multi_worker_gpu_trainer STEPS OUT [ps] [--timeout-ms N] "
                 "[--connect-timeout-ms N] [--local-replicas N] [--check-current-gpu] "
                 "[--elastic N] [--input-ms N]\n");
    return 64;
  }
  try {
    const std::uint64_t steps = std::stoull(positional[0]);
    const char* out = positional[1].c_str();
    if (parameter_server) {
      // Whole 4096-element norm blocks per shard: the test optimizer clips by the global norm.
      cohort::strategy::ParameterServer<cohort::strategy::consistency::Sync, cohort::device::Cuda>
          strategy({.connect_timeout = connect_timeout,
                    .timeout = timeout,
                    .min_shard_bytes = 0,
                    .alignment = 4096,
                    .chunk_bytes = 16 << 10});
      if (check_gpu && !strategy.serves()) return check_current_gpu(strategy);
      return train(std::move(strategy), steps, out, input_interval);
    }
    return train(cohort::strategy::MultiWorkerMirrored<cohort::device::Cuda>(
                     {.connect_timeout = connect_timeout,
                      .timeout = timeout,
                      .local_replicas = local_replicas,
                      .elastic = {.min_workers = min_workers}}),
                 steps, out, input_interval);
  } catch (const std::exception& error) {
    std::fprintf(stderr, "error: %s\n", error.what());
    return 1;
  }
}
