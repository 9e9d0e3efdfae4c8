// One worker of the multi-worker tests: trains the small test model with MultiWorkerMirrored and,
// on the chief, writes the final parameters.
//   multi_worker_trainer LOCAL_REPLICAS STEPS OUT [ring|deterministic [MICRO_BATCHES]]
// The model reports its gradient readiness per layer, and buckets are 64 bytes, so the buckets of
// a step are reduced while its backward pass goes on.
#include <chrono>
#include <cohort/collective/ring.hpp>
#include <cohort/strategy/multi_worker_mirrored.hpp>
#include <cstdio>
#include <string>

#include "training.hpp"

namespace {

template <template <class> class Cross>
int train(std::size_t local_replicas, std::uint64_t steps, const std::string& out,
          std::size_t micro_batches) {
  cohort::strategy::MultiWorkerMirrored<cohort::device::Cpu, Cross> strategy(
      {.local_replicas = local_replicas,
       .connect_timeout = std::chrono::seconds(30),
       .timeout = std::chrono::seconds(10),
       .bucket_bytes = 64});
  const bool chief = strategy.is_chief();
  cohort::Trainer trainer(cohort::testing::small_model(), std::move(strategy),
                          cohort::optimizer::Adam({.learning_rate = 3e-3}),
                          {.global_batch = 64,
                           .micro_batches = micro_batches,
                           .seed = 11,
                           .progress = cohort::Progress::kSilent});
  trainer.fit(cohort::testing::small_task_data(), {.steps = steps});
  if (chief) {
    cohort::testing::write_parameters(out, cohort::testing::parameters_of(trainer.model()));
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4 || argc > 6) {
    std::fprintf(stderr,
                 "usage: multi_worker_trainer LOCAL_REPLICAS STEPS OUT [ring|deterministic "
                 "[MICRO_BATCHES]]\n");
    return 64;
  }
  try {
    const std::size_t local_replicas = std::stoul(argv[1]);
    const std::uint64_t steps = std::stoull(argv[2]);
    const std::size_t micro_batches = argc == 6 ? std::stoul(argv[5]) : 8;
    return argc >= 5 && std::string(argv[4]) == "ring"
               ? train<cohort::collective::Ring>(local_replicas, steps, argv[3], micro_batches)
               : train<cohort::collective::Deterministic>(local_replicas, steps, argv[3],
                                                          micro_batches);
  } catch (const std::exception& error) {
    std::fprintf(stderr, "error: %s\n", error.what());
    return 1;
  }
}
