// One worker of the multi-worker tests: trains a small test model with MultiWorkerMirrored and,
// on the chief, writes the final parameters.
//   multi_worker_trainer LOCAL_REPLICAS STEPS OUT [ring] [--eigen THREADS] [--micro-batches M]
//
// ring             the ring all-reduce across processes instead of the deterministic one
// --eigen THREADS  the examples' Eigen MLP on THREADS threads per replica (eigen_training.hpp)
//                  instead of the plain-loop Mlp
// --micro-batches  micro-batches per global batch (default 8)
// Both models report their gradient readiness per layer, and buckets are 64 bytes, so the buckets
// of a step are reduced across processes while its backward pass goes on.
#include <chrono>
#include <cohort/collective/ring.hpp>
#include <cohort/strategy/multi_worker_mirrored.hpp>
#include <cstdio>
#include <string>

#include "eigen_training.hpp"

namespace {

struct Settings {
  std::size_t local_replicas = 1;
  std::uint64_t steps = 0;
  std::string out;
  bool ring = false;
  std::size_t eigen_threads = 0;  // 0: the plain-loop Mlp
  std::size_t micro_batches = 8;
};

template <template <class> class Cross, class Model>
int train(const Settings& settings, const Model& model) {
  cohort::strategy::MultiWorkerMirrored<cohort::device::Cpu, Cross> strategy(
      {.local_replicas = settings.local_replicas,
       .connect_timeout = std::chrono::seconds(30),
       .timeout = std::chrono::seconds(10),
       .bucket_bytes = 64});
  const bool chief = strategy.is_chief();
  cohort::Trainer trainer(model, std::move(strategy),
                          cohort::optimizer::Adam({.learning_rate = 3e-3}),
                          {.global_batch = 64,
                           .micro_batches = settings.micro_batches,
                           .seed = 11,
                           .progress = cohort::Progress::kSilent});
  trainer.fit(cohort::testing::small_task_data(), {.steps = settings.steps});
  if (chief) {
    cohort::testing::write_parameters(settings.out,
                                      cohort::testing::parameters_of(trainer.model()));
  }
  return 0;
}

template <template <class> class Cross>
int train(const Settings& settings) {
  return settings.eigen_threads > 0
             ? train<Cross>(settings, cohort::testing::small_eigen_model(settings.eigen_threads))
             : train<Cross>(settings, cohort::testing::small_model());
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr,
                 "usage: multi_worker_trainer LOCAL_REPLICAS STEPS OUT [ring] [--eigen THREADS] "
                 "[--micro-batches M]\n");
    return 64;
  }
  try {
    Settings settings;
    settings.local_replicas = std::stoul(argv[1]);
    settings.steps = std::stoull(argv[2]);
    settings.out = argv[3];
    for (int i = 4; i < argc; ++i) {
      const std::string flag = argv[i];
      const auto next = [&] { return i + 1 < argc ? std::string(argv[++i]) : std::string(); };
      if (flag == "ring") {
        settings.ring = true;
      } else if (flag == "--eigen") {
        settings.eigen_threads = std::stoul(next());
      } else if (flag == "--micro-batches") {
        settings.micro_batches = std::stoul(next());
      } else {
        std::fprintf(stderr, "multi_worker_trainer: unknown option %s\n", flag.c_str());
        return 64;
      }
    }
    return settings.ring ? train<cohort::collective::Ring>(settings)
                         : train<cohort::collective::Deterministic>(settings);
  } catch (const std::exception& error) {
    std::fprintf(stderr, "error: %s\n", error.what());
    return 1;
  }
}
