#include "cohort/optimizer/adam.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

#include "cohort/core/error.hpp"

namespace {

using cohort::optimizer::Adam;
using cohort::optimizer::AdamW;
using cohort::optimizer::StepContext;

constexpr std::size_t kCount = 24;
constexpr std::uint64_t kSteps = 100;
constexpr double kLearningRate = 5e-3;
constexpr double kWeightDecay = 0.1;
constexpr double kGradientScale = 0.125;

// Gradients of both signs over ten orders of magnitude, element i at step t, already rounded to
// float so that the float run and the double reference see the same inputs.
float gradient(std::size_t i, std::uint64_t t) {
  const double magnitude = std::pow(10.0, static_cast<double>(i % 6) * 2.0 - 8.0);
  return static_cast<float>(std::sin(0.37 * static_cast<double>(i) + 1.3 * static_cast<double>(t)) *
                            magnitude);
}

float initial_param(std::size_t i) { return 3.0f + static_cast<float>(i % 8) * 0.125f; }

// Adam as the papers write it, entirely in double: bias-corrected moments, then the update.
std::vector<double> reference(bool decoupled) {
  constexpr double kBeta1 = 0.9;
  constexpr double kBeta2 = 0.999;
  constexpr double kEpsilon = 1e-8;
  std::vector<double> p(kCount);
  std::vector<double> m(kCount, 0.0);
  std::vector<double> v(kCount, 0.0);
  for (std::size_t i = 0; i < kCount; ++i) p[i] = initial_param(i);
  for (std::uint64_t t = 1; t <= kSteps; ++t) {
    for (std::size_t i = 0; i < kCount; ++i) {
      double g = static_cast<double>(gradient(i, t)) * kGradientScale;
      if (decoupled) {
        p[i] -= kLearningRate * kWeightDecay * p[i];
      } else {
        g += kWeightDecay * p[i];
      }
      m[i] = kBeta1 * m[i] + (1 - kBeta1) * g;
      v[i] = kBeta2 * v[i] + (1 - kBeta2) * g * g;
      const double m_hat = m[i] / (1 - std::pow(kBeta1, static_cast<double>(t)));
      const double v_hat = v[i] / (1 - std::pow(kBeta2, static_cast<double>(t)));
      p[i] -= kLearningRate * m_hat / (std::sqrt(v_hat) + kEpsilon);
    }
  }
  return p;
}

template <class O, class T>
std::vector<T> run(const O& optimizer) {
  std::vector<T> params(kCount);
  std::vector<T> state(O::kStateSlots * kCount, T{0});
  std::vector<T> gradients(kCount);
  for (std::size_t i = 0; i < kCount; ++i) params[i] = initial_param(i);
  for (std::uint64_t t = 1; t <= kSteps; ++t) {
    for (std::size_t i = 0; i < kCount; ++i) gradients[i] = gradient(i, t);
    optimizer.template step<T>(params, gradients, state,
                               {.step = t, .gradient_scale = kGradientScale});
  }
  return params;
}

template <class T>
double largest_relative_error(const std::vector<T>& actual, const std::vector<double>& expected) {
  double largest = 0.0;
  for (std::size_t i = 0; i < actual.size(); ++i) {
    const double error = std::abs(static_cast<double>(actual[i]) - expected[i]);
    largest = std::max(largest, error / std::abs(expected[i]));
  }
  return largest;
}

// In float the error is mostly the rounding of p at each step, a random walk of about
// sqrt(100) * ulp(p) / sqrt(12), 2e-7 relative for p near 3; the largest of 24 elements is about
// 5e-7. Leaving out the bias correction errs by more than 1e-2.
template <class T>
constexpr double kTolerance = std::is_same_v<T, float> ? 1e-6 : 1e-12;

}  // namespace

TEST_CASE_TEMPLATE(
    "adam over 100 steps is within 1e-6 (float) or 1e-12 (double) of a double reference", T, float,
    double) {
  const Adam adam({.learning_rate = kLearningRate, .weight_decay = kWeightDecay});
  const std::vector<T> actual = run<Adam, T>(adam);
  const std::vector<double> expected = reference(/*decoupled=*/false);
  const double error = largest_relative_error(actual, expected);
  INFO("largest relative error ", error);
  CHECK(error <= kTolerance<T>);
}

TEST_CASE_TEMPLATE(
    "adamw over 100 steps is within 1e-6 (float) or 1e-12 (double) of a double reference", T, float,
    double) {
  const AdamW adamw({.learning_rate = kLearningRate, .weight_decay = kWeightDecay});
  const std::vector<T> actual = run<AdamW, T>(adamw);
  const std::vector<double> expected = reference(/*decoupled=*/true);
  const double error = largest_relative_error(actual, expected);
  INFO("largest relative error ", error);
  CHECK(error <= kTolerance<T>);
}

TEST_CASE("adam keeps m in state slot 0 and v in state slot 1") {
  const Adam adam({.learning_rate = 0.5, .beta1 = 0.5, .beta2 = 0.75});
  std::vector<double> params = {1, 1, 1};
  const std::vector<double> gradients = {2, -4, 8};
  std::vector<double> state(6, 0.0);
  adam.step<double>(params, gradients, state, {.step = 1});
  // m = 0.5 g, v = 0.25 g^2: exact.
  CHECK(state == std::vector<double>{1, -2, 4, 1, 4, 16});
}

TEST_CASE("adam and adamw take the same steps when weight decay is off") {
  const Adam adam({.learning_rate = 1e-2, .weight_decay = 0.0});
  const AdamW adamw({.learning_rate = 1e-2, .weight_decay = 0.0});
  CHECK(run<Adam, float>(adam) == run<AdamW, float>(adamw));
}

TEST_CASE("adamw shrinks a parameter with zero gradient by learning_rate * weight_decay") {
  // With g = 0, m = v = 0 and the Adam update is 0 / epsilon = 0: only the decay acts.
  const AdamW adamw({.learning_rate = 0.5, .weight_decay = 0.5});
  std::vector<double> params = {8, -4};
  const std::vector<double> gradients = {0, 0};
  std::vector<double> state(4, 0.0);
  adamw.step<double>(params, gradients, state, {.step = 1});
  CHECK(params == std::vector<double>{6, -3});
}

TEST_CASE("adam and adamw have PyTorch's defaults") {
  const Adam adam({.learning_rate = 1e-3});
  CHECK(adam.options().beta1 == 0.9);
  CHECK(adam.options().beta2 == 0.999);
  CHECK(adam.options().epsilon == 1e-8);
  CHECK(adam.options().weight_decay == 0.0);
  CHECK(AdamW({.learning_rate = 1e-3}).options().weight_decay == 0.01);
}

TEST_CASE("adam rejects each invalid option with a ConfigError naming the field") {
  constexpr double kNan = std::numeric_limits<double>::quiet_NaN();
  CHECK_THROWS_WITH_AS(Adam({.learning_rate = kNan}), doctest::Contains("learning_rate"),
                       cohort::ConfigError);
  for (const double bad : {1.0, -0.1, kNan}) {
    CAPTURE(bad);
    CHECK_THROWS_WITH_AS(Adam({.learning_rate = 1e-3, .beta1 = bad}), doctest::Contains("beta1"),
                         cohort::ConfigError);
    CHECK_THROWS_WITH_AS(Adam({.learning_rate = 1e-3, .beta2 = bad}), doctest::Contains("beta2"),
                         cohort::ConfigError);
  }
  for (const double bad : {0.0, -1e-8, kNan}) {
    CAPTURE(bad);
    CHECK_THROWS_WITH_AS(Adam({.learning_rate = 1e-3, .epsilon = bad}),
                         doctest::Contains("epsilon"), cohort::ConfigError);
  }
  CHECK_THROWS_WITH_AS(Adam({.learning_rate = 1e-3, .weight_decay = -0.01}),
                       doctest::Contains("weight_decay"), cohort::ConfigError);
  CHECK_THROWS_WITH_AS(Adam({.learning_rate = 1e-3, .max_gradient_norm = -1}),
                       doctest::Contains("max_gradient_norm"), cohort::ConfigError);
  CHECK(Adam({.learning_rate = 1e-3, .beta1 = 0.0, .beta2 = 0.0}).options().beta2 == 0.0);
}

TEST_CASE("adamw rejects a decay that would flip or zero the parameters in one step") {
  CHECK_THROWS_WITH_AS(AdamW({.learning_rate = 2, .weight_decay = 0.5}),
                       doctest::Contains("weight_decay"), cohort::ConfigError);
  CHECK(AdamW({.learning_rate = 1, .weight_decay = 0.5}).options().weight_decay == 0.5);
}
