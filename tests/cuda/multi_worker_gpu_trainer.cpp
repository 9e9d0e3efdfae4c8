// One process of the GPU multi-worker tests (multi_worker_test.cpp): trains the CUDA twin on the
// GPU at its local rank with MultiWorkerMirrored<device::Cuda>, or (ps) as a worker or server of
// ParameterServer<Sync, device::Cuda> (COHORT_ROLE says which); the chief writes the final
// parameters. --timeout-ms bounds every collective's wait (default 60000), --connect-timeout-ms
// the rendezvous and NCCL's set-up (default 30000); --local-replicas is MultiWorkerMirrored's GPUs
// per process (default 1).
//   multi_worker_gpu_trainer STEPS OUT [ps] [--timeout-ms N] [--connect-timeout-ms N]
//                            [--local-replicas N]
#include <chrono>
#include <cohort/strategy/multi_worker_mirrored_cuda.hpp>
#include <cohort/strategy/parameter_server_cuda.hpp>
#include <cstdio>
#include <string>
#include <vector>

#include "twin_training.hpp"

namespace {

template <class Strategy>
int train(Strategy strategy, std::uint64_t steps, const char* out) {
  const bool chief = strategy.is_chief();
  auto trainer = cohort::test::make_twin_trainer<cohort::test::CudaTwin>(
      std::move(strategy), cohort::testing::test_optimizer<cohort::optimizer::Adam>());
  trainer.fit(cohort::testing::small_task_data(), {.steps = steps});
  if (chief) {
    cohort::testing::write_parameters(out, trainer.model().host_parameters());
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<std::string> arguments(argv + 1, argv + argc);
  bool parameter_server = false;
  std::chrono::milliseconds timeout = std::chrono::seconds(60);
  std::chrono::milliseconds connect_timeout = std::chrono::seconds(30);
  std::size_t local_replicas = 1;
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
    } else {
      positional.push_back(arguments[i]);
    }
  }
  if (positional.size() != 2) {
    std::fprintf(stderr,
                 "usage: multi_worker_gpu_trainer STEPS OUT [ps] [--timeout-ms N] "
                 "[--connect-timeout-ms N] [--local-replicas N]\n");
    return 64;
  }
  try {
    const std::uint64_t steps = std::stoull(positional[0]);
    const char* out = positional[1].c_str();
    if (parameter_server) {
      // Whole 4096-element norm blocks per shard: the test optimizer clips by the global norm.
      return train(cohort::strategy::ParameterServer<cohort::strategy::consistency::Sync,
                                                     cohort::device::Cuda>(
                       {.connect_timeout = connect_timeout,
                        .timeout = timeout,
                        .min_shard_bytes = 0,
                        .alignment = 4096,
                        .chunk_bytes = 16 << 10}),
                   steps, out);
    }
    return train(cohort::strategy::MultiWorkerMirrored<cohort::device::Cuda>(
                     {.connect_timeout = connect_timeout,
                      .timeout = timeout,
                      .local_replicas = local_replicas}),
                 steps, out);
  } catch (const std::exception& error) {
    std::fprintf(stderr, "error: %s\n", error.what());
    return 1;
  }
}
