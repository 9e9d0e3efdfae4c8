#include "cohort/core/model.hpp"

#include <doctest/doctest.h>

#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "cohort/core/dataset.hpp"

namespace {

// y = w x + b on (x, y) pairs, with the summed squared loss, written as a user would: members with
// the required names, adapted by ModelMembers.
struct Line {
  using value_type = double;
  using batch_type = std::vector<std::pair<double, double>>;

  std::vector<double> weights{0.0, 0.0};  // w, b
  std::vector<double> grads{0.0, 0.0};

  std::span<double> parameters() { return weights; }
  std::span<double> gradients() { return grads; }
  double forward_backward(const batch_type& batch) {
    double loss = 0.0;
    grads = {0.0, 0.0};
    for (const auto& [x, y] : batch) {
      const double error = weights[0] * x + weights[1] - y;
      loss += error * error;
      grads[0] += 2.0 * error * x;
      grads[1] += 2.0 * error;
    }
    return loss;
  }
};

// Adapted without touching the type: a traits specialization written by hand.
struct Foreign {
  float value = 0.0f;
  float gradient = 0.0f;
};

// Not models, each for one reason.
struct Undescribed {
  std::vector<float> parameters;
};

struct IntegerParameters {
  using value_type = int;
  using batch_type = int;
  std::vector<int> p;
  std::span<int> parameters() { return p; }
  std::span<int> gradients() { return p; }
  double forward_backward(const int&) { return 0.0; }
};

struct NotCopyable {
  using value_type = float;
  using batch_type = int;
  NotCopyable() = default;
  NotCopyable(const NotCopyable&) = delete;
  NotCopyable& operator=(const NotCopyable&) = delete;
  std::vector<float> p;
  std::span<float> parameters() { return p; }
  std::span<float> gradients() { return p; }
  double forward_backward(const int&) { return 0.0; }
};

struct GradientsByValue {
  using value_type = float;
  using batch_type = int;
  std::vector<float> p;
  std::span<float> parameters() { return p; }
  std::vector<float> gradients() { return p; }  // a copy, not the model's own storage
  double forward_backward(const int&) { return 0.0; }
};

struct NoForwardBackward {
  float p = 0.0f;
};

struct Squares {
  std::size_t size() const { return 10; }
  std::vector<double> batch(std::span<const std::size_t> indices) const {
    std::vector<double> out;
    for (std::size_t i : indices) out.push_back(static_cast<double>(i * i));
    return out;
  }
};

}  // namespace

template <>
struct cohort::ModelTraits<Line> : cohort::ModelMembers<Line> {};

template <>
struct cohort::ModelTraits<Foreign> {
  using value_type = float;
  using batch_type = float;
  static std::span<float> parameters(Foreign& m) { return {&m.value, 1}; }
  static std::span<float> gradients(Foreign& m) { return {&m.gradient, 1}; }
  static double forward_backward(Foreign& m, const float& target) {
    m.gradient = 2.0f * (m.value - target);
    return (m.value - target) * (m.value - target);
  }
};

template <>
struct cohort::ModelTraits<IntegerParameters> : cohort::ModelMembers<IntegerParameters> {};
template <>
struct cohort::ModelTraits<NotCopyable> : cohort::ModelMembers<NotCopyable> {};
template <>
struct cohort::ModelTraits<NoForwardBackward> {
  using value_type = float;
  using batch_type = int;
  static std::span<float> parameters(NoForwardBackward& m) { return {&m.p, 1}; }
  static std::span<float> gradients(NoForwardBackward& m) { return {&m.p, 1}; }
};
// GradientsByValue: ModelMembers cannot even be formed for it (gradients() returns a vector); a
// hand-written traits that forwards it unchanged is what a user would try.
template <>
struct cohort::ModelTraits<GradientsByValue> {
  using value_type = float;
  using batch_type = int;
  static std::span<float> parameters(GradientsByValue& m) { return m.parameters(); }
  static std::vector<float> gradients(GradientsByValue& m) { return m.gradients(); }
  static double forward_backward(GradientsByValue&, const int&) { return 0.0; }
};

static_assert(cohort::Model<Line>);
static_assert(cohort::Model<Foreign>);
static_assert(std::is_same_v<cohort::ValueType<Line>, double>);
static_assert(std::is_same_v<cohort::BatchType<Foreign>, float>);

static_assert(!cohort::Model<int>);
static_assert(!cohort::Model<Undescribed>);
static_assert(!cohort::Model<IntegerParameters>);
static_assert(!cohort::Model<NotCopyable>);
static_assert(!cohort::Model<GradientsByValue>);
static_assert(!cohort::Model<NoForwardBackward>);

static_assert(cohort::Dataset<Squares, std::vector<double>>);
static_assert(!cohort::Dataset<int, std::vector<double>>);
static_assert(!cohort::Dataset<Squares, int>);

TEST_CASE("ModelMembers forwards to the model's members") {
  using Traits = cohort::ModelTraits<Line>;
  Line line;
  line.weights = {2.0, 1.0};
  const double loss = Traits::forward_backward(line, {{1.0, 3.0}, {2.0, 4.0}});
  // errors: 2*1+1-3 = 0 and 2*2+1-4 = 1
  CHECK(loss == 1.0);
  CHECK(Traits::gradients(line)[0] == 4.0);
  CHECK(Traits::gradients(line)[1] == 2.0);
  CHECK(Traits::parameters(line).data() == line.weights.data());
  CHECK(Traits::parameters(line).size() == Traits::gradients(line).size());
}

TEST_CASE("a copy of a model is an independent replica") {
  using Traits = cohort::ModelTraits<Line>;
  Line model;
  Line replica = model;
  Traits::parameters(replica)[0] = 5.0;
  CHECK(Traits::parameters(model)[0] == 0.0);
  CHECK(Traits::parameters(replica).data() != Traits::parameters(model).data());
}

TEST_CASE("a hand-written ModelTraits adapts a type without touching it") {
  Foreign m{.value = 3.0f};
  CHECK(cohort::ModelTraits<Foreign>::forward_backward(m, 1.0f) == 4.0);
  CHECK(cohort::ModelTraits<Foreign>::gradients(m)[0] == 4.0f);
}

TEST_CASE("the requirement message names the concept and the way out") {
  const std::string message = COHORT_MODEL_REQUIREMENT_MESSAGE;
  CHECK(message.find("is not a cohort::Model") != std::string::npos);
  CHECK(message.find("cohort::ModelTraits") != std::string::npos);
  CHECK(message.find("cohort::ModelMembers") != std::string::npos);
}
