// Must not compile: fit given a data set whose batches are not the model's batch_type. The user is
// told so in one sentence, the only error (tests/core/CMakeLists.txt counts them).
#include <span>
#include <vector>

#include "cohort/cohort.hpp"

struct Line {
  using value_type = float;
  using batch_type = std::vector<float>;
  std::vector<float> weights = std::vector<float>(2, 0.0f);
  std::vector<float> grads = std::vector<float>(2, 0.0f);
  std::span<float> parameters() { return weights; }
  std::span<float> gradients() { return grads; }
  double forward_backward(const batch_type&) { return 0.0; }
};

template <>
struct cohort::ModelTraits<Line> : cohort::ModelMembers<Line> {};

// Batches of words, where the model reads vectors of floats.
struct Words {
  std::size_t size() const { return 8; }
  std::vector<int> batch(std::span<const std::size_t> indices) const {
    return std::vector<int>(indices.size());
  }
};

int main() {
  cohort::Trainer trainer(Line{}, cohort::strategy::Mirrored<>({.replicas = 2}),
                          cohort::optimizer::Sgd({.learning_rate = 0.1}));
  trainer.fit(Words{}, {.epochs = 1});
  return 0;
}
