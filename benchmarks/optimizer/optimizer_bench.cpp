// Throughput of one optimizer step on float, against std::copy of the same number of bytes.
//
// An optimizer step is a handful of flops per element over several arrays, so it is bound by
// memory bandwidth; the copy is the STREAM-like ceiling measured in the same run on the same
// machine. Each optimizer is paired with a copy that moves the bytes its step moves, so the two
// bytes_per_second figures divide directly.
//
//   bytes  per iteration: each input read once, each output written once
//          Sgd      reads p, g        writes p        12 bytes per parameter
//          Momentum reads p, g, v     writes p, v     20
//          Adam(W)  reads p, g, m, v  writes p, m, v  28
//   copy<O>/n copies half of step<O>/n's bytes from one array to another (read once, written once).
//   cpu_step<O>/n is the update the host strategies apply (device::cpu::step_finite: o's rule in a
//   loop that also tests each gradient for infinities and NaNs); cpu_step_into<O>/n the same, read
//   from one buffer and written to another (device::cpu::step_into, a synchronous parameter
//   server's), the same bytes.
//   Neither figure counts the read-for-ownership a cache makes before writing a line that was not
//   read: the copy pays it on its destination, an in-place update does not.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "cohort/device/cpu.hpp"
#include "cohort/optimizer/adam.hpp"
#include "cohort/optimizer/momentum.hpp"
#include "cohort/optimizer/sgd.hpp"

namespace {

using cohort::optimizer::Adam;
using cohort::optimizer::AdamW;
using cohort::optimizer::Momentum;
using cohort::optimizer::Sgd;

template <class O>
O make_optimizer() {
  typename O::Options options;
  options.learning_rate = 1e-3;
  options.weight_decay = 1e-2;
  return O(options);
}

// Every parameter and state slot is read and written, the gradient only read.
template <class O>
constexpr std::size_t kBytesPerParameter = sizeof(float) *
                                           ((2 + O::kStateSlots) + (1 + O::kStateSlots));

template <class O>
void step(benchmark::State& state) {
  const auto count = static_cast<std::size_t>(state.range(0));
  const O optimizer = make_optimizer<O>();
  std::vector<float> params(count, 1.0f);
  std::vector<float> gradients(count);
  for (std::size_t i = 0; i < count; ++i) {
    gradients[i] = static_cast<float>(i % 64) / 256.0f - 0.125f;
  }
  std::vector<float> optimizer_state(O::kStateSlots * count, 0.0f);

  std::uint64_t t = 0;
  for (auto _ : state) {
    optimizer.template step<float>(params, gradients, optimizer_state,
                                   {.step = ++t, .gradient_scale = 1.0 / 64});
    benchmark::DoNotOptimize(params.data());
    benchmark::ClobberMemory();
  }
  const auto bytes = static_cast<std::int64_t>(kBytesPerParameter<O> * count);
  state.SetBytesProcessed(state.iterations() * bytes);
  state.counters["bytes"] = static_cast<double>(bytes);
}

// The inputs of an update of `count` parameters.
template <class O>
struct Update {
  explicit Update(std::size_t count)
      : parameters(count, 1.0f), other(count), gradients(count), state(O::kStateSlots * count) {
    for (std::size_t i = 0; i < count; ++i) {
      gradients[i] = static_cast<float>(i % 64) / 256.0f - 0.125f;
    }
  }
  std::vector<float> parameters, other, gradients, state;
};

// Times apply(optimizer, update, context) over state.range(0) parameters, counted as step<O>'s
// bytes.
template <class O, class Apply>
void measure_update(benchmark::State& state, Apply apply) {
  const auto count = static_cast<std::size_t>(state.range(0));
  const O optimizer = make_optimizer<O>();
  Update<O> update(count);
  std::uint64_t t = 0;
  for (auto _ : state) {
    apply(optimizer, update,
          cohort::optimizer::StepContext{.step = ++t, .gradient_scale = 1.0 / 64});
    benchmark::DoNotOptimize(update.parameters.data());
    benchmark::ClobberMemory();
  }
  const auto bytes = static_cast<std::int64_t>(kBytesPerParameter<O> * count);
  state.SetBytesProcessed(state.iterations() * bytes);
}

template <class O>
void cpu_step(benchmark::State& state) {
  measure_update<O>(state, [](const O& o, Update<O>& update, auto context) {
    benchmark::DoNotOptimize(cohort::device::cpu::step_finite<O, float>(
        o, update.parameters, update.gradients, update.state, context));
  });
}

template <class O>
void cpu_step_into(benchmark::State& state) {
  measure_update<O>(state, [](const O& o, Update<O>& update, auto context) {
    cohort::device::cpu::step_into<O, float>(o, update.parameters, update.other, update.gradients,
                                             update.state, context);
    std::swap(update.parameters, update.other);
  });
}

template <class O>
void copy(benchmark::State& state) {
  const auto count = static_cast<std::size_t>(state.range(0));
  const std::size_t floats = kBytesPerParameter<O> * count / (2 * sizeof(float));
  const std::vector<float> source(floats, 1.0f);
  std::vector<float> destination(floats, 0.0f);
  for (auto _ : state) {
    std::copy(source.begin(), source.end(), destination.begin());
    benchmark::DoNotOptimize(destination.data());
    benchmark::ClobberMemory();
  }
  const auto bytes = static_cast<std::int64_t>(2 * sizeof(float) * floats);
  state.SetBytesProcessed(state.iterations() * bytes);
  state.counters["bytes"] = static_cast<double>(bytes);
}

constexpr std::int64_t kMi = std::int64_t{1} << 20;

#define COHORT_OPTIMIZER_BENCHMARK(O)                                                           \
  BENCHMARK_TEMPLATE(step, O)->Arg(kMi)->Arg(16 * kMi)->Unit(benchmark::kMillisecond);          \
  BENCHMARK_TEMPLATE(cpu_step, O)->Arg(kMi)->Arg(16 * kMi)->Unit(benchmark::kMillisecond);      \
  BENCHMARK_TEMPLATE(cpu_step_into, O)->Arg(kMi)->Arg(16 * kMi)->Unit(benchmark::kMillisecond); \
  BENCHMARK_TEMPLATE(copy, O)->Arg(kMi)->Arg(16 * kMi)->Unit(benchmark::kMillisecond)

COHORT_OPTIMIZER_BENCHMARK(Sgd);
COHORT_OPTIMIZER_BENCHMARK(Momentum);
COHORT_OPTIMIZER_BENCHMARK(Adam);
COHORT_OPTIMIZER_BENCHMARK(AdamW);

}  // namespace
