// The demo's MLP trained between-graph: one process per worker, each with its own replicas, all
// synchronized over TCP. Started by any launcher (docs/launching.md), for example
//   cohort-run --np 2 -- multi_worker --local-replicas 2
// With the same settings as examples/00_mirrored_cpu, the chief prints the same parameter
// fingerprint as Mirrored with (workers x local replicas) replicas in one process.
#include <cohort/strategy/multi_worker_mirrored.hpp>
#include <cstdio>

#include "demo.hpp"

int main(int argc, char** argv) {
  example::DemoSettings settings;
  std::size_t local_replicas = 1;
  CLI::App app{"MultiWorkerMirrored training of an MLP across processes"};
  app.add_option("--local-replicas", local_replicas, "replica threads in each worker process");
  example::add_demo_options(app, settings);
  example::add_checkpoint_option(app, settings);
  CLI11_PARSE(app, argc, argv);

  try {
    const example::DemoData data(settings);
    cohort::strategy::MultiWorkerMirrored<> strategy({.local_replicas = local_replicas});
    const bool chief = strategy.is_chief();
    const std::size_t replicas = strategy.replicas();
    const std::size_t workers = replicas / local_replicas;
    const auto outcome =
        example::train(settings, data.mlp_layers(settings.hidden), std::move(strategy), data);
    if (chief) {
      std::printf("\n%zu worker(s) x %zu local replica(s): %.0f examples/s, held-out accuracy "
                  "%.2f%%, parameters %llx\n",
                  workers, local_replicas, outcome.examples_per_second, 100.0 * outcome.accuracy,
                  static_cast<unsigned long long>(example::fingerprint(outcome.parameters)));
    }
    return 0;
  } catch (const cohort::Error& error) {
    std::fprintf(stderr, "error: %s\n", error.what());
    return 2;
  }
}
