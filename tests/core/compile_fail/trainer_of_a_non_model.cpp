// Must not compile: a Trainer of a type nobody described through cohort::ModelTraits, used as a
// program uses one. The not-a-Model sentence must be the only error (tests/core/CMakeLists.txt
// counts them): none of the members that need the model's types may add its own.
#include <span>
#include <vector>

#include "cohort/cohort.hpp"

struct NotAModel {
  float weight = 0.0f;
};

struct Points {
  std::size_t size() const { return 8; }
  std::vector<float> batch(std::span<const std::size_t> indices) const {
    return std::vector<float>(indices.size());
  }
};

int main() {
  cohort::Trainer trainer(NotAModel{}, cohort::strategy::Mirrored<>({.replicas = 2}),
                          cohort::optimizer::Sgd({.learning_rate = 0.1}));
  trainer.fit(Points{}, {.epochs = 1});
  trainer.save("run.ckpt");
  trainer.restore("run.ckpt");
  return trainer.step() == 0 ? 0 : 1;
}
