// Trains an MLP (the Eigen one of examples/common) on a generated task with Mirrored on 1, 2, 3
// and 4 host replicas, and shows the three things cohort promises for it: the model learns
// (held-out accuracy, beside a linear baseline), it scales (examples per second per replica count),
// and the result does not depend on the replica count (the final parameters are compared bit for
// bit).
#include <cohort/cohort.hpp>
#include <cstdio>
#include <string>
#include <vector>

#include "demo.hpp"
#include "eigen_mlp.hpp"

int main(int argc, char** argv) {
  example::DemoSettings settings;
  std::vector<std::size_t> replica_counts{1, 2, 3, 4};
  CLI::App app{"Mirrored data-parallel training of an MLP on host replicas"};
  app.add_option("--replicas", replica_counts, "replica counts to train with, in turn")
      ->expected(1, 16);
  example::add_demo_options(app, settings);
  example::add_threads_option(app, settings);
  CLI11_PARSE(app, argc, argv);

  try {
    const example::DemoData data(settings);
    data.print();

    // One training run: the model, the strategy, the optimizer and the schedule.
    const auto train = [&](const std::vector<std::size_t>& layers, std::size_t replicas) {
      cohort::Trainer trainer(
          example::EigenMlp(layers, settings.seed, settings.threads),
          cohort::strategy::Mirrored<>({.replicas = replicas}),
          cohort::optimizer::Adam({.learning_rate = settings.learning_rate}),
          {.global_batch = settings.batch,
           .micro_batches = settings.micro_batches,
           .seed = settings.seed,
           .log_every = settings.log_every,
           .progress = settings.quiet ? cohort::Progress::kSilent : cohort::Progress::kAuto,
           .on_nonfinite = settings.on_nonfinite,
           .schedule = example::demo_schedule(settings)});
      if (!settings.validate) {
        const cohort::Report report = trainer.fit(data.training(), {.epochs = settings.epochs});
        return example::evaluate(trainer.model(), data, report.examples_per_second);
      }
      // The held-out accuracy after every epoch, from inside fit.
      const cohort::Report report = trainer.fit(data.training(), {.epochs = settings.epochs},
                                                cohort::validation(data.held_out));
      return example::outcome_of(report, trainer.model());
    };

    const std::vector<std::size_t> linear{settings.layers.front(), settings.layers.back()};
    std::printf("\nlinear baseline (softmax regression), 1 replica:\n");
    const example::Outcome baseline = train(linear, 1);

    std::vector<example::Outcome> outcomes;
    for (std::size_t replicas : replica_counts) {
      std::printf("\nMLP %s, Mirrored with %zu replica(s) of %zu thread(s):\n",
                  example::describe(settings.layers).c_str(), replicas, settings.threads);
      outcomes.push_back(train(settings.layers, replicas));
    }

    std::printf("\n%8s %14s %8s %10s %18s\n", "replicas", "examples/s", "speedup", "accuracy",
                "parameters");
    bool identical = true;
    for (std::size_t run = 0; run < outcomes.size(); ++run) {
      const example::Outcome& outcome = outcomes[run];
      identical = identical && outcome.parameters == outcomes[0].parameters;
      std::printf(
          "%8zu %14.0f %7.2fx %9.2f%% %18llx\n", replica_counts[run], outcome.examples_per_second,
          outcome.examples_per_second / outcomes[0].examples_per_second, 100.0 * outcome.accuracy,
          static_cast<unsigned long long>(example::fingerprint(outcome.parameters)));
    }
    std::printf("\nlinear baseline accuracy: %.2f%%\n", 100.0 * baseline.accuracy);
    std::printf("final parameters bit-identical across replica counts: %s\n",
                identical ? "yes" : "NO");
    return identical ? 0 : 1;
  } catch (const cohort::Error& error) {
    std::fprintf(stderr, "error: %s\n", error.what());
    return 2;
  }
}
