// The demo's MLP trained with parameter servers: servers hold the parameters and the optimizer
// state, workers compute gradients. The same program runs every role; started by the local
// launcher, for example
//   cohort-run --np 3 --ps 2 -- parameter_server --consistency async
// or by TF_CONFIG (docs/launching.md, "ParameterServer"). The chief prints accuracy and
// throughput; each server prints the pushes it applied and, for async and bounded staleness, the
// staleness it observed (updates between a worker's pull and its push).
//
// 3 workers: this example defaults to micro_batches = 12, 4 for each worker. Any count from 3
// works (8 would deal them 2, 2 and 4), but then the worker dealt most sets the pace.
#include <cohort/optimizer/adam.hpp>
#include <cohort/strategy/parameter_server.hpp>
#include <cohort/trainer.hpp>
#include <cstdio>
#include <string>

#include "demo.hpp"
#include "eigen_mlp.hpp"

namespace {

template <class Consistency>
int run(const example::DemoSettings& settings, std::size_t local_replicas) {
  const example::DemoData data(settings);
  // The demo's default model is small (about 10 KiB): without a minimum shard size and with
  // 1024-element blocks it spreads over both servers, as a large model would by default.
  cohort::strategy::ParameterServer<Consistency> strategy(
      {.local_replicas = local_replicas, .min_shard_bytes = 0, .alignment = 1024});
  const bool chief = strategy.is_chief();
  const int workers = strategy.workers();
  const int servers = strategy.servers();
  // A server builds no replica: the model only gives the parameter count.
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
  const cohort::Report report = trainer.fit(data.training(), {.epochs = settings.epochs});
  if (report.preempted) return cohort::kExitPreempted;
  // The chief at the end: another worker where an elastic synchronous job lost it.
  if (trainer.strategy().is_chief()) {
    const int left = trainer.strategy().workers();
    std::printf("\n");
    example::evaluate(trainer.model(), data, report.examples_per_second)
        .print(std::string(Consistency::kName) + ": " + std::to_string(left) + " worker(s)" +
               (left != workers ? " (" + std::to_string(workers) + " at the start)" : "") + " x " +
               std::to_string(local_replicas) + " local replica(s), " + std::to_string(servers) +
               " server(s)");
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  example::DemoSettings settings;
  settings.micro_batches = 12;
  std::string consistency = "sync";
  std::size_t local_replicas = 1;
  CLI::App app{"ParameterServer training of an MLP: servers and workers of one program"};
  app.add_option("--consistency", consistency, "sync, async or bounded (staleness 2)")
      ->check(CLI::IsMember({"sync", "async", "bounded"}));
  app.add_option("--local-replicas", local_replicas,
                 "replica threads in each worker process (a power of two)");
  example::add_demo_options(app, settings);
  example::add_threads_option(app, settings);
  example::add_checkpoint_options(app, settings);
  CLI11_PARSE(app, argc, argv);

  try {
    using namespace cohort::strategy::consistency;
    if (consistency == "async") return run<Async>(settings, local_replicas);
    if (consistency == "bounded") return run<BoundedStaleness<2>>(settings, local_replicas);
    return run<Sync>(settings, local_replicas);
  } catch (const cohort::Error& error) {
    std::fprintf(stderr, "error: %s\n", error.what());
    return 2;
  }
}
