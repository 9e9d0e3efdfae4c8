// One worker of the multi-worker tests: trains a small test model with MultiWorkerMirrored and,
// on the chief, writes the final parameters.
//   multi_worker_trainer LOCAL_REPLICAS STEPS OUT [ring] [--eigen THREADS] [--micro-batches M]
//                        [--seed S] [--learning-rate LR] [--poison INDEX]
//                        [--on-nonfinite raise|skip_step]
//
// ring             the ring all-reduce across processes instead of the deterministic one
// --eigen THREADS  the examples' Eigen MLP on THREADS threads per replica (eigen_training.hpp)
//                  instead of the plain-loop Mlp
// --micro-batches  micro-batches per global batch (default 8)
// --seed, --learning-rate   the Trainer's seed (default 11) and Adam's learning rate (3e-3)
// --poison INDEX   example INDEX has a NaN feature (PoisonedData)
// --on-nonfinite   the Trainer's policy for a non-finite gradient (default raise)
// Every process prints "skipped N" (Report::skipped_steps) when its fit returns.
// Both models report their gradient readiness per layer, and buckets are 64 bytes, so the buckets
// of a step are reduced across processes while its backward pass goes on.
#include <chrono>
#include <cohort/collective/ring.hpp>
#include <cohort/strategy/multi_worker_mirrored.hpp>
#include <cstdio>
#include <optional>
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
  std::uint64_t seed = 11;
  double learning_rate = 3e-3;
  std::optional<std::size_t> poison;
  cohort::NonFinite on_nonfinite = cohort::NonFinite::kRaise;
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
                          cohort::optimizer::Adam({.learning_rate = settings.learning_rate}),
                          {.global_batch = 64,
                           .micro_batches = settings.micro_batches,
                           .seed = settings.seed,
                           .progress = cohort::Progress::kSilent,
                           .on_nonfinite = settings.on_nonfinite});
  const cohort::Report report =
      settings.poison ? trainer.fit(cohort::testing::PoisonedData{.poisoned = *settings.poison},
                                    {.steps = settings.steps})
                      : trainer.fit(cohort::testing::small_task_data(), {.steps = settings.steps});
  std::printf("skipped %llu\n", static_cast<unsigned long long>(report.skipped_steps));
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
                 "[--micro-batches M] [--seed S] [--learning-rate LR] [--poison INDEX] "
                 "[--on-nonfinite raise|skip_step]\n");
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
      } else if (flag == "--seed") {
        settings.seed = std::stoull(next());
      } else if (flag == "--learning-rate") {
        settings.learning_rate = std::stod(next());
      } else if (flag == "--poison") {
        settings.poison = std::stoul(next());
      } else if (flag == "--on-nonfinite") {
        settings.on_nonfinite =
            next() == "skip_step" ? cohort::NonFinite::kSkipStep : cohort::NonFinite::kRaise;
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
