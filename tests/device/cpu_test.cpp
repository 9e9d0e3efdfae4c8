#include <doctest/doctest.h>

#include <cmath>
#include <cohort/device/cpu.hpp>
#include <cohort/optimizer/adam.hpp>
#include <cohort/optimizer/momentum.hpp>
#include <cohort/optimizer/sgd.hpp>
#include <cstring>
#include <limits>
#include <random>
#include <span>
#include <utility>
#include <vector>

namespace cpu = cohort::device::cpu;

namespace {

// Values whose sum depends on the order of additions, so that only the canonical tree matches.
std::vector<std::vector<float>> order_sensitive_inputs(std::size_t buffers, std::size_t length) {
  // Near 1e8 a float's spacing is 8: adding 3 and then 3 loses both, adding 6 at once does not.
  const float values[] = {1e8f, 3.0f, -1e8f, 3.0f, 0.5f, 7e7f, -2.0f, 1.25f, -7e7f};
  std::mt19937 engine(42);
  std::vector<std::vector<float>> inputs(buffers, std::vector<float>(length));
  for (auto& input : inputs) {
    for (float& value : input) value = values[engine() % 9];
  }
  return inputs;
}

}  // namespace

TEST_CASE("reduce_tree adds buffers in the canonical tree order, element by element") {
  for (std::size_t buffers : {1, 2, 3, 5, 8, 9}) {
    CAPTURE(buffers);
    const std::size_t length = 3 * cpu::kReduceBlock + 7;  // several blocks and a partial one
    const auto inputs = order_sensitive_inputs(buffers, length);
    std::vector<const float*> pointers;
    for (const auto& input : inputs) pointers.push_back(input.data());
    std::vector<float> out(length);
    cpu::reduce_tree<float>(cohort::ReduceOp::kSum, pointers, out);

    bool differs_from_left_to_right = false;
    for (std::size_t i = 0; i < length; ++i) {
      const float expected = cohort::tree::fold(
          buffers, [&](std::size_t b) { return inputs[b][i]; },
          [](float a, float b) { return a + b; });
      REQUIRE(std::memcmp(&out[i], &expected, sizeof(float)) == 0);
      float sequential = 0.0f;
      for (std::size_t b = 0; b < buffers; ++b) sequential += inputs[b][i];
      differs_from_left_to_right = differs_from_left_to_right || sequential != expected;
    }
    // From 4 buffers on the tree differs from a left-to-right sum, and the inputs show it.
    if (buffers >= 4) CHECK(differs_from_left_to_right);
  }
}

TEST_CASE("reduce_tree over inputs of several leaves each gives the fold over every leaf") {
  const std::size_t leaves = 8;
  const std::size_t length = 2 * cpu::kReduceBlock + 5;
  const auto values = order_sensitive_inputs(leaves, length);
  for (std::size_t parts : {1, 2, 3, 5, 6, 8}) {
    CAPTURE(parts);
    // Each input is its part's leaves folded, as a replica folds its micro-batches.
    const std::vector<std::size_t> counts = cohort::tree::deal(leaves, parts);
    std::vector<std::vector<float>> inputs;
    std::size_t first = 0;
    for (const std::size_t count : counts) {
      std::vector<const float*> own;
      for (std::size_t leaf = first; leaf < first + count; ++leaf)
        own.push_back(values[leaf].data());
      inputs.emplace_back(length);
      cpu::reduce_tree<float>(cohort::ReduceOp::kSum, own, inputs.back());
      first += count;
    }
    std::vector<const float*> pointers;
    for (const auto& input : inputs) pointers.push_back(input.data());
    std::vector<float> out(length);
    cpu::reduce_tree<float>(cohort::ReduceOp::kSum, pointers, out, counts);

    std::vector<const float*> every;
    for (const auto& value : values) every.push_back(value.data());
    std::vector<float> expected(length);
    cpu::reduce_tree<float>(cohort::ReduceOp::kSum, every, expected);
    CHECK(std::memcmp(out.data(), expected.data(), length * sizeof(float)) == 0);
    // And element by element, the specification: tree::fold_parts over the parts.
    for (std::size_t i = 0; i < length; ++i) {
      const float folded = cohort::tree::fold_parts(
          std::span<const std::size_t>(counts), [&](std::size_t p) { return inputs[p][i]; },
          [](float a, float b) { return a + b; });
      CHECK(std::memcmp(&folded, &out[i], sizeof(float)) == 0);
    }
  }
}

TEST_CASE("reduce_tree applies min, max and product") {
  const std::vector<double> a{1, -4, 3}, b{2, 5, -6}, c{-1, 2, 2};
  const double* inputs[] = {a.data(), b.data(), c.data()};
  std::vector<double> out(3);
  cpu::reduce_tree<double>(cohort::ReduceOp::kMin, inputs, out);
  CHECK(out == std::vector<double>{-1, -4, -6});
  cpu::reduce_tree<double>(cohort::ReduceOp::kMax, inputs, out);
  CHECK(out == std::vector<double>{2, 5, 3});
  cpu::reduce_tree<double>(cohort::ReduceOp::kProduct, inputs, out);
  CHECK(out == std::vector<double>{-2, -40, -36});
}

TEST_CASE("sum_of_squares of aligned block ranges composes to the whole vector's bits") {
  std::vector<float> x(8 * cpu::kNormBlock);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>((i * 7919) % 1000) * 1e-3f;
  const double whole = cpu::sum_of_squares<float>(x);
  const std::size_t half = x.size() / 2;
  const double halves = cpu::sum_of_squares<float>(std::span(x).first(half)) +
                        cpu::sum_of_squares<float>(std::span(x).subspan(half));
  CHECK(std::memcmp(&whole, &halves, sizeof(double)) == 0);
  CHECK(cpu::sum_of_squares<float>(std::span<const float>{}) == 0.0);
  const std::vector<float> small{3.0f, 4.0f};
  CHECK(cpu::sum_of_squares<float>(small) == 25.0);
}

TEST_CASE("axpy, scale and combine_into compute elementwise") {
  std::vector<float> y{1, 2, 3};
  const std::vector<float> x{4, 5, 6};
  cpu::axpy<float>(2.0f, x, y);
  CHECK(y == std::vector<float>{9, 12, 15});
  cpu::scale<float>(y, 0.5f);
  CHECK(y == std::vector<float>{4.5f, 6, 7.5f});
  cpu::combine_into<float>(cohort::ReduceOp::kMax, y, x);
  CHECK(y == std::vector<float>{4.5f, 6, 7.5f});
  cpu::combine_into<float>(cohort::ReduceOp::kSum, y, x);
  CHECK(y == std::vector<float>{8.5f, 11, 13.5f});
  CHECK(cpu::all_finite<float>(y));
  y[1] = std::numeric_limits<float>::infinity();
  CHECK_FALSE(cpu::all_finite<float>(y));
}

TEST_CASE("device::Cpu, the step's device interface, computes what the cpu:: loops compute") {
  using cohort::device::Cpu;
  static_assert(cohort::device::Device<Cpu>);
  const Cpu::Place place{};
  Cpu::Buffer<float> buffer(7, place);
  REQUIRE(buffer.size() == 7);
  CHECK(std::vector<float>(buffer.span().begin(), buffer.span().end()) ==
        std::vector<float>(7, 0.0f));

  const std::vector<float> values{1.5f, -2.0f, 3.25f, 0.0f, 8.0f, -0.5f, 1e8f};
  Cpu::from_host(place, std::span<const float>(values), buffer.span());
  Cpu::Buffer<float> sum(7, place);
  Cpu::copy(place, std::span<const float>(buffer.span()), sum.span());
  Cpu::add_into(place, sum.span(), std::span<const float>(buffer.span()));
  std::vector<float> expected = values;
  cpu::combine_into(cohort::ReduceOp::kSum, std::span<float>(expected),
                    std::span<const float>(values));
  std::vector<float> host(7);
  Cpu::to_host(place, std::span<const float>(sum.span()), std::span<float>(host));
  CHECK(host == expected);
  CHECK(Cpu::sum_of_squares(place, std::span<const float>(sum.span())) ==
        cpu::sum_of_squares(std::span<const float>(expected)));

  Cpu::Buffer<float> moved = std::move(sum);
  CHECK(moved.size() == 7);
  Cpu::synchronize(place);  // nothing to wait for on the host
}

TEST_CASE("first_nonfinite finds the first infinity or NaN at any position, or returns the size") {
  for (const std::size_t length :
       {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{4099}, std::size_t{1} << 20}) {
    CAPTURE(length);
    std::vector<float> x(length, 1.5f);
    CHECK(cpu::first_nonfinite<float>(x) == length);
    if (length == 0) continue;
    for (const std::size_t at : {std::size_t{0}, length / 2, cpu::kReduceBlock - 1, length - 1}) {
      if (at >= length) continue;
      CAPTURE(at);
      for (const float bad :
           {std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
            std::numeric_limits<float>::quiet_NaN()}) {
        std::vector<float> y = x;
        y[at] = bad;
        if (at + 1 < length) y[length - 1] = bad;  // a later one does not hide the first
        CHECK(cpu::first_nonfinite<float>(y) == at);
      }
    }
  }
  const std::vector<double> d{1.0, std::numeric_limits<double>::max(), -0.0,
                              std::numeric_limits<double>::denorm_min(),
                              std::numeric_limits<double>::quiet_NaN()};
  CHECK(cpu::first_nonfinite<double>(d) == 4);
}

TEST_CASE_TEMPLATE(
    "step_finite applies the optimizer's step with its bits and says whether the "
    "gradient was finite; step_into writes the same bits into another buffer",
    O, cohort::optimizer::Sgd, cohort::optimizer::Momentum, cohort::optimizer::Adam,
    cohort::optimizer::AdamW) {
  const O optimizer({.learning_rate = 0.01});
  const std::size_t n = 4099;
  std::mt19937 engine(5);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  std::vector<float> parameters(n), gradients(n), state(O::kStateSlots * n);
  for (float& value : parameters) value = uniform(engine);
  for (float& value : gradients) value = uniform(engine);
  for (float& value : state) value = std::abs(uniform(engine));
  const cohort::optimizer::StepContext context{.step = 3, .gradient_scale = 0.25};

  std::vector<float> p_step = parameters, s_step = state;
  optimizer.step(std::span<float>(p_step), std::span<const float>(gradients),
                 std::span<float>(s_step), context);
  std::vector<float> p_fused = parameters, s_fused = state;
  CHECK(cpu::step_finite<O, float>(optimizer, p_fused, gradients, s_fused, context));
  CHECK(std::memcmp(p_step.data(), p_fused.data(), n * sizeof(float)) == 0);
  CHECK(std::memcmp(s_step.data(), s_fused.data(), s_step.size() * sizeof(float)) == 0);

  // Written into another buffer, the parameters from before kept.
  std::vector<float> p_into(n), s_into = state;
  cpu::step_into<O, float>(optimizer, parameters, p_into, gradients, s_into, context);
  CHECK(std::memcmp(p_step.data(), p_into.data(), n * sizeof(float)) == 0);
  CHECK(std::memcmp(s_step.data(), s_into.data(), s_step.size() * sizeof(float)) == 0);

  for (const std::size_t at : {std::size_t{0}, std::size_t{1234}, n - 1}) {
    std::vector<float> bad = gradients;
    bad[at] = std::numeric_limits<float>::quiet_NaN();
    std::vector<float> p = parameters, s = state;
    CHECK_FALSE(cpu::step_finite<O, float>(optimizer, p, bad, s, context));
    CHECK(cohort::device::Cpu::first_nonfinite(cohort::device::Cpu::Place{},
                                               std::span<const float>(bad)) == at);
  }
}
