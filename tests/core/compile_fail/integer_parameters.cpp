// Must not compile: a model described through ModelMembers whose parameters are integers (cohort
// reduces and updates float or double only) is not a Model.
#include <span>
#include <vector>

#include "cohort/core/model.hpp"

struct Counter {
  using value_type = int;
  using batch_type = std::vector<int>;
  std::vector<int> weights, grads;
  std::span<int> parameters() { return weights; }
  std::span<int> gradients() { return grads; }
  double forward_backward(const batch_type&) { return 0.0; }
};

template <>
struct cohort::ModelTraits<Counter> : cohort::ModelMembers<Counter> {};

static_assert(cohort::Model<Counter>, COHORT_MODEL_REQUIREMENT_MESSAGE);

int main() { return 0; }
