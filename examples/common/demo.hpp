// What the demo programs share: their settings and command line, the task they train on, and one
// training run with any strategy, evaluated on held-out data.
#pragma once

#include <CLI/CLI.hpp>
#include <cohort/optimizer/adam.hpp>
#include <cohort/trainer.hpp>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include "clusters.hpp"
#include "mlp.hpp"

namespace example {

struct DemoSettings {
  std::uint64_t epochs = 4;
  std::size_t batch = 256;
  std::size_t micro_batches = 8;
  std::uint64_t seed = 1;
  std::size_t examples = 100'000;
  std::size_t hidden = 128;
  double learning_rate = 3e-3;
  bool quiet = false;
  std::string checkpoint;  // continue from it if it exists; save it after every epoch
};

inline void add_demo_options(CLI::App& app, DemoSettings& settings) {
  app.add_option("--epochs", settings.epochs, "epochs per run");
  app.add_option("--batch", settings.batch, "global batch size");
  app.add_option("--micro-batches", settings.micro_batches, "micro-batches per global batch");
  app.add_option("--seed", settings.seed,
                 "seed of the task, the initialization and the data order");
  app.add_option("--examples", settings.examples, "training examples");
  app.add_option("--hidden", settings.hidden, "hidden units");
  app.add_option("--learning-rate", settings.learning_rate, "Adam learning rate");
  app.add_flag("--quiet", settings.quiet, "no progress lines");
}

// For the programs that train one model once (not 00, which trains several).
inline void add_checkpoint_option(CLI::App& app, DemoSettings& settings) {
  app.add_option("--checkpoint", settings.checkpoint,
                 "continue from this checkpoint if it exists, and save it after every epoch "
                 "(every process calls save; a parameter-server job writes a shard per server "
                 "and this file, the manifest, last)");
}

// FNV-1a over the bytes: a short name for a parameter vector in the output.
inline std::uint64_t fingerprint(std::span<const float> values) {
  std::uint64_t hash = 0xcbf29ce484222325ULL;
  for (std::byte byte : std::as_bytes(values)) {
    hash = (hash ^ std::to_integer<std::uint64_t>(byte)) * 0x100000001b3ULL;
  }
  return hash;
}

struct DemoData {
  ClusterTask task;
  ClusterData train;
  ClusterData held_out;

  explicit DemoData(const DemoSettings& settings)
      : task({.seed = settings.seed}),
        train(task.sample(settings.examples, 0)),
        held_out(task.sample(20'000, 1)) {}

  std::vector<std::size_t> mlp_layers(std::size_t hidden) const {
    return {task.options().features, hidden, task.options().classes};
  }
  std::vector<std::size_t> linear_layers() const {
    return {task.options().features, task.options().classes};
  }
};

struct Outcome {
  double examples_per_second;
  double accuracy;
  std::vector<float> parameters;
};

template <class Strategy>
Outcome train(const DemoSettings& settings, const std::vector<std::size_t>& layers,
              Strategy strategy, const DemoData& data) {
  using namespace cohort;
  const bool chief = strategy.is_chief();
  const bool serves = [&] {
    if constexpr (requires { strategy.serves(); }) {
      return strategy.serves();
    } else {
      return false;
    }
  }();
  Trainer trainer(Mlp(layers, settings.seed), std::move(strategy),
                  optimizer::Adam({.learning_rate = settings.learning_rate}),
                  {.global_batch = settings.batch,
                   .micro_batches = settings.micro_batches,
                   .seed = settings.seed,
                   .log_every = 100,
                   .progress = settings.quiet || !chief ? Progress::kSilent : Progress::kAuto});
  const bool checkpoints = !settings.checkpoint.empty();
  if (checkpoints && std::filesystem::exists(settings.checkpoint)) {
    trainer.restore(settings.checkpoint);
    if (chief) std::printf("continuing from %s at step %llu\n", settings.checkpoint.c_str(),
                           static_cast<unsigned long long>(trainer.step()));
  }
  // With checkpoints, one fit per epoch, each followed by a save (fit's targets are absolute,
  // so a restored run goes on where it stopped); without, one fit.
  double seconds = 0.0;
  std::uint64_t steps = 0;
  for (std::uint64_t epoch = checkpoints ? 1 : settings.epochs; epoch <= settings.epochs;
       ++epoch) {
    const Report report = trainer.fit(data.train, {.epochs = epoch});
    seconds += report.seconds;
    steps += report.steps;
    if (checkpoints) trainer.save(settings.checkpoint);
  }
  const double examples = static_cast<double>(steps * settings.batch);
  Outcome outcome{seconds > 0.0 ? examples / seconds : 0.0, 0.0, {}};
  if (!serves) {  // a parameter server holds no model to evaluate
    Mlp model = trainer.model();
    const auto parameters = ModelTraits<Mlp>::parameters(model);
    outcome.accuracy = accuracy(model, data.held_out);
    outcome.parameters.assign(parameters.begin(), parameters.end());
  }
  return outcome;
}

}  // namespace example
