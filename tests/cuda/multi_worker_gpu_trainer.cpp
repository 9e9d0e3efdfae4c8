// One worker process of the GPU multi-worker test (multi_worker_test.cpp): trains the CUDA twin
// with MultiWorkerMirrored<device::Cuda> on the GPU at its local rank and, on the chief, writes the
// final parameters.
//   multi_worker_gpu_trainer STEPS OUT
#include <chrono>
#include <cohort/strategy/multi_worker_mirrored_cuda.hpp>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "twin_training.hpp"

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: multi_worker_gpu_trainer STEPS OUT\n");
    return 64;
  }
  try {
    cohort::strategy::MultiWorkerMirrored<cohort::device::Cuda> strategy(
        {.connect_timeout = std::chrono::seconds(30), .timeout = std::chrono::seconds(60)});
    const bool chief = strategy.is_chief();
    auto trainer = cohort::test::make_twin_trainer<cohort::test::CudaTwin>(
        std::move(strategy), cohort::testing::test_optimizer<cohort::optimizer::Adam>());
    trainer.fit(cohort::testing::small_task_data(), {.steps = std::stoull(argv[1])});
    if (chief) {
      const std::vector<float> parameters = trainer.model().host_parameters();
      std::ofstream(argv[2], std::ios::binary)
          .write(reinterpret_cast<const char*>(parameters.data()),
                 static_cast<std::streamsize>(parameters.size() * sizeof(float)));
    }
    return 0;
  } catch (const std::exception& error) {
    std::fprintf(stderr, "error: %s\n", error.what());
    return 1;
  }
}
