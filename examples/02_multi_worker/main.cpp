// The demo's MLP trained between-graph: one process per worker, each with its own replicas, all
// synchronized over TCP. Started by any launcher (docs/launching.md), for example
//   cohort-run --np 2 -- multi_worker --local-replicas 2
// With the same settings as examples/00_mirrored_cpu, the chief prints the same parameter
// fingerprint as Mirrored with (workers x local replicas) replicas in one process.
#include <cohort/optimizer/adam.hpp>
#include <cohort/strategy/multi_worker_mirrored.hpp>
#include <cohort/trainer.hpp>
#include <cstdio>
#include <optional>
#include <string>

#include "demo.hpp"
#include "eigen_mlp.hpp"

int main(int argc, char** argv) {
  example::DemoSettings settings;
  std::size_t local_replicas = 1;
  std::size_t bucket_bytes = 0;
  CLI::App app{"MultiWorkerMirrored training of an MLP across processes"};
  app.add_option("--local-replicas", local_replicas, "replica threads in each worker process");
  app.add_option("--bucket-bytes", bucket_bytes,
                 "bytes per bucket of the gradient, all-reduced across processes as soon as the "
                 "backward pass has made it final (default: the strategy's choice)")
      ->check(CLI::PositiveNumber);
  example::add_demo_options(app, settings);
  example::add_threads_option(app, settings);
  example::add_checkpoint_options(app, settings);
  CLI11_PARSE(app, argc, argv);

  try {
    const example::DemoData data(settings);
    cohort::strategy::MultiWorkerMirrored<> strategy(
        {.local_replicas = local_replicas,
         .bucket_bytes = bucket_bytes != 0 ? std::optional(bucket_bytes) : std::nullopt});
    const bool chief = strategy.is_chief();
    const std::size_t workers = strategy.replicas() / local_replicas;
    cohort::Trainer trainer(
        example::EigenMlp(settings.layers, settings.seed, settings.threads), std::move(strategy),
        cohort::optimizer::Adam({.learning_rate = settings.learning_rate}),
        {.global_batch = settings.batch,
         .micro_batches = settings.micro_batches,
         .seed = settings.seed,
         .log_every = settings.log_every,
         .progress = settings.quiet || !chief ? cohort::Progress::kSilent : cohort::Progress::kAuto,
         .on_nonfinite = settings.on_nonfinite,
         .schedule = example::demo_schedule(settings),
         .checkpoint = example::checkpoint_policy(settings)});
    // One fit, evaluating the held-out set after every epoch (unless --no-validation), and
    // checkpointing as it goes with --checkpoint-dir.
    const cohort::Report report = settings.validate
                                      ? trainer.fit(data.training(), {.epochs = settings.epochs},
                                                    cohort::validation(data.held_out))
                                      : trainer.fit(data.training(), {.epochs = settings.epochs});
    if (report.preempted) return cohort::kExitPreempted;
    // The chief at the end: another worker where an elastic job (COHORT_MIN_WORKERS) lost it.
    if (trainer.strategy().is_chief()) {
      const std::size_t left = trainer.strategy().replicas() / local_replicas;
      std::printf("\n");
      (settings.validate ? example::outcome_of(report, trainer.model())
                         : example::evaluate(trainer.model(), data, report.examples_per_second))
          .print(std::to_string(left) + " worker(s)" +
                 (left != workers ? " (" + std::to_string(workers) + " at the start)" : "") +
                 " x " + std::to_string(local_replicas) + " local replica(s)");
      std::printf("fit %.3f s, of which %.3f s in %zu evaluations of the %zu held-out examples\n",
                  report.seconds, report.validation_seconds, report.validation.size(),
                  data.held_out.size());
      if (report.checkpoints != 0) {
        std::printf("%llu checkpoints into %s; the fit stood still %.3f s for them\n",
                    static_cast<unsigned long long>(report.checkpoints),
                    settings.checkpoint_directory.c_str(), report.checkpoint_seconds);
      }
    }
    return 0;
  } catch (const cohort::Error& error) {
    std::fprintf(stderr, "error: %s\n", error.what());
    return 2;
  }
}
