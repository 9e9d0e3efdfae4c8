// Invariants every optimizer shares, and the clipping rule of optimizer.hpp.
#include "cohort/optimizer/optimizer.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>
#include <string_view>
#include <vector>

#include "cohort/core/error.hpp"
#include "cohort/optimizer/adam.hpp"
#include "cohort/optimizer/momentum.hpp"
#include "cohort/optimizer/sgd.hpp"

namespace {

using cohort::optimizer::Adam;
using cohort::optimizer::AdamW;
using cohort::optimizer::clipping_factor;
using cohort::optimizer::Momentum;
using cohort::optimizer::Sgd;
using cohort::optimizer::StepContext;

// A macro because TEST_CASE_TEMPLATE takes the types as separate arguments, not as one list type.
#define COHORT_OPTIMIZERS Sgd, Momentum, Adam, AdamW

template <class O>
typename O::Options valid_options() {
  typename O::Options options;
  options.learning_rate = 0.01;
  options.weight_decay = 0.05;
  return options;
}

template <class O>
typename O::Options with(double O::Options::*field, double value) {
  typename O::Options options = valid_options<O>();
  options.*field = value;
  return options;
}

// Small integers over 16: exact in float, and exactly divisible by small powers of two.
template <class T>
std::vector<T> gradients_for(std::size_t count, std::uint64_t step) {
  std::vector<T> gradients(count);
  for (std::size_t i = 0; i < count; ++i) {
    gradients[i] = static_cast<T>(static_cast<int>((i * 7919 + step * 104729) % 201) - 100) / 16;
  }
  return gradients;
}

template <class T>
std::vector<T> initial_params(std::size_t count) {
  std::vector<T> params(count);
  for (std::size_t i = 0; i < count; ++i) {
    params[i] = static_cast<T>(static_cast<int>((i * 31) % 97) - 48) / 8;
  }
  return params;
}

template <class T>
bool same_bits(std::span<const T> a, std::span<const T> b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size_bytes()) == 0;
}

}  // namespace

TEST_CASE("each optimizer has the name and state size that checkpoints record") {
  CHECK(Sgd::kName == "sgd");
  CHECK(Sgd::kStateSlots == 0);
  CHECK(Momentum::kName == "momentum");
  CHECK(Momentum::kStateSlots == 1);
  CHECK(Adam::kName == "adam");
  CHECK(Adam::kStateSlots == 2);
  CHECK(AdamW::kName == "adamw");
  CHECK(AdamW::kStateSlots == 2);
}

TEST_CASE_TEMPLATE("gradient_scale 1/B on the raw gradient equals a step on the divided gradient",
                   O, COHORT_OPTIMIZERS) {
  constexpr std::size_t kCount = 257;
  constexpr int kBatch = 8;  // a power of two, so g / 8 and g * (1/8) are both exact
  const O optimizer(valid_options<O>());
  std::vector<float> scaled = initial_params<float>(kCount);
  std::vector<float> divided = scaled;
  std::vector<float> scaled_state(O::kStateSlots * kCount, 0.0f);
  std::vector<float> divided_state = scaled_state;
  for (std::uint64_t step = 1; step <= 3; ++step) {
    const std::vector<float> raw = gradients_for<float>(kCount, step);
    std::vector<float> mean = raw;
    for (float& g : mean) g /= kBatch;
    optimizer.template step<float>(scaled, raw, scaled_state,
                                   {.step = step, .gradient_scale = 1.0 / kBatch});
    optimizer.template step<float>(divided, mean, divided_state, {.step = step});
  }
  CHECK(scaled == divided);
  CHECK(scaled_state == divided_state);
  CHECK(scaled != initial_params<float>(kCount));
}

TEST_CASE_TEMPLATE("a shard updated alone has the same bits as inside the whole vector", O,
                   COHORT_OPTIMIZERS) {
  constexpr std::size_t kCount = 4099;
  const O optimizer(valid_options<O>());
  std::vector<float> whole = initial_params<float>(kCount);
  std::vector<float> whole_state(O::kStateSlots * kCount, 0.0f);

  struct Shard {
    std::size_t begin;
    std::size_t end;
  };
  const Shard shards[] = {
      {0, kCount}, {0, 1}, {1000, 1777}, {kCount - 7, kCount}, {kCount, kCount}};
  // A shard's state is its own slot-major array: [slot 0: its n values][slot 1: its n values]...
  std::vector<std::vector<float>> shard_params;
  std::vector<std::vector<float>> shard_states;
  for (const Shard& shard : shards) {
    shard_params.emplace_back(whole.begin() + shard.begin, whole.begin() + shard.end);
    shard_states.emplace_back(O::kStateSlots * (shard.end - shard.begin), 0.0f);
  }

  for (std::uint64_t step = 1; step <= 3; ++step) {
    const std::vector<float> gradients = gradients_for<float>(kCount, step);
    const StepContext context = {.step = step, .gradient_scale = 0.25};
    optimizer.template step<float>(whole, gradients, whole_state, context);
    for (std::size_t s = 0; s < std::size(shards); ++s) {
      const std::span<const float> shard_gradients =
          std::span(gradients).subspan(shards[s].begin, shards[s].end - shards[s].begin);
      optimizer.template step<float>(shard_params[s], shard_gradients, shard_states[s], context);
    }
  }

  for (std::size_t s = 0; s < std::size(shards); ++s) {
    const Shard shard = shards[s];
    const std::size_t n = shard.end - shard.begin;
    CAPTURE(shard.begin);
    CAPTURE(shard.end);
    CHECK(same_bits<float>(shard_params[s], std::span(whole).subspan(shard.begin, n)));
    for (std::size_t slot = 0; slot < O::kStateSlots; ++slot) {
      CAPTURE(slot);
      CHECK(same_bits<float>(std::span(shard_states[s]).subspan(slot * n, n),
                             std::span(whole_state).subspan(slot * kCount + shard.begin, n)));
    }
  }
  CHECK(whole != initial_params<float>(kCount));
}

TEST_CASE_TEMPLATE("the optimizer never clips by itself: max_gradient_norm is for the caller", O,
                   COHORT_OPTIMIZERS) {
  constexpr std::size_t kCount = 33;
  const O plain(valid_options<O>());
  const O with_norm(with<O>(&O::Options::max_gradient_norm, 1e-3));
  std::vector<double> a = initial_params<double>(kCount);
  std::vector<double> b = a;
  std::vector<double> a_state(O::kStateSlots * kCount, 0.0);
  std::vector<double> b_state = a_state;
  std::vector<double> huge = gradients_for<double>(kCount, 1);
  for (double& g : huge) g *= 1e6;
  plain.template step<double>(a, huge, a_state, {});
  with_norm.template step<double>(b, huge, b_state, {});
  CHECK(a == b);
  CHECK(a != initial_params<double>(kCount));
}

TEST_CASE_TEMPLATE("every optimizer rejects bad shared options with a ConfigError naming the field",
                   O, COHORT_OPTIMIZERS) {
  constexpr double kNan = std::numeric_limits<double>::quiet_NaN();
  constexpr double kInfinity = std::numeric_limits<double>::infinity();
  struct Case {
    double O::Options::*field;
    std::string_view name;
    double value;
  };
  const Case cases[] = {
      {&O::Options::learning_rate, "learning_rate", kNan},
      {&O::Options::learning_rate, "learning_rate", kInfinity},
      {&O::Options::learning_rate, "learning_rate", 0.0},
      {&O::Options::learning_rate, "learning_rate", -0.1},
      {&O::Options::weight_decay, "weight_decay", -1e-4},
      {&O::Options::weight_decay, "weight_decay", kNan},
      {&O::Options::weight_decay, "weight_decay", kInfinity},
      {&O::Options::max_gradient_norm, "max_gradient_norm", -1.0},
      {&O::Options::max_gradient_norm, "max_gradient_norm", kNan},
      {&O::Options::max_gradient_norm, "max_gradient_norm", kInfinity},
  };
  for (const Case& c : cases) {
    CAPTURE(c.name);
    CAPTURE(c.value);
    const doctest::String name(c.name.data(), static_cast<unsigned>(c.name.size()));
    CHECK_THROWS_WITH_AS(O(with<O>(c.field, c.value)), doctest::Contains(name),
                         cohort::ConfigError);
  }
  CHECK(O(valid_options<O>()).options().learning_rate == 0.01);
}

TEST_CASE("clipping_factor leaves a gradient below the norm unscaled") {
  // sqrt(400) * 0.25 = 5
  CHECK(clipping_factor(400.0, 0.25, 6.0) == 1.0);
  CHECK(clipping_factor(400.0, 0.25, 5.0) == 1.0);
  CHECK(clipping_factor(0.0, 1.0, 1.0) == 1.0);
}

TEST_CASE("clipping_factor brings the scaled norm exactly down to max_gradient_norm") {
  // sqrt(400) * 0.25 = 5: to reach 2.5 the factor is 1/2, to reach 1 it is 1/5.
  CHECK(clipping_factor(400.0, 0.25, 2.5) == 0.5);
  CHECK(clipping_factor(400.0, 0.25, 1.0) == 1.0 / 5.0);
  CHECK(clipping_factor(400.0, 1.0, 5.0) == 0.25);
}

TEST_CASE("clipping_factor with max_gradient_norm 0 means no clipping") {
  CHECK(clipping_factor(1e30, 1.0, 0.0) == 1.0);
  CHECK(clipping_factor(400.0, 0.25, 0.0) == 1.0);
}
