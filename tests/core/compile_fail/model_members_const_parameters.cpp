// Must not compile: a model described through ModelMembers whose parameters() and gradients() are
// const only, returning spans of const values: cohort writes through them (the optimizer, the
// broadcast of the chief's parameters). The sentence names the member functions.
#include <span>
#include <vector>

#include "cohort/core/model.hpp"

struct Readonly {
  using value_type = float;
  using batch_type = std::vector<float>;
  std::vector<float> weights, grads;
  std::span<const float> parameters() const { return weights; }
  std::span<const float> gradients() const { return grads; }
  double forward_backward(const batch_type&) { return 0.0; }
};

template <>
struct cohort::ModelTraits<Readonly> : cohort::ModelMembers<Readonly> {};

static_assert(cohort::Model<Readonly>, COHORT_MODEL_REQUIREMENT_MESSAGE);

int main() { return 0; }
