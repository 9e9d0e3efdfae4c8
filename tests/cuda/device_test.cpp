// device::Cuda, the per-device interface of the Trainer's step (device/device.hpp), against
// device::Cpu, the reference: the same calls on the same values give the same bits.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <limits>
#include <mutex>
#include <optional>
#include <span>
#include <stop_token>
#include <thread>
#include <vector>

#include "cohort/device/cpu.hpp"
#include "cohort/device/cuda.hpp"
#include "cohort/optimizer/adam.hpp"
#include "gpu.hpp"

namespace {

using cohort::device::Cpu;
using cohort::device::Cuda;
using cohort::test::gpu_only;
using cohort::test::random_floats;
using cohort::test::same_bits;

static_assert(cohort::device::Device<Cpu>);
static_assert(cohort::device::Device<Cuda>);

std::vector<float> host_copy(const cohort::device::cuda::Place& place,
                             const Cuda::Buffer<float>& buffer) {
  std::vector<float> host(buffer.size());
  Cuda::to_host(place, buffer.span(), std::span<float>(host));
  return host;
}

}  // namespace

TEST_CASE("device::Cuda buffers start at zero and copy to and from the host" * gpu_only()) {
  const cohort::device::cuda::Stream stream(0);
  for (std::size_t n : cohort::test::odd_lengths()) {
    CAPTURE(n);
    Cuda::Buffer<float> buffer(n, stream.place());
    CHECK(buffer.size() == n);
    CHECK(same_bits(host_copy(stream.place(), buffer), std::vector<float>(n, 0.0f)));
    const std::vector<float> values = random_floats(n, 3 + n);
    Cuda::from_host(stream.place(), std::span<const float>(values), buffer.span());
    Cuda::Buffer<float> copy(n, stream.place());
    Cuda::copy(stream.place(), std::span<const float>(buffer.span()), copy.span());
    CHECK(same_bits(host_copy(stream.place(), copy), values));
    Cuda::Buffer<float> moved = std::move(copy);
    CHECK(copy.size() == 0);
    CHECK(same_bits(host_copy(stream.place(), moved), values));
  }
}

TEST_CASE("device::Cuda's add_into, sum_of_squares and step equal device::Cpu's bit for bit" *
          gpu_only()) {
  const cohort::device::cuda::Stream stream(0);
  const auto place = stream.place();
  const cohort::optimizer::Adam adam({.learning_rate = 1e-3, .weight_decay = 0.01});
  for (std::size_t n : cohort::test::odd_lengths()) {
    CAPTURE(n);
    std::vector<float> sum = random_floats(n, 10 + n);
    const std::vector<float> addend = random_floats(n, 20 + n);
    std::vector<float> parameters = random_floats(n, 30 + n);
    std::vector<float> state(cohort::optimizer::Adam::kStateSlots * n, 0.0f);

    Cuda::Buffer<float> d_sum(n, place);
    Cuda::Buffer<float> d_addend(n, place);
    Cuda::Buffer<float> d_parameters(n, place);
    Cuda::Buffer<float> d_state(state.size(), place);
    Cuda::from_host(place, std::span<const float>(sum), d_sum.span());
    Cuda::from_host(place, std::span<const float>(addend), d_addend.span());
    Cuda::from_host(place, std::span<const float>(parameters), d_parameters.span());

    const Cpu::Place host{};
    Cpu::add_into(host, std::span<float>(sum), std::span<const float>(addend));
    Cuda::add_into(place, d_sum.span(), std::span<const float>(d_addend.span()));
    CHECK(same_bits(host_copy(place, d_sum), sum));

    const double cpu_norm = Cpu::sum_of_squares(host, std::span<const float>(sum));
    const double gpu_norm = Cuda::sum_of_squares(place, std::span<const float>(d_sum.span()));
    CHECK(std::memcmp(&cpu_norm, &gpu_norm, sizeof(double)) == 0);

    for (std::uint64_t step = 1; step <= 2; ++step) {
      const cohort::optimizer::StepContext context{.step = step, .gradient_scale = 0.125};
      Cpu::step(host, adam, std::span<float>(parameters), std::span<const float>(sum),
                std::span<float>(state), context);
      Cuda::step(place, adam, d_parameters.span(), std::span<const float>(d_sum.span()),
                 d_state.span(), context);
    }
    CHECK(same_bits(host_copy(place, d_parameters), parameters));
    CHECK(same_bits(host_copy(place, d_state), state));
  }
}

TEST_CASE("device::Cuda's step_finite and first_nonfinite decide as device::Cpu's, with its bits" *
          gpu_only()) {
  const cohort::device::cuda::Stream stream(0);
  const auto place = stream.place();
  const Cpu::Place host{};
  const cohort::optimizer::Adam adam({.learning_rate = 1e-3});
  const cohort::optimizer::StepContext context{.step = 1, .gradient_scale = 0.125};
  for (std::size_t n : cohort::test::odd_lengths()) {
    CAPTURE(n);
    for (const bool poisoned : {false, true}) {
      std::vector<float> gradient = random_floats(n, 40 + n);
      if (poisoned && n > 0) gradient[n / 2] = std::numeric_limits<float>::quiet_NaN();
      std::vector<float> parameters = random_floats(n, 50 + n);
      std::vector<float> state(cohort::optimizer::Adam::kStateSlots * n, 0.0f);
      Cuda::Buffer<float> d_gradient(n, place), d_parameters(n, place),
          d_state(state.size(), place);
      Cuda::from_host(place, std::span<const float>(gradient), d_gradient.span());
      Cuda::from_host(place, std::span<const float>(parameters), d_parameters.span());

      const std::span<const float> d_in(d_gradient.span());
      CHECK(Cuda::first_nonfinite(place, d_in) ==
            Cpu::first_nonfinite(host, std::span<const float>(gradient)));
      const bool cpu_finite =
          Cpu::step_finite(host, adam, std::span<float>(parameters),
                           std::span<const float>(gradient), std::span<float>(state), context);
      const bool gpu_finite =
          Cuda::step_finite(place, adam, d_parameters.span(), d_in, d_state.span(), context);
      CHECK(cpu_finite == !(poisoned && n > 0));
      CHECK(gpu_finite == cpu_finite);
      CHECK(same_bits(host_copy(place, d_parameters), parameters));
      CHECK(same_bits(host_copy(place, d_state), state));
    }
  }
}

TEST_CASE("a Stream whose work never finishes is destroyed within its drain limit" * gpu_only()) {
  using namespace std::chrono_literals;
  std::atomic<bool> released{false};
  // The stream's work ends after 20 s whatever the destructor does, so that the case ends too.
  std::mutex mutex;
  std::condition_variable_any woken;
  std::jthread releaser([&](std::stop_token stop) {
    std::unique_lock lock(mutex);
    woken.wait_for(lock, stop, 20s, [] { return false; });
    released = true;
  });
  std::optional<cohort::device::cuda::Stream> stream(std::in_place, 0, 200ms);
  // Work that waits on the host: the stream stays busy until `released`.
  COHORT_CUDA_CHECK(cudaLaunchHostFunc(
      stream->get(),
      [](void* flag) {
        while (!static_cast<std::atomic<bool>*>(flag)->load()) std::this_thread::sleep_for(1ms);
      },
      &released));
  const auto start = std::chrono::steady_clock::now();
  stream.reset();
  const auto destroying = std::chrono::steady_clock::now() - start;
  releaser.request_stop();
  releaser.join();
  COHORT_CUDA_CHECK(cudaDeviceSynchronize());
  CHECK(destroying < 10s);  // the drain limit, not the 20 s the work takes
}
