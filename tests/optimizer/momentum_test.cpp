#include "cohort/optimizer/momentum.hpp"

#include <doctest/doctest.h>

#include <cstdint>
#include <limits>
#include <vector>

#include "cohort/core/error.hpp"

namespace {

using cohort::optimizer::Momentum;
using cohort::optimizer::StepContext;

// Three steps from p = 4 with gradients 2, 1, -2; learning_rate = momentum = 0.5, weight_decay =
// 0.25. Every intermediate is a short binary fraction, so float and double are exact.
constexpr double kGradients[] = {2, 1, -2};

template <class T>
void take_three_steps(const Momentum& momentum, std::vector<T>& params, std::vector<T>& velocity,
                      std::vector<T>& params_after_each, std::vector<T>& velocity_after_each) {
  for (std::uint64_t step = 1; step <= 3; ++step) {
    const std::vector<T> gradients = {static_cast<T>(kGradients[step - 1])};
    momentum.step<T>(params, gradients, velocity, {.step = step});
    params_after_each.push_back(params[0]);
    velocity_after_each.push_back(velocity[0]);
  }
}

}  // namespace

TEST_CASE_TEMPLATE("momentum over three steps matches the hand-computed values", T, float, double) {
  const Momentum momentum({.learning_rate = 0.5, .momentum = 0.5, .weight_decay = 0.25});
  std::vector<T> params = {4};
  std::vector<T> velocity = {0};
  std::vector<T> p;
  std::vector<T> v;
  take_three_steps(momentum, params, velocity, p, v);
  // g' = g + p/4;  v = v/2 + g';  p = p - v/2
  //   1: g' = 3          v = 3           p = 2.5
  //   2: g' = 1.625      v = 3.125       p = 0.9375
  //   3: g' = -1.765625  v = -0.203125   p = 1.0390625
  CHECK(v == std::vector<T>{3, 3.125, -0.203125});
  CHECK(p == std::vector<T>{2.5, 0.9375, 1.0390625});
}

TEST_CASE_TEMPLATE("nesterov momentum over three steps matches the hand-computed values", T, float,
                   double) {
  const Momentum momentum(
      {.learning_rate = 0.5, .momentum = 0.5, .nesterov = true, .weight_decay = 0.25});
  std::vector<T> params = {4};
  std::vector<T> velocity = {0};
  std::vector<T> p;
  std::vector<T> v;
  take_three_steps(momentum, params, velocity, p, v);
  // g' = g + p/4;  v = v/2 + g';  p = p - (g' + v/2)/2
  //   1: g' = 3            v = 3            p = 4 - 4.5/2 = 1.75
  //   2: g' = 1.4375       v = 2.9375       p = 1.75 - 2.90625/2 = 0.296875
  //   3: g' = -1.92578125  v = -0.45703125  p = 0.296875 + 2.154296875/2 = 1.3740234375
  CHECK(v == std::vector<T>{3, 2.9375, -0.45703125});
  CHECK(p == std::vector<T>{1.75, 0.296875, 1.3740234375});
}

TEST_CASE("momentum defaults to 0.9 without nesterov") {
  const Momentum momentum({.learning_rate = 0.1});
  CHECK(momentum.options().momentum == 0.9);
  CHECK_FALSE(momentum.options().nesterov);
  CHECK(momentum.options().weight_decay == 0.0);
}

TEST_CASE("momentum rejects a momentum outside [0, 1) with a ConfigError naming the field") {
  for (const double bad : {-0.1, 1.0, 1.5, std::numeric_limits<double>::quiet_NaN()}) {
    CAPTURE(bad);
    CHECK_THROWS_WITH_AS(Momentum({.learning_rate = 0.1, .momentum = bad}),
                         doctest::Contains("momentum"), cohort::ConfigError);
  }
  CHECK(Momentum({.learning_rate = 0.1, .momentum = 0.0}).options().momentum == 0.0);
}
