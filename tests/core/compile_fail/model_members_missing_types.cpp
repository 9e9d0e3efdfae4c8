// Must not compile: a model described through ModelMembers that lacks the member types
// value_type and batch_type. The sentences name each missing member before the not-a-Model one:
// the user did write ModelMembers, as the not-a-Model sentence suggests, and needs to know what
// it looks for.
#include <span>
#include <vector>

#include "cohort/cohort.hpp"

struct Ratings {
  std::vector<double> weights, grads;
  std::span<double> parameters() { return weights; }
  std::span<double> gradients() { return grads; }
  double forward_backward(const std::vector<int>&) { return 0.0; }
};

template <>
struct cohort::ModelTraits<Ratings> : cohort::ModelMembers<Ratings> {};

struct Rows {
  std::size_t size() const { return 8; }
  std::vector<int> batch(std::span<const std::size_t> indices) const {
    return std::vector<int>(indices.size());
  }
};

int main() {
  cohort::Trainer trainer(Ratings{}, cohort::strategy::Mirrored<>({.replicas = 2}),
                          cohort::optimizer::Sgd({.learning_rate = 0.1}));
  trainer.fit(Rows{}, {.epochs = 1});
  return 0;
}
