// Trains a small MLP on a generated 10-class task with Mirrored on 1, 2 and 4 host replicas, and
// shows the three things cohort promises for it: the model learns (held-out accuracy, beside a
// linear baseline), it scales (examples per second per replica count), and the result does not
// depend on the replica count (the final parameters are compared bit for bit).
#include <cohort/cohort.hpp>
#include <cstdio>
#include <vector>

#include "demo.hpp"

int main(int argc, char** argv) {
  example::DemoSettings settings;
  std::vector<std::size_t> replica_counts{1, 2, 4};
  CLI::App app{"Mirrored data-parallel training of an MLP on host replicas"};
  app.add_option("--replicas", replica_counts, "replica counts to train with, in turn")
      ->expected(1, 16);
  example::add_demo_options(app, settings);
  CLI11_PARSE(app, argc, argv);

  try {
    const example::DemoData data(settings);
    std::printf("task: %zu classes, %zu features, %zu blobs per class; %zu training and %zu "
                "held-out examples\n",
                data.task.options().classes, data.task.options().features,
                data.task.options().blobs_per_class, data.train.size(), data.held_out.size());

    std::printf("\nlinear baseline (softmax regression), 1 replica:\n");
    const auto linear = example::train(settings, data.linear_layers(),
                                       cohort::strategy::Mirrored<>({.replicas = 1}), data);

    std::vector<example::Outcome> outcomes;
    for (std::size_t replicas : replica_counts) {
      std::printf("\nMLP %zu-%zu-%zu, Mirrored with %zu replica(s):\n",
                  data.task.options().features, settings.hidden, data.task.options().classes,
                  replicas);
      outcomes.push_back(example::train(settings, data.mlp_layers(settings.hidden),
                                        cohort::strategy::Mirrored<>({.replicas = replicas}),
                                        data));
    }

    std::printf("\n%8s %14s %8s %10s %18s\n", "replicas", "examples/s", "speedup", "accuracy",
                "parameters");
    bool identical = true;
    for (std::size_t run = 0; run < outcomes.size(); ++run) {
      const example::Outcome& outcome = outcomes[run];
      identical = identical && outcome.parameters == outcomes[0].parameters;
      std::printf("%8zu %14.0f %7.2fx %9.2f%% %18llx\n", replica_counts[run],
                  outcome.examples_per_second,
                  outcome.examples_per_second / outcomes[0].examples_per_second,
                  100.0 * outcome.accuracy,
                  static_cast<unsigned long long>(example::fingerprint(outcome.parameters)));
    }
    std::printf("\nlinear baseline accuracy: %.2f%%\n", 100.0 * linear.accuracy);
    std::printf("final parameters bit-identical across replica counts: %s\n",
                identical ? "yes" : "NO");
    return identical ? 0 : 1;
  } catch (const cohort::Error& error) {
    std::fprintf(stderr, "error: %s\n", error.what());
    return 2;
  }
}
