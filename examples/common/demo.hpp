// What the demo programs share: their settings and command line, the task they train on, their
// checkpoints, and what they print about a run.
#pragma once

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cohort/trainer.hpp>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "clusters.hpp"
#include "paced_data.hpp"

namespace example {

struct DemoSettings {
  std::uint64_t epochs = 4;
  std::size_t batch = 256;
  std::size_t micro_batches = 8;
  std::uint64_t seed = 1;
  std::size_t examples = 100'000;
  std::size_t held_out = 20'000;
  std::vector<std::size_t> layers{8, 128, 10};  // inputs, hidden..., classes
  std::size_t threads = 1;                      // per replica
  double learning_rate = 1e-2;  // the schedule's peak (demo_schedule)
  bool quiet = false;
  std::uint64_t log_every = 100;  // steps between progress lines and metrics lines
  std::string
      checkpoint_directory;  // checkpoints during the fit, resumed from (Options::checkpoint)
  std::uint64_t checkpoint_every = 1000;  // steps
  bool validate = true;                   // evaluate the held-out set inside fit, after every epoch
  cohort::NonFinite on_nonfinite = cohort::NonFinite::kRaise;
  std::optional<std::size_t> nan_example;  // a training example given a NaN feature
  std::uint64_t input_ms = 0;  // each replica's micro-batches at most one per this many ms
};

inline void add_demo_options(CLI::App& app, DemoSettings& settings) {
  app.add_option("--epochs", settings.epochs, "epochs per run");
  app.add_option("--batch", settings.batch, "global batch size");
  app.add_option("--micro-batches", settings.micro_batches, "micro-batches per global batch");
  app.add_option("--seed", settings.seed,
                 "seed of the task, the initialization and the data order");
  app.add_option("--examples", settings.examples, "training examples");
  app.add_option("--held-out", settings.held_out, "held-out examples")->check(CLI::PositiveNumber);
  app.add_option("--layers", settings.layers,
                 "layer sizes, comma-separated: the inputs (the task's features), hidden "
                 "layers, the classes (the task's), for example 784,1024,1024,10")
      ->delimiter(',')
      ->expected(-2)
      ->check(CLI::PositiveNumber);
  app.add_option("--learning-rate", settings.learning_rate, "Adam learning rate");
  app.add_flag("--quiet", settings.quiet, "no progress lines");
  app.add_option("--log-every", settings.log_every,
                 "steps between progress lines, and between the lines of the metrics file "
                 "(COHORT_METRICS)")
      ->check(CLI::PositiveNumber);
  app.add_option("--on-nonfinite", settings.on_nonfinite,
                 "a step whose gradient holds an infinity or NaN: raise (stop with an error) or "
                 "skip_step")
      ->transform(CLI::CheckedTransformer(std::map<std::string, cohort::NonFinite>{
          {"raise", cohort::NonFinite::kRaise}, {"skip_step", cohort::NonFinite::kSkipStep}}));
  app.add_option("--nan-example", settings.nan_example,
                 "give training example INDEX a NaN feature, to see what --on-nonfinite does");
  app.add_flag("!--no-validation", settings.validate,
               "no evaluation of the held-out set inside fit (after every epoch otherwise)");
  app.add_option("--input-ms", settings.input_ms,
                 "each replica receives at most one micro-batch every N ms, as from an input "
                 "pipeline that slow, so that a small model's fit lasts long enough to kill a "
                 "worker in its middle (default 0: as fast as the replicas take them)");
}

// The learning rate's schedule of every demo: a linear warm-up over the first tenth of the run's
// steps, then a cosine decay to a tenth of the learning rate.
inline cohort::optimizer::Schedule demo_schedule(const DemoSettings& settings) {
  const std::uint64_t steps = settings.epochs * (settings.examples / settings.batch);
  const std::uint64_t warmup = std::max<std::uint64_t>(1, steps / 10);
  return {.warmup_steps = warmup,
          .decay = cohort::optimizer::Decay::kCosine,
          .decay_steps = std::max<std::uint64_t>(1, steps - std::min(steps, warmup)),
          .final_factor = 0.1};
}

// For the programs that train the host model (not 01, whose model is on GPUs).
inline void add_threads_option(CLI::App& app, DemoSettings& settings) {
  app.add_option("--threads", settings.threads,
                 "threads of each replica's model (its own; replicas x threads at most the "
                 "cores: examples/README.md)")
      ->check(CLI::PositiveNumber);
}

// For the programs that train one model once (not 00, which trains several).
inline void add_checkpoint_options(CLI::App& app, DemoSettings& settings) {
  app.add_option("--checkpoint-dir", settings.checkpoint_directory,
                 "checkpoint into this directory every --checkpoint-every steps, at the end of "
                 "the fit and on SIGTERM or SIGUSR1, which stop the job with exit status 75 (the "
                 "newest 3 kept), and continue from the newest there: after a kill -9 of every "
                 "process, the same command goes on to the same bits");
  app.add_option("--checkpoint-every", settings.checkpoint_every, "steps between checkpoints")
      ->check(CLI::PositiveNumber);
}

// The Trainer's checkpoint policy of --checkpoint-dir and --checkpoint-every (none without a
// directory).
inline cohort::CheckpointPolicy checkpoint_policy(const DemoSettings& settings) {
  if (settings.checkpoint_directory.empty()) return {};
  return {.directory = settings.checkpoint_directory,
          .every_steps = settings.checkpoint_every,
          .resume = true};
}

// "784-1024-1024-10"
inline std::string describe(const std::vector<std::size_t>& layers) {
  std::string text;
  for (std::size_t size : layers) {
    if (!text.empty()) text += '-';
    text += std::to_string(size);
  }
  return text;
}

// FNV-1a over the bytes: a short name for a parameter vector in the output.
inline std::uint64_t fingerprint(std::span<const float> values) {
  std::uint64_t hash = 0xcbf29ce484222325ULL;
  for (std::byte byte : std::as_bytes(values)) {
    hash = (hash ^ std::to_integer<std::uint64_t>(byte)) * 0x100000001b3ULL;
  }
  return hash;
}

// The task has the model's inputs as features and its classes.
struct DemoData {
  ClusterTask task;
  ClusterData train;
  ClusterData held_out;
  std::chrono::milliseconds input_interval;

  explicit DemoData(const DemoSettings& settings)
      : task({.features = settings.layers.front(),
              .classes = settings.layers.back(),
              .seed = settings.seed}),
        train(task.sample(settings.examples, 0)),
        held_out(task.sample(settings.held_out, 1)),
        input_interval(settings.input_ms) {
    if (settings.nan_example) train.poison(*settings.nan_example);
  }

  // The training set as a fit reads it: at the pace of --input-ms.
  PacedData<ClusterData> training() const { return {train, input_interval}; }

  void print() const {
    std::printf(
        "task: %zu classes, %zu features, %zu blobs per class; %zu training and %zu "
        "held-out examples\n",
        task.options().classes, task.options().features, task.options().blobs_per_class,
        train.size(), held_out.size());
  }
};

// What a demo prints about a run.
struct Outcome {
  double examples_per_second = 0.0;
  double accuracy = 0.0;
  std::vector<float> parameters;

  // "<run>: N examples/s, held-out accuracy A%, parameters HEX" (scripts read this line).
  void print(const std::string& run) const {
    std::printf("%s: %.0f examples/s, held-out accuracy %.2f%%, parameters %llx\n", run.c_str(),
                examples_per_second, 100.0 * accuracy,
                static_cast<unsigned long long>(fingerprint(parameters)));
  }
};

// A run whose fit evaluated the held-out set: its last accuracy there, and the parameters.
template <class Model>
Outcome outcome_of(const cohort::Report& report, Model model) {
  const auto parameters = cohort::ModelTraits<Model>::parameters(model);
  return {report.examples_per_second,
          report.validation.back().mean("correct"),
          {parameters.begin(), parameters.end()}};
}

// The held-out accuracy and the parameters of a trained model (a copy of it: predicting uses the
// model's buffers).
template <class Model>
Outcome evaluate(Model model, const DemoData& data, double examples_per_second) {
  const auto parameters = cohort::ModelTraits<Model>::parameters(model);
  return {
      examples_per_second, accuracy(model, data.held_out), {parameters.begin(), parameters.end()}};
}

}  // namespace example
