// One process of the GPU multi-worker tests (multi_worker_test.cpp): trains the CUDA twin on the
// GPU at its local rank with MultiWorkerMirrored<device::Cuda>, or (ps) as a worker or server of
// ParameterServer<Sync, device::Cuda> (COHORT_ROLE says which); the chief writes the final
// parameters.
//   multi_worker_gpu_trainer STEPS OUT [ps]
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
  const bool parameter_server = argc == 4 && std::string(argv[3]) == "ps";
  if (argc != 3 && !parameter_server) {
    std::fprintf(stderr, "usage: multi_worker_gpu_trainer STEPS OUT [ps]\n");
    return 64;
  }
  try {
    const std::uint64_t steps = std::stoull(argv[1]);
    if (parameter_server) {
      return train(cohort::strategy::ParameterServer<cohort::strategy::consistency::Sync,
                                                     cohort::device::Cuda>(
                       {.connect_timeout = std::chrono::seconds(30),
                        .timeout = std::chrono::seconds(60),
                        .min_shard_bytes = 0,
                        .alignment = 16,
                        .chunk_bytes = 256}),
                   steps, argv[2]);
    }
    return train(
        cohort::strategy::MultiWorkerMirrored<cohort::device::Cuda>(
            {.connect_timeout = std::chrono::seconds(30), .timeout = std::chrono::seconds(60)}),
        steps, argv[2]);
  } catch (const std::exception& error) {
    std::fprintf(stderr, "error: %s\n", error.what());
    return 1;
  }
}
