// The examples' Eigen MLP (examples/common/eigen_mlp.hpp) at the size users compare against
// other frameworks: 784-1024-1024-10, a micro-batch of 64.
//
//   forward_backward/batch:64/threads:T   one forward and backward pass of a micro-batch on T
//                                          threads; counter `examples` (per second)
//   optimizer_step                         Adam's update of the model's parameters, as a step
//                                          applies it (device::Cpu::step_finite)
//   trainer_step/batch:64                  one training step of cohort::Trainer (Mirrored, 1
//                                          replica, Adam): forward_backward, the optimizer step
//                                          and the Trainer's own work; well above the sum of the
//                                          two above, something in the step is slow
//   gemm/PRODUCT/m:M/n:N/k:K               one of the model's products, written as the model writes
//                                          it, so computed by the same library (OpenBLAS or
//                                          Eigen's kernels, as built): C (M x N) = A (M x K) B
//                                          (K x N); counter `gflops` (2MNK per product, per
//                                          second), on the calling thread only
// The products are the first layer's three: forward (1024 x 784 weights times 784 x 64 inputs),
// weight_gradient (784 x 64 times 64 x 1024) and input_gradient (784 x 1024 times 1024 x 64);
// with the second layer's, of the same kinds, they are nearly all of forward_backward's work.
#include <benchmark/benchmark.h>

#include <Eigen/Core>
#include <cohort/device/cpu.hpp>
#include <cohort/optimizer/adam.hpp>
#include <cohort/strategy/mirrored.hpp>
#include <cohort/trainer.hpp>
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <vector>

#include "clusters.hpp"
#include "eigen_mlp.hpp"

namespace {

const std::vector<std::size_t> kLayers{784, 1024, 1024, 10};

void forward_backward(benchmark::State& state) {
  const auto batch_size = static_cast<std::size_t>(state.range(0));
  const auto threads = static_cast<std::size_t>(state.range(1));
  const example::ClusterTask task({.features = kLayers.front(), .classes = kLayers.back()});
  std::vector<std::size_t> indices(batch_size);
  std::iota(indices.begin(), indices.end(), 0);
  const example::Batch batch = task.sample(batch_size, 0).batch(indices);
  example::EigenMlp model(kLayers, 1, threads);
  model.forward_backward(batch);  // the buffers are sized here, not in the timed loop
  for (auto _ : state) {
    benchmark::DoNotOptimize(model.forward_backward(batch));
  }
  state.counters["examples"] = benchmark::Counter(static_cast<double>(batch_size),
                                                  benchmark::Counter::kIsIterationInvariantRate);
  state.SetLabel("784-1024-1024-10");
}

void optimizer_step(benchmark::State& state) {
  example::EigenMlp model(kLayers, 1, 1);
  const std::span<float> parameters = model.parameters();
  const std::vector<float> gradient(parameters.size(), 1e-3f);
  const cohort::optimizer::Adam adam({.learning_rate = 1e-3});
  std::vector<float> adam_state(cohort::optimizer::Adam::kStateSlots * parameters.size(), 0.0f);
  std::uint64_t step = 0;
  for (auto _ : state) {
    benchmark::DoNotOptimize(cohort::device::Cpu::step_finite<cohort::optimizer::Adam, float>(
        {}, adam, parameters, gradient, adam_state, {.step = ++step, .gradient_scale = 1.0}));
  }
  state.SetLabel(std::to_string(parameters.size()) + " parameters");
}

void trainer_step(benchmark::State& state) {
  const auto batch_size = static_cast<std::size_t>(state.range(0));
  constexpr std::uint64_t kStepsPerFit = 20;
  const example::ClusterTask task({.features = kLayers.front(), .classes = kLayers.back()});
  const example::ClusterData data = task.sample(batch_size * kStepsPerFit, 0);
  cohort::Trainer trainer(
      example::EigenMlp(kLayers, 1, 1), cohort::strategy::Mirrored<>({.replicas = 1}),
      cohort::optimizer::Adam({.learning_rate = 1e-3}),
      {.global_batch = batch_size, .micro_batches = 1, .progress = cohort::Progress::kSilent});
  trainer.fit(data, {.steps = kStepsPerFit});  // buffers and threads are made here, untimed
  for (auto _ : state) {
    trainer.fit(data, {.steps = trainer.step() + kStepsPerFit});
  }
  state.counters["examples"] = benchmark::Counter(static_cast<double>(batch_size * kStepsPerFit),
                                                  benchmark::Counter::kIsIterationInvariantRate);
  state.SetLabel("20 steps per iteration");
}

// How the model's products are written (column-major, the weights transposed in the forward
// product and the deltas in the weight gradient's), so that each resolves to the same kernel.
enum Shape { kForward, kWeightGradient, kInputGradient };

void gemm(benchmark::State& state, Shape shape) {
  using Matrix = Eigen::MatrixXf;
  const auto m = static_cast<Eigen::Index>(state.range(0));
  const auto n = static_cast<Eigen::Index>(state.range(1));
  const auto k = static_cast<Eigen::Index>(state.range(2));
  // A model made first, as in a program: with OpenBLAS, this sets it to one thread per call.
  const example::EigenMlp model({1, 1}, 0);
  Matrix c = Matrix::Zero(m, n);
  switch (shape) {
    case kForward: {  // Z = W^T X
      const Matrix w = Matrix::Random(k, m);
      const Matrix x = Matrix::Random(k, n);
      for (auto _ : state) {
        c.noalias() = w.transpose() * x;
        benchmark::DoNotOptimize(c.data());
      }
      break;
    }
    case kWeightGradient: {  // dW = X D^T
      const Matrix x = Matrix::Random(m, k);
      const Matrix d = Matrix::Random(n, k);
      for (auto _ : state) {
        c.noalias() = x * d.transpose();
        benchmark::DoNotOptimize(c.data());
      }
      break;
    }
    case kInputGradient: {  // D below = W D
      const Matrix w = Matrix::Random(m, k);
      const Matrix d = Matrix::Random(k, n);
      for (auto _ : state) {
        c.noalias() = w * d;
        benchmark::DoNotOptimize(c.data());
      }
      break;
    }
  }
  state.counters["gflops"] = benchmark::Counter(2e-9 * static_cast<double>(m * n * k),
                                                benchmark::Counter::kIsIterationInvariantRate);
}

BENCHMARK(forward_backward)
    ->ArgNames({"batch", "threads"})
    ->Args({64, 1})
    ->Args({64, 2})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

BENCHMARK(optimizer_step)->Unit(benchmark::kMillisecond);

BENCHMARK(trainer_step)->ArgNames({"batch"})->Arg(64)->UseRealTime()->Unit(benchmark::kMillisecond);

BENCHMARK_CAPTURE(gemm, forward, kForward)
    ->ArgNames({"m", "n", "k"})
    ->Args({1024, 64, 784})
    ->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(gemm, weight_gradient, kWeightGradient)
    ->ArgNames({"m", "n", "k"})
    ->Args({784, 1024, 64})
    ->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(gemm, input_gradient, kInputGradient)
    ->ArgNames({"m", "n", "k"})
    ->Args({784, 64, 1024})
    ->Unit(benchmark::kMicrosecond);

}  // namespace
