// The kernels of cuda/launch.hpp, timed on the GPU with CUDA events (manual time), with
// bytes_per_second counting the bytes each kernel must move (reads + writes, once each).
// BM_copy (cudaMemcpyAsync device to device) is the bandwidth reference of the same run: fused
// Adam's target is >= 85% of it (scripts/gpu-check prints the ratio). Without a GPU the program
// says so and exits 0.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <cstdio>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "cohort/cuda/launch.hpp"
#include "cohort/device/cuda.hpp"
#include "cohort/optimizer/adam.hpp"
#include "cohort/optimizer/momentum.hpp"
#include "cohort/optimizer/sgd.hpp"

namespace {

using cohort::cuda::bfloat16;

// A zeroed device buffer of n values of T.
template <class T>
struct Device {
  explicit Device(std::size_t n) {
    COHORT_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&data), n * sizeof(T)));
    COHORT_CUDA_CHECK(cudaMemset(data, 0, n * sizeof(T)));
  }
  Device(Device&& other) noexcept : data(std::exchange(other.data, nullptr)) {}
  ~Device() { (void)cudaFree(data); }
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;
  T* data = nullptr;
};

// n values of T in [0.5, 1) for an input of a timed kernel: never zeros, which can run faster
// than real data, and never negative, since Adam takes the root of its second moment.
template <class T>
Device<T> filled(std::size_t n) {
  Device<T> buffer(n);
  std::mt19937 engine(static_cast<std::uint32_t>(n));
  std::uniform_real_distribution<float> values(0.5f, 1.0f);
  std::vector<T> host(n);
  for (T& value : host) value = static_cast<T>(values(engine));
  COHORT_CUDA_CHECK(cudaMemcpy(buffer.data, host.data(), n * sizeof(T), cudaMemcpyHostToDevice));
  COHORT_CUDA_CHECK(cudaDeviceSynchronize());
  return buffer;
}

// Times body() on the default stream with events, one measurement per iteration.
template <class Body>
void time_on_gpu(benchmark::State& state, std::int64_t bytes_per_iteration, Body body) {
  cudaEvent_t start = nullptr;
  cudaEvent_t stop = nullptr;
  COHORT_CUDA_CHECK(cudaEventCreate(&start));
  COHORT_CUDA_CHECK(cudaEventCreate(&stop));
  body();  // warm-up: first launch loads the module
  COHORT_CUDA_CHECK(cudaDeviceSynchronize());
  for (auto _ : state) {
    COHORT_CUDA_CHECK(cudaEventRecord(start, nullptr));
    body();
    COHORT_CUDA_CHECK(cudaEventRecord(stop, nullptr));
    COHORT_CUDA_CHECK(cudaEventSynchronize(stop));
    float milliseconds = 0.0f;
    COHORT_CUDA_CHECK(cudaEventElapsedTime(&milliseconds, start, stop));
    state.SetIterationTime(milliseconds / 1e3);
  }
  state.SetBytesProcessed(state.iterations() * bytes_per_iteration);
  (void)cudaEventDestroy(start);
  (void)cudaEventDestroy(stop);
}

void BM_copy(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(0));
  const Device<float> from = filled<float>(n);
  Device<float> to(n);
  time_on_gpu(state, 2 * n * sizeof(float), [&] {
    COHORT_CUDA_CHECK(
        cudaMemcpyAsync(to.data, from.data, n * sizeof(float), cudaMemcpyDeviceToDevice, nullptr));
  });
}

template <class T>
void BM_scale(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(0));
  Device<T> x = filled<T>(n);
  time_on_gpu(state, 2 * n * sizeof(T),
              [&] { cohort::cuda::scale(x.data, n, static_cast<T>(1.0f), nullptr); });
}

template <class T>
void BM_axpy(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(0));
  const Device<T> x = filled<T>(n);
  Device<T> y = filled<T>(n);
  time_on_gpu(state, 3 * n * sizeof(T),
              [&] { cohort::cuda::axpy(static_cast<T>(1.0f), x.data, y.data, n, nullptr); });
}

// Eight gradient buffers (eight GPUs' worth) folded into one.
void BM_reduce_tree_8(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(0));
  std::vector<std::unique_ptr<Device<float>>> inputs;
  std::vector<const float*> pointers;
  for (int k = 0; k < 8; ++k) {
    inputs.push_back(std::make_unique<Device<float>>(filled<float>(n)));
    pointers.push_back(inputs.back()->data);
  }
  Device<float> out(n);
  time_on_gpu(state, 9 * n * sizeof(float), [&] {
    cohort::cuda::reduce_tree(cohort::ReduceOp::kSum, std::span<const float* const>(pointers),
                              out.data, n, nullptr);
  });
}

template <class T>
void BM_sum_of_squares(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(0));
  const Device<T> x = filled<T>(n);
  Device<double> workspace(cohort::cuda::sum_of_squares_workspace(n));
  Device<double> result(1);
  time_on_gpu(state, n * sizeof(T), [&] {
    cohort::cuda::sum_of_squares(x.data, n, workspace.data, result.data, nullptr);
  });
}

void BM_flag_nonfinite(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(0));
  const Device<float> x = filled<float>(n);
  Device<int> flag(1);
  time_on_gpu(state, n * sizeof(float),
              [&] { cohort::cuda::flag_nonfinite(x.data, n, flag.data, nullptr); });
}

template <class From, class To>
void BM_cast(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(0));
  const Device<From> in = filled<From>(n);
  Device<To> out(n);
  time_on_gpu(state, n * (sizeof(From) + sizeof(To)),
              [&] { cohort::cuda::cast(in.data, out.data, n, nullptr); });
}

// One optimizer step over n float parameters with gradients of type G: reads the parameter, the
// gradient and kStateSlots state values, writes the parameter and the state.
template <class O, class G>
void BM_step(benchmark::State& state, const O& o) {
  const auto n = static_cast<std::size_t>(state.range(0));
  Device<float> params = filled<float>(n);
  const Device<G> gradients = filled<G>(n);
  Device<float> optimizer_state = filled<float>(O::kStateSlots * n + 1);
  const std::int64_t bytes =
      static_cast<std::int64_t>(n * (sizeof(G) + (2 + 2 * O::kStateSlots) * sizeof(float)));
  std::uint64_t step = 0;
  time_on_gpu(state, bytes, [&] {
    cohort::cuda::step(o, params.data, gradients.data, optimizer_state.data, n,
                       {.step = ++step, .gradient_scale = 1.0}, nullptr);
  });
}

const cohort::optimizer::Sgd kSgd({.learning_rate = 0.1});
const cohort::optimizer::Momentum kMomentum({.learning_rate = 0.1, .momentum = 0.9});
const cohort::optimizer::Adam kAdam({.learning_rate = 1e-3});
const cohort::optimizer::AdamW kAdamW({.learning_rate = 1e-3});

void BM_sgd(benchmark::State& state) { BM_step<cohort::optimizer::Sgd, float>(state, kSgd); }
void BM_momentum(benchmark::State& state) {
  BM_step<cohort::optimizer::Momentum, float>(state, kMomentum);
}
void BM_adam(benchmark::State& state) { BM_step<cohort::optimizer::Adam, float>(state, kAdam); }
void BM_adamw(benchmark::State& state) { BM_step<cohort::optimizer::AdamW, float>(state, kAdamW); }
void BM_adam_bf16_gradients(benchmark::State& state) {
  BM_step<cohort::optimizer::Adam, bfloat16>(state, kAdam);
}

// 1 Mi elements (launch-bound) and 64 Mi (bandwidth-bound: 256 MiB per float buffer, far beyond
// any L2).
#define COHORT_GPU_BENCHMARK(...) \
  BENCHMARK(__VA_ARGS__)->UseManualTime()->Unit(benchmark::kMicrosecond)->Arg(1 << 20)->Arg(1 << 26)

COHORT_GPU_BENCHMARK(BM_copy);
COHORT_GPU_BENCHMARK(BM_scale<float>);
COHORT_GPU_BENCHMARK(BM_axpy<float>);
COHORT_GPU_BENCHMARK(BM_axpy<bfloat16>);
COHORT_GPU_BENCHMARK(BM_reduce_tree_8);
COHORT_GPU_BENCHMARK(BM_sum_of_squares<float>);
COHORT_GPU_BENCHMARK(BM_sum_of_squares<bfloat16>);
COHORT_GPU_BENCHMARK(BM_flag_nonfinite);
COHORT_GPU_BENCHMARK(BM_cast<float, bfloat16>);
COHORT_GPU_BENCHMARK(BM_cast<bfloat16, float>);
COHORT_GPU_BENCHMARK(BM_sgd);
COHORT_GPU_BENCHMARK(BM_momentum);
COHORT_GPU_BENCHMARK(BM_adam);
COHORT_GPU_BENCHMARK(BM_adamw);
COHORT_GPU_BENCHMARK(BM_adam_bf16_gradients);

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  if (cohort::device::cuda::device_count() == 0) {
    std::printf("bench_cuda: skipped, no usable CUDA device (%s)\n",
                cohort::device::cuda::unavailable().c_str());
    return 0;
  }
  cudaDeviceProp properties{};
  COHORT_CUDA_CHECK(cudaGetDeviceProperties(&properties, 0));
  benchmark::AddCustomContext("cuda_device", properties.name);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
