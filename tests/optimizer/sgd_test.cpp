#include "cohort/optimizer/sgd.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <cstddef>
#include <limits>
#include <span>
#include <vector>

#include "cohort/core/error.hpp"

namespace {

using cohort::optimizer::Sgd;
using cohort::optimizer::StepContext;

}  // namespace

TEST_CASE_TEMPLATE("sgd takes one step to the hand-computed value", T, float, double) {
  const Sgd sgd({.learning_rate = 0.5, .weight_decay = 0.5});
  std::vector<T> params = {3, -2, 0, 1024};
  const std::vector<T> gradients = {8, 4, -12, 0};
  sgd.step<T>(params, gradients, {}, {.step = 1, .gradient_scale = 0.25});
  // g' = 0.25 g + 0.5 p, p - 0.5 g': every value is a short binary fraction, so the result is
  // exact.
  //   3 - 0.5 (2 + 1.5) = 1.25    -2 - 0.5 (1 - 1) = -2    0 - 0.5 (-3 + 0) = 1.5
  //   1024 - 0.5 (0 + 512) = 768
  CHECK(params == std::vector<T>{1.25, -2, 1.5, 768});
}

TEST_CASE("sgd without weight decay is p - learning_rate * scale * g") {
  const Sgd sgd({.learning_rate = 0.25});
  std::vector<double> params = {1, 2, -3};
  const std::vector<double> gradients = {4, -8, 16};
  sgd.step<double>(params, gradients, {}, {.gradient_scale = 0.5});
  CHECK(params == std::vector<double>{0.5, 3, -5});
}

// The update must be p - round(lr * g'), as the CUDA kernel built with -fmad=false computes it. A
// compiler allowed to contract (GCC's C++ default -ffp-contract=fast, with an FMA target such as
// -march=native) computes fma(-lr, g', p) instead and this test fails.
TEST_CASE("sgd rounds the product before the subtraction, so no compiler fuses them") {
  const Sgd sgd({.learning_rate = 0.1});
  constexpr std::size_t kCount = 64;
  std::vector<float> params(kCount, 1.0f);
  std::vector<float> gradients(kCount);
  for (std::size_t i = 0; i < kCount; ++i) gradients[i] = static_cast<float>(i + 1) * 0.1f;

  std::vector<float> expected(kCount);
  std::size_t fused_differs = 0;
  for (std::size_t i = 0; i < kCount; ++i) {
    volatile float product = 0.1f * gradients[i];  // volatile: rounded to float, never fused
    expected[i] = 1.0f - product;
    if (std::fma(-0.1f, gradients[i], 1.0f) != expected[i]) ++fused_differs;
  }
  REQUIRE(fused_differs > 0);  // the inputs do tell the two evaluations apart

  sgd.step<float>(params, gradients, {}, {});
  CHECK(params == expected);
}

TEST_CASE("sgd rejects each invalid option with a ConfigError naming the field") {
  constexpr double kNan = std::numeric_limits<double>::quiet_NaN();
  CHECK_THROWS_WITH_AS(Sgd({.learning_rate = kNan}), doctest::Contains("learning_rate = nan"),
                       cohort::ConfigError);
  CHECK_THROWS_WITH_AS(Sgd({}), doctest::Contains("learning_rate"), cohort::ConfigError);
  CHECK_THROWS_WITH_AS(Sgd({.learning_rate = 0.1, .weight_decay = -1e-4}),
                       doctest::Contains("weight_decay"), cohort::ConfigError);
  CHECK_THROWS_WITH_AS(Sgd({.learning_rate = 0.1, .max_gradient_norm = -1}),
                       doctest::Contains("max_gradient_norm"), cohort::ConfigError);
  CHECK(Sgd({.learning_rate = 0.1, .weight_decay = 1e-4, .max_gradient_norm = 1})
            .options()
            .weight_decay == 1e-4);
}
