// Trains a small MLP on a generated 10-class task with Mirrored on 1, 2 and 4 host replicas, and
// shows the three things cohort promises for it: the model learns (held-out accuracy, beside a
// linear baseline), it scales (examples per second per replica count), and the result does not
// depend on the replica count (the final parameters are compared bit for bit).
#include <CLI/CLI.hpp>
#include <cohort/cohort.hpp>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include "clusters.hpp"
#include "mlp.hpp"

namespace {

struct Settings {
  std::vector<std::size_t> replicas{1, 2, 4};
  std::uint64_t epochs = 4;
  std::size_t batch = 256;
  std::size_t micro_batches = 8;
  std::uint64_t seed = 1;
  std::size_t examples = 100'000;
  std::size_t hidden = 128;
  double learning_rate = 3e-3;
  bool quiet = false;
};

// FNV-1a over the bytes: a short name for a parameter vector in the output.
std::uint64_t fingerprint(std::span<const float> values) {
  std::uint64_t hash = 0xcbf29ce484222325ULL;
  for (std::byte byte : std::as_bytes(values)) {
    hash = (hash ^ std::to_integer<std::uint64_t>(byte)) * 0x100000001b3ULL;
  }
  return hash;
}

struct Outcome {
  double examples_per_second;
  double accuracy;
  std::vector<float> parameters;
};

Outcome train(const Settings& settings, const std::vector<std::size_t>& layers,
              std::size_t replicas, const example::ClusterData& train_data,
              const example::ClusterData& held_out) {
  using namespace cohort;
  Trainer trainer(example::Mlp(layers, settings.seed), strategy::Mirrored<>({.replicas = replicas}),
                  optimizer::Adam({.learning_rate = settings.learning_rate}),
                  {.global_batch = settings.batch,
                   .micro_batches = settings.micro_batches,
                   .seed = settings.seed,
                   .log_every = 100,
                   .progress = settings.quiet ? Progress::kSilent : Progress::kAuto});
  const Report report = trainer.fit(train_data, {.epochs = settings.epochs});
  example::Mlp model = trainer.model();
  const auto parameters = cohort::ModelTraits<example::Mlp>::parameters(model);
  return {report.examples_per_second,
          example::accuracy(model, held_out),
          {parameters.begin(), parameters.end()}};
}

}  // namespace

int main(int argc, char** argv) {
  Settings settings;
  CLI::App app{"Mirrored data-parallel training of an MLP on host replicas"};
  app.add_option("--replicas", settings.replicas, "replica counts to train with, in turn")
      ->expected(1, 16);
  app.add_option("--epochs", settings.epochs, "epochs per run");
  app.add_option("--batch", settings.batch, "global batch size");
  app.add_option("--micro-batches", settings.micro_batches, "micro-batches per global batch");
  app.add_option("--seed", settings.seed,
                 "seed of the task, the initialization and the data order");
  app.add_option("--examples", settings.examples, "training examples");
  app.add_option("--hidden", settings.hidden, "hidden units");
  app.add_option("--learning-rate", settings.learning_rate, "Adam learning rate");
  app.add_flag("--quiet", settings.quiet, "no progress lines");
  CLI11_PARSE(app, argc, argv);

  try {
    const example::ClusterTask task({.seed = settings.seed});
    const auto train_data = task.sample(settings.examples, 0);
    const auto held_out = task.sample(20'000, 1);
    const std::size_t features = task.options().features;
    const std::size_t classes = task.options().classes;
    std::printf(
        "task: %zu classes, %zu features, %zu blobs per class; %zu training and %zu "
        "held-out examples\n",
        classes, features, task.options().blobs_per_class, train_data.size(), held_out.size());

    std::printf("\nlinear baseline (softmax regression), 1 replica:\n");
    const Outcome linear = train(settings, {features, classes}, 1, train_data, held_out);
    std::printf("linear held-out accuracy: %.2f%%\n", 100.0 * linear.accuracy);

    std::vector<Outcome> outcomes;
    for (std::size_t replicas : settings.replicas) {
      std::printf("\nMLP %zu-%zu-%zu, Mirrored with %zu replica(s):\n", features, settings.hidden,
                  classes, replicas);
      outcomes.push_back(
          train(settings, {features, settings.hidden, classes}, replicas, train_data, held_out));
    }

    std::printf("\n%8s %14s %8s %10s %18s\n", "replicas", "examples/s", "speedup", "accuracy",
                "parameters");
    bool identical = true;
    for (std::size_t run = 0; run < outcomes.size(); ++run) {
      const Outcome& outcome = outcomes[run];
      identical = identical && outcome.parameters == outcomes[0].parameters &&
                  std::memcmp(outcome.parameters.data(), outcomes[0].parameters.data(),
                              outcome.parameters.size() * sizeof(float)) == 0;
      std::printf("%8zu %14.0f %7.2fx %9.2f%% %18llx\n", settings.replicas[run],
                  outcome.examples_per_second,
                  outcome.examples_per_second / outcomes[0].examples_per_second,
                  100.0 * outcome.accuracy,
                  static_cast<unsigned long long>(fingerprint(outcome.parameters)));
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
