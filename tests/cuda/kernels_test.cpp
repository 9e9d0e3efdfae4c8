// The kernels of cuda/launch.hpp against device/cpu.hpp on random inputs of odd lengths. Where the
// order of operations is the CPU's, results are compared bit for bit (==), never with a tolerance.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <iterator>
#include <limits>
#include <memory>
#include <span>
#include <type_traits>
#include <vector>

#include "cohort/core/reduction_tree.hpp"
#include "cohort/cuda/launch.hpp"
#include "cohort/device/cpu.hpp"
#include "cohort/optimizer/adam.hpp"
#include "cohort/optimizer/momentum.hpp"
#include "cohort/optimizer/sgd.hpp"
#include "gpu.hpp"

namespace {

using cohort::ReduceOp;
using cohort::cuda::bfloat16;
using cohort::cuda::half;
using cohort::test::DeviceBuffer;
using cohort::test::gpu_only;
using cohort::test::odd_lengths;
using cohort::test::random_floats;
using cohort::test::same_bits;

// The host side of cuda/common.cuh's Arithmetic: half and bfloat16 computed in float, rounded.
template <class T>
struct Host {
  static T from(float x) { return static_cast<T>(x); }
  static T widen(T x) { return x; }
  static T round(T x) { return x; }
};
template <>
struct Host<half> {
  static half from(float x) { return __float2half_rn(x); }
  static float widen(half x) { return __half2float(x); }
  static half round(float x) { return __float2half_rn(x); }
};
template <>
struct Host<bfloat16> {
  static bfloat16 from(float x) { return __float2bfloat16_rn(x); }
  static float widen(bfloat16 x) { return __bfloat162float(x); }
  static bfloat16 round(float x) { return __float2bfloat16_rn(x); }
};

template <class T>
std::vector<T> random_values(std::size_t n, std::uint64_t seed) {
  std::vector<T> values;
  values.reserve(n);
  for (float x : random_floats(n, seed)) values.push_back(Host<T>::from(x));
  return values;
}

template <class T>
void check_scale_and_axpy() {
  for (std::size_t n : odd_lengths()) {
    CAPTURE(n);
    const std::vector<T> x = random_values<T>(n, 11 + n);
    const std::vector<T> y = random_values<T>(n, 12 + n);
    const T alpha = Host<T>::from(0.3f);
    std::vector<T> scaled = x;
    std::vector<T> summed = y;
    for (std::size_t i = 0; i < n; ++i) {
      scaled[i] = Host<T>::round(Host<T>::widen(alpha) * Host<T>::widen(x[i]));
      const T product = Host<T>::round(Host<T>::widen(alpha) * Host<T>::widen(x[i]));
      summed[i] = Host<T>::round(Host<T>::widen(product) + Host<T>::widen(y[i]));
    }
    if constexpr (std::is_floating_point_v<T>) {  // the reference itself, where it is defined
      std::vector<T> cpu_scaled = x;
      std::vector<T> cpu_summed = y;
      cohort::device::cpu::scale(std::span<T>(cpu_scaled), alpha);
      cohort::device::cpu::axpy(alpha, std::span<const T>(x), std::span<T>(cpu_summed));
      REQUIRE(same_bits(scaled, cpu_scaled));
      REQUIRE(same_bits(summed, cpu_summed));
    }
    DeviceBuffer<T> dx(x);
    DeviceBuffer<T> dy(y);
    cohort::cuda::axpy(alpha, dx.data(), dy.data(), n, nullptr);
    cohort::cuda::scale(dx.data(), n, alpha, nullptr);
    COHORT_CUDA_CHECK(cudaDeviceSynchronize());
    CHECK(same_bits(dx.download(), scaled));
    CHECK(same_bits(dy.download(), summed));
  }
}

template <class T>
void check_combine_into() {
  for (std::size_t n : odd_lengths()) {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kProduct, ReduceOp::kMin, ReduceOp::kMax}) {
      CAPTURE(n);
      CAPTURE(cohort::name(op));
      const std::vector<T> x = random_values<T>(n, 21 + n);
      const std::vector<T> y = random_values<T>(n, 22 + n);
      std::vector<T> expected = x;
      for (std::size_t i = 0; i < n; ++i) {
        expected[i] =
            Host<T>::round(cohort::combine(op, Host<T>::widen(x[i]), Host<T>::widen(y[i])));
      }
      if constexpr (std::is_floating_point_v<T>) {
        std::vector<T> cpu = x;
        cohort::device::cpu::combine_into(op, std::span<T>(cpu), std::span<const T>(y));
        REQUIRE(same_bits(expected, cpu));
      }
      DeviceBuffer<T> dx(x);
      DeviceBuffer<T> dy(y);
      cohort::cuda::combine_into(op, dx.data(), dy.data(), n, nullptr);
      COHORT_CUDA_CHECK(cudaDeviceSynchronize());
      CHECK(same_bits(dx.download(), expected));
    }
  }
}

// The canonical tree per element, node by node, rounding each node to T: the definition.
template <class T>
std::vector<T> tree_reference(ReduceOp op, const std::vector<std::vector<T>>& inputs) {
  const std::size_t n = inputs[0].size();
  std::vector<T> out(n);
  for (std::size_t i = 0; i < n; ++i) {
    out[i] = cohort::tree::fold(
        inputs.size(), [&](std::size_t k) { return inputs[k][i]; },
        [&](T a, T b) {
          return Host<T>::round(cohort::combine(op, Host<T>::widen(a), Host<T>::widen(b)));
        });
  }
  return out;
}

template <class T>
void check_reduce_tree() {
  for (std::size_t inputs_count : {1u, 2u, 3u, 5u, 8u, 13u, 64u}) {
    for (std::size_t n :
         {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{4099}, std::size_t{65537}}) {
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax, ReduceOp::kProduct}) {
        CAPTURE(inputs_count);
        CAPTURE(n);
        CAPTURE(cohort::name(op));
        std::vector<std::vector<T>> inputs;
        std::vector<std::unique_ptr<DeviceBuffer<T>>> device_inputs;
        std::vector<const T*> pointers;
        for (std::size_t k = 0; k < inputs_count; ++k) {
          inputs.push_back(random_values<T>(n, 1000 * k + n));
          device_inputs.push_back(std::make_unique<DeviceBuffer<T>>(inputs.back()));
          pointers.push_back(device_inputs.back()->data());
        }
        const std::vector<T> expected = tree_reference(op, inputs);
        if constexpr (std::is_floating_point_v<T>) {
          std::vector<const T*> host_pointers;
          for (const auto& input : inputs) host_pointers.push_back(input.data());
          std::vector<T> cpu(n);
          cohort::device::cpu::reduce_tree(op, std::span<const T* const>(host_pointers),
                                           std::span<T>(cpu));
          REQUIRE(same_bits(expected, cpu));
        }
        DeviceBuffer<T> out(n);
        cohort::cuda::reduce_tree(op, std::span<const T* const>(pointers), out.data(), n, nullptr);
        COHORT_CUDA_CHECK(cudaDeviceSynchronize());
        CHECK(same_bits(out.download(), expected));
      }
    }
  }
}

template <class T>
void check_sum_of_squares() {
  std::vector<std::size_t> lengths = odd_lengths();
  lengths.push_back(37 * 4096 + 5);  // 38 blocks: an incomplete tree
  for (std::size_t n : lengths) {
    CAPTURE(n);
    const std::vector<T> x = random_values<T>(n, 77 + n);
    std::vector<double> widened(n);
    for (std::size_t i = 0; i < n; ++i) widened[i] = static_cast<double>(Host<T>::widen(x[i]));
    const double expected = cohort::device::cpu::sum_of_squares(std::span<const double>(widened));
    if constexpr (std::is_floating_point_v<T>) {
      CHECK(cohort::device::cpu::sum_of_squares(std::span<const T>(x)) == expected);
    }
    DeviceBuffer<T> dx(x);
    DeviceBuffer<double> workspace(cohort::cuda::sum_of_squares_workspace(n));
    DeviceBuffer<double> result(1);
    cohort::cuda::sum_of_squares(dx.data(), n, workspace.data(), result.data(), nullptr);
    COHORT_CUDA_CHECK(cudaDeviceSynchronize());
    CHECK(result.download()[0] == expected);
  }
}

template <class T>
void check_flag_nonfinite() {
  const std::size_t n = 4099;
  for (float bad : {std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                    std::numeric_limits<float>::quiet_NaN(), 1.0f}) {
    for (std::size_t at : {std::size_t{0}, std::size_t{4098}}) {
      std::vector<T> x = random_values<T>(n, 5);
      x[at] = Host<T>::from(bad);
      DeviceBuffer<T> dx(x);
      DeviceBuffer<int> flag(std::vector<int>{0});
      cohort::cuda::flag_nonfinite(dx.data(), n, flag.data(), nullptr);
      COHORT_CUDA_CHECK(cudaDeviceSynchronize());
      CHECK(flag.download()[0] == (std::isfinite(bad) ? 0 : 1));
    }
  }
}

// first_nonfinite: the least index of an infinity or NaN, as device::cpu::first_nonfinite, with
// the slot left as it was (all ones) when there is none.
template <class T>
void check_first_nonfinite() {
  for (std::size_t n : odd_lengths()) {
    CAPTURE(n);
    if (n == 0) continue;
    for (std::size_t at : {std::size_t{0}, n / 3, n - 1}) {
      std::vector<T> x = random_values<T>(n, 9);
      std::vector<float> widened;
      x[at] = Host<T>::from(std::numeric_limits<float>::quiet_NaN());
      x[n - 1] = Host<T>::from(std::numeric_limits<float>::infinity());
      for (const T value : x) widened.push_back(static_cast<float>(Host<T>::widen(value)));
      DeviceBuffer<T> dx(x);
      DeviceBuffer<unsigned long long> first(std::vector<unsigned long long>{~0ull});
      cohort::cuda::first_nonfinite(dx.data(), n, first.data(), nullptr);
      COHORT_CUDA_CHECK(cudaDeviceSynchronize());
      CHECK(first.download()[0] ==
            cohort::device::cpu::first_nonfinite(std::span<const float>(widened)));
    }
    DeviceBuffer<T> finite(random_values<T>(n, 10));
    DeviceBuffer<unsigned long long> none(std::vector<unsigned long long>{~0ull});
    cohort::cuda::first_nonfinite(finite.data(), n, none.data(), nullptr);
    COHORT_CUDA_CHECK(cudaDeviceSynchronize());
    CHECK(none.download()[0] == ~0ull);
  }
}

// What cast must give, computed on the host: the CUDA headers' host conversion to half or
// bfloat16 (round to nearest even), else a static_cast through the source's float value.
template <class To, class From>
To host_cast(From x) {
  if constexpr (std::is_same_v<To, half> || std::is_same_v<To, bfloat16>) {
    return Host<To>::round(x);
  } else {
    return static_cast<To>(Host<From>::widen(x));
  }
}

// Values that round in every narrower type, overflow half (65504), and are subnormal in half,
// bfloat16 or float; doubles carry bits beyond a float's.
template <class From>
std::vector<From> cast_inputs(std::size_t n, std::uint64_t seed) {
  constexpr float kScales[] = {1.0f, 7.0e4f, 3.0e-6f, 1.0e-40f, 3.0e38f};
  const std::vector<float> base = random_floats(n, seed);
  std::vector<From> values(n);
  for (std::size_t i = 0; i < n; ++i) {
    const float x = base[i] * kScales[i % std::size(kScales)];
    if constexpr (std::is_same_v<From, double>) {
      values[i] = static_cast<double>(x) * (1.0 + 0x1.0p-40);
    } else {
      values[i] = Host<From>::from(x);
    }
  }
  return values;
}

template <class From, class To>
void check_cast() {
  for (std::size_t n : odd_lengths()) {
    CAPTURE(n);
    const std::vector<From> in = cast_inputs<From>(n, 17 + n);
    std::vector<To> expected(n);
    for (std::size_t i = 0; i < n; ++i) expected[i] = host_cast<To>(in[i]);
    DeviceBuffer<From> d_in(in);
    DeviceBuffer<To> d_out(n);
    cohort::cuda::cast(d_in.data(), d_out.data(), n, nullptr);
    COHORT_CUDA_CHECK(cudaDeviceSynchronize());
    CHECK(same_bits(d_out.download(), expected));
  }
}

// Three steps of optimizer o on the GPU and on the CPU, from the same random start: same bits.
template <class O, class P, class G>
void check_update(const O& o) {
  for (std::size_t n : odd_lengths()) {
    CAPTURE(n);
    std::vector<P> params = random_values<P>(n, 1 + n);
    std::vector<P> state(O::kStateSlots * n, P{0});
    DeviceBuffer<P> d_params(params);
    DeviceBuffer<P> d_state(state);
    DeviceBuffer<int> flag(std::vector<int>{0});
    for (std::uint64_t step = 1; step <= 3; ++step) {
      const std::vector<G> gradients = random_values<G>(n, 100 * step + n);
      std::vector<P> widened(n);
      for (std::size_t i = 0; i < n; ++i) widened[i] = static_cast<P>(Host<G>::widen(gradients[i]));
      const cohort::optimizer::StepContext context{.step = step, .gradient_scale = 0.25};
      o.step(std::span<P>(params), std::span<const P>(widened), std::span<P>(state), context);
      DeviceBuffer<G> d_gradients(gradients);
      cohort::cuda::step(o, d_params.data(), d_gradients.data(), d_state.data(), n, context,
                         nullptr, flag.data());
      COHORT_CUDA_CHECK(cudaDeviceSynchronize());
    }
    CHECK(same_bits(d_params.download(), params));
    CHECK(same_bits(d_state.download(), state));
    CHECK(flag.download()[0] == 0);
  }
}

template <class P, class G>
void check_every_optimizer() {
  check_update<cohort::optimizer::Sgd, P, G>(
      cohort::optimizer::Sgd({.learning_rate = 0.1, .weight_decay = 0.01}));
  check_update<cohort::optimizer::Momentum, P, G>(cohort::optimizer::Momentum(
      {.learning_rate = 0.1, .momentum = 0.9, .nesterov = true, .weight_decay = 0.01}));
  check_update<cohort::optimizer::Adam, P, G>(
      cohort::optimizer::Adam({.learning_rate = 1e-3, .weight_decay = 0.01}));
  check_update<cohort::optimizer::AdamW, P, G>(cohort::optimizer::AdamW({.learning_rate = 1e-3}));
}

}  // namespace

TEST_CASE("scale and axpy equal the CPU bit for bit for every type" * gpu_only()) {
  check_scale_and_axpy<float>();
  check_scale_and_axpy<double>();
  check_scale_and_axpy<half>();
  check_scale_and_axpy<bfloat16>();
}

TEST_CASE("combine_into equals device::cpu::combine_into bit for bit for every type" * gpu_only()) {
  check_combine_into<float>();
  check_combine_into<double>();
  check_combine_into<half>();
  check_combine_into<bfloat16>();
}

TEST_CASE("reduce_tree equals device::cpu::reduce_tree bit for bit" * gpu_only()) {
  check_reduce_tree<float>();
  check_reduce_tree<double>();
  check_reduce_tree<half>();
  check_reduce_tree<bfloat16>();
}

TEST_CASE("sum_of_squares equals device::cpu::sum_of_squares bit for bit" * gpu_only()) {
  check_sum_of_squares<float>();
  check_sum_of_squares<double>();
  check_sum_of_squares<half>();
  check_sum_of_squares<bfloat16>();
}

TEST_CASE("sum_of_squares adds each block in index order across warps, CTAs and partial blocks" *
          gpu_only()) {
  // Magnitudes over 40 binades: any other order of a block's additions changes low bits.
  for (const std::size_t n :
       {std::size_t{32 * 4096 - 1}, std::size_t{32 * 4096}, std::size_t{32 * 4096 + 1},
        std::size_t{4 * 32 * 4096 + 4097}, std::size_t{600 * 4096 + 31}}) {
    CAPTURE(n);
    std::vector<float> x = random_floats(n, 5 + n);
    for (std::size_t i = 0; i < n; ++i)
      x[i] = std::ldexp(x[i], static_cast<int>(i * 7919 % 40) - 20);
    const double expected = cohort::device::cpu::sum_of_squares(std::span<const float>(x));
    DeviceBuffer<float> dx(x);
    DeviceBuffer<double> workspace(cohort::cuda::sum_of_squares_workspace(n));
    DeviceBuffer<double> result(1);
    cohort::cuda::sum_of_squares(dx.data(), n, workspace.data(), result.data(), nullptr);
    COHORT_CUDA_CHECK(cudaDeviceSynchronize());
    const double gpu = result.download()[0];
    CHECK(std::memcmp(&gpu, &expected, sizeof(double)) == 0);
  }
}

TEST_CASE("sum_of_squares is not finite when a float gradient is not" * gpu_only()) {
  std::vector<float> x = random_floats(3 * 4096 + 1, 9);
  x[5000] = std::numeric_limits<float>::infinity();
  DeviceBuffer<float> dx(x);
  DeviceBuffer<double> workspace(cohort::cuda::sum_of_squares_workspace(x.size()));
  DeviceBuffer<double> result(1);
  cohort::cuda::sum_of_squares(dx.data(), x.size(), workspace.data(), result.data(), nullptr);
  COHORT_CUDA_CHECK(cudaDeviceSynchronize());
  CHECK_FALSE(std::isfinite(result.download()[0]));
}

TEST_CASE("cast rounds as the host conversions do, to nearest even, bit for bit" * gpu_only()) {
  check_cast<float, half>();
  check_cast<half, float>();
  check_cast<float, bfloat16>();
  check_cast<bfloat16, float>();
  check_cast<float, double>();
  check_cast<double, float>();
}

TEST_CASE("flag_nonfinite finds one infinity or NaN anywhere" * gpu_only()) {
  check_flag_nonfinite<float>();
  check_flag_nonfinite<double>();
  check_flag_nonfinite<half>();
  check_flag_nonfinite<bfloat16>();
}

TEST_CASE("first_nonfinite finds the least index of an infinity or NaN, as the CPU" * gpu_only()) {
  check_first_nonfinite<float>();
  check_first_nonfinite<double>();
  check_first_nonfinite<half>();
  check_first_nonfinite<bfloat16>();
}

TEST_CASE("optimizer steps equal the CPU bit for bit with float gradients" * gpu_only()) {
  check_every_optimizer<float, float>();
}

TEST_CASE("optimizer steps equal the CPU bit for bit with half gradients" * gpu_only()) {
  check_every_optimizer<float, half>();
}

TEST_CASE("optimizer steps equal the CPU bit for bit with bfloat16 gradients" * gpu_only()) {
  check_every_optimizer<float, bfloat16>();
}

TEST_CASE("optimizer steps equal the CPU bit for bit in double" * gpu_only()) {
  check_every_optimizer<double, double>();
}

TEST_CASE("update flags a non-finite gradient" * gpu_only()) {
  for (const std::size_t n : {std::size_t{1024}, std::size_t{1025}}) {  // 16 bytes at a time, or 1
    CAPTURE(n);
    std::vector<float> gradients = random_floats(n, 3);
    gradients[n - 1] = std::numeric_limits<float>::quiet_NaN();
    DeviceBuffer<float> params(random_floats(n, 4));
    DeviceBuffer<float> d_gradients(gradients);
    DeviceBuffer<int> flag(std::vector<int>{0});
    const cohort::optimizer::Sgd sgd({.learning_rate = 0.1});
    cohort::cuda::step(sgd, params.data(), d_gradients.data(), static_cast<float*>(nullptr), n, {},
                       nullptr, flag.data());
    COHORT_CUDA_CHECK(cudaDeviceSynchronize());
    CHECK(flag.download()[0] == 1);
  }
}

TEST_CASE("reduce_tree refuses more than kMaxTreeInputs buffers") {
  std::vector<const float*> pointers(cohort::cuda::kMaxTreeInputs + 1, nullptr);
  CHECK_THROWS_AS(cohort::cuda::reduce_tree(ReduceOp::kSum, std::span<const float* const>(pointers),
                                            static_cast<float*>(nullptr), 1, nullptr),
                  cohort::ConfigError);
}
