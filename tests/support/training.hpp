// A small, fast training setup shared by the strategy and checkpoint tests: the examples' MLP on
// a small generated task.
#pragma once

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cohort/cohort.hpp>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "clusters.hpp"
#include "mlp.hpp"

namespace cohort::testing {

inline const example::ClusterData& small_task_data() {
  static const example::ClusterData data =
      example::ClusterTask({.features = 8, .classes = 4, .blobs_per_class = 2, .seed = 3})
          .sample(2000, 0);
  return data;
}

// Held-out examples of the same task.
inline const example::ClusterData& small_held_out_data() {
  static const example::ClusterData data =
      example::ClusterTask({.features = 8, .classes = 4, .blobs_per_class = 2, .seed = 3})
          .sample(500, 1);
  return data;
}

inline example::Mlp small_model(std::uint64_t seed = 7) { return example::Mlp({8, 16, 4}, seed); }

// 13316 parameters: four blocks of the gradient norm (device::cpu::kNormBlock), so that a
// parameter server's block-aligned shards spread it over several servers.
inline example::Mlp wide_model(std::uint64_t seed = 7) { return example::Mlp({8, 1024, 4}, seed); }

// The optimizers the strategy tests train with, one of each kind; Adam clips at a norm the first
// steps exceed, so that the sum of squares takes part.
template <class Optimizer>
Optimizer test_optimizer();
template <>
inline optimizer::Sgd test_optimizer() {
  return optimizer::Sgd({.learning_rate = 0.1, .weight_decay = 1e-4});
}
template <>
inline optimizer::Momentum test_optimizer() {
  return optimizer::Momentum({.learning_rate = 0.05, .momentum = 0.9, .nesterov = true});
}
template <>
inline optimizer::Adam test_optimizer() {
  return optimizer::Adam({.learning_rate = 3e-3, .max_gradient_norm = 0.5});
}
template <>
inline optimizer::AdamW test_optimizer() {
  return optimizer::AdamW({.learning_rate = 3e-3, .weight_decay = 0.01});
}

// The schedule the tests train under: warm-up, then cosine decay within a 30-step run.
inline optimizer::Schedule test_schedule() {
  return {.warmup_steps = 5,
          .decay = optimizer::Decay::kCosine,
          .decay_steps = 20,
          .final_factor = 0.1};
}

// The test programs' Options::schedule and Options::checkpoint from their flags: the tests'
// schedule or none; checkpoints every `every` steps into `directory`, resumed from there, or none.
inline optimizer::Schedule schedule_if(bool scheduled) {
  return scheduled ? test_schedule() : optimizer::Schedule{};
}
inline CheckpointPolicy checkpoints_in(const std::string& directory, std::uint64_t every) {
  return {.directory = directory, .every_steps = every, .resume = !directory.empty()};
}

// An evaluation with its exact bits: "evaluation after 10: loss=0x1.8p-1 correct=0x1.ep-1".
inline std::string describe(const Evaluation& evaluation) {
  std::string text = "evaluation after " + std::to_string(evaluation.step) + ":";
  for (const auto& [name, mean] : evaluation.means) {
    char bits[40];
    std::snprintf(bits, sizeof bits, "%a", mean);
    text += " " + name + "=" + bits;
  }
  return text;
}

// A preemption at a known point of a run: the call number `at` (from 0; -1: never) sends SIGTERM
// to this process's parent, the launcher (cohort-run), which forwards it to every rank as a job
// controller would. Test programs call it from their data set's batch(). The call returns once
// this process has the forwarded signal latched (or after 60 s), so that the run's next vote,
// and not the launcher's scheduling on a loaded machine, decides where it stops.
class PreemptAt {
 public:
  explicit PreemptAt(int at) : at_(at) {}
  void operator()() const {
    if (at_ < 0 || calls_.fetch_add(1) != at_) return;
    ::kill(::getppid(), SIGTERM);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (preemption::requested() == 0 && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }

 private:
  int at_;
  mutable std::atomic<int> calls_{0};
};

// small_task_data(), preempting the run at its micro-batch number `at` (PreemptAt), and pausing
// in every micro-batch (so that a run lasts long enough to be stopped in its middle).
struct PreemptedData {
  const example::ClusterData* data = &small_task_data();
  PreemptAt preempt{-1};
  std::chrono::milliseconds pause{0};

  std::size_t size() const { return data->size(); }
  example::Batch batch(std::span<const std::size_t> indices) const {
    preempt();
    if (pause.count() > 0) std::this_thread::sleep_for(pause);
    return data->batch(indices);
  }
};

// small_task_data() with one example poisoned: its first feature is NaN (the NaN tests of
// on_nonfinite).
struct PoisonedData {
  const example::ClusterData* data = &small_task_data();
  std::size_t poisoned = 0;

  std::size_t size() const { return data->size(); }
  example::Batch batch(std::span<const std::size_t> indices) const {
    example::Batch batch = data->batch(indices);
    poison(batch, indices, poisoned);
    return batch;
  }

  // Makes the first feature of example `poisoned` NaN where `batch` (of examples `indices`) holds
  // it.
  static void poison(example::Batch& batch, std::span<const std::size_t> indices,
                     std::size_t poisoned) {
    for (std::size_t i = 0; i < indices.size(); ++i) {
      if (indices[i] == poisoned) {
        batch.inputs[i * batch.features] = std::numeric_limits<float>::quiet_NaN();
      }
    }
  }
};

// The steps of the first `epochs` epochs whose global batch holds example `index`, for a run with
// this seed and global batch over small_task_data().
inline std::vector<std::uint64_t> steps_with_example(std::size_t index, std::uint64_t seed,
                                                     std::size_t global_batch,
                                                     std::size_t micro_batches,
                                                     std::uint64_t epochs) {
  const sharding::Plan plan(small_task_data().size(), global_batch, micro_batches, 1, 1,
                            sharding::Shares::of(1), true);
  std::vector<std::uint64_t> steps;
  for (std::uint64_t epoch = 0; epoch < epochs; ++epoch) {
    const std::vector<std::size_t> order = plan.epoch_order(seed, epoch);
    for (std::size_t position = 0; position < plan.steps_per_epoch() * global_batch; ++position) {
      if (order[position] == index) {
        steps.push_back(epoch * plan.steps_per_epoch() + position / global_batch);
      }
    }
  }
  return steps;
}

// The bytes of a parameter vector: what the test programs write (write_parameters) and the tests
// compare, bit for bit, with what they read back (read_file).
inline std::string bytes_of(std::span<const float> values) {
  return {reinterpret_cast<const char*>(values.data()), values.size_bytes()};
}

inline void write_parameters(const std::filesystem::path& file, std::span<const float> values) {
  std::ofstream(file, std::ios::binary) << bytes_of(values);
}

template <Model M>
std::vector<float> parameters_of(const M& model) {
  auto copy = model;
  const auto parameters = ModelTraits<M>::parameters(copy);
  return {parameters.begin(), parameters.end()};
}

// The examples' MLP without its gradient readiness (core/model.hpp): the reference that overlap
// must not change by a bit.
struct WithoutReadiness {
  example::Mlp model;
};

// The examples' MLP reporting the ranges it is given instead of its layers, after computing its
// gradients: for the Trainer's check of what a model reports.
struct ScriptedReadiness {
  example::Mlp model;
  std::vector<std::pair<std::size_t, std::size_t>> ranges;
};

// The examples' MLP whose backward pass fails at this process's report of readiness number
// `fail_at` (counted over all its replicas, from 1), after earlier reports have started buckets:
// a model that throws while its buckets are on the wire.
struct FailingBackward {
  example::Mlp model;
  std::shared_ptr<std::atomic<int>> reports = std::make_shared<std::atomic<int>>(0);
  int fail_at = -1;
};

inline std::vector<float> parameters_of(const WithoutReadiness& wrapped) {
  return parameters_of(wrapped.model);
}
inline std::vector<float> parameters_of(const ScriptedReadiness& wrapped) {
  return parameters_of(wrapped.model);
}
inline std::vector<float> parameters_of(const FailingBackward& wrapped) {
  return parameters_of(wrapped.model);
}

}  // namespace cohort::testing

namespace cohort::testing {
// What both wrappers forward to the MLP they hold.
template <class Wrapper>
struct WrappedMlpTraits {
  using value_type = float;
  using batch_type = example::Batch;
  static std::span<float> parameters(Wrapper& m) { return m.model.parameters(); }
  static std::span<float> gradients(Wrapper& m) { return m.model.gradients(); }
  static double forward_backward(Wrapper& m, const batch_type& batch) {
    return m.model.forward_backward(batch);
  }
};
}  // namespace cohort::testing

template <>
struct cohort::ModelTraits<cohort::testing::WithoutReadiness>
    : cohort::testing::WrappedMlpTraits<cohort::testing::WithoutReadiness> {};

template <>
struct cohort::ModelTraits<cohort::testing::ScriptedReadiness>
    : cohort::testing::WrappedMlpTraits<cohort::testing::ScriptedReadiness> {
  using WrappedMlpTraits::forward_backward;
  static double forward_backward(cohort::testing::ScriptedReadiness& m, const batch_type& batch,
                                 cohort::GradientReady ready) {
    const double loss = m.model.forward_backward(batch);
    for (const auto& [begin, end] : m.ranges) ready(begin, end);
    return loss;
  }
};

template <>
struct cohort::ModelTraits<cohort::testing::FailingBackward>
    : cohort::testing::WrappedMlpTraits<cohort::testing::FailingBackward> {
  using WrappedMlpTraits::forward_backward;
  static double forward_backward(cohort::testing::FailingBackward& m, const batch_type& batch,
                                 cohort::GradientReady ready) {
    return m.model.forward_backward(batch, [&](std::size_t begin, std::size_t end) {
      if (++*m.reports == m.fail_at) {
        throw std::runtime_error("backward failed at readiness report " +
                                 std::to_string(m.fail_at));
      }
      ready(begin, end);
    });
  }
};

namespace cohort::testing {

// The reference of the multi-process tests: `model` trained by Mirrored in this process on
// small_task_data(), with the workers' settings (multi_worker_trainer: global batch 64, seed 11,
// Adam at 3e-3). Its parameters.
template <class M>
std::vector<float> mirrored_training(const M& model, std::uint64_t steps, std::size_t replicas,
                                     std::size_t micro_batches) {
  cohort::Trainer trainer(model, cohort::strategy::Mirrored<>({.replicas = replicas}),
                          cohort::optimizer::Adam({.learning_rate = 3e-3}),
                          {.global_batch = 64,
                           .micro_batches = micro_batches,
                           .seed = 11,
                           .progress = cohort::Progress::kSilent});
  trainer.fit(small_task_data(), {.steps = steps});
  const auto parameters = cohort::ModelTraits<M>::parameters(const_cast<M&>(trainer.model()));
  return {parameters.begin(), parameters.end()};
}

// The same of the test model without gradient readiness, so that the workers' overlap is checked
// against none: the parameters' bytes.
inline std::string mirrored_parameters(std::uint64_t steps, std::size_t replicas = 4,
                                       std::size_t micro_batches = 8) {
  return bytes_of(
      mirrored_training(WithoutReadiness{small_model()}, steps, replicas, micro_batches));
}

}  // namespace cohort::testing
