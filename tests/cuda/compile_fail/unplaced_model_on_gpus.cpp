// Must not compile: a host model (no ModelTraits<M>::replicate) trained by GPU replicas. The
// Trainer says how to place it (tests/cuda/CMakeLists.txt expects the sentence).
#include <cohort/cohort.hpp>
#include <span>
#include <vector>

#include "cohort/strategy/mirrored_cuda.hpp"

struct HostLine {
  using value_type = float;
  using batch_type = std::vector<float>;
  std::vector<float> weights{0.0f}, grads{0.0f};
  std::span<float> parameters() { return weights; }
  std::span<float> gradients() { return grads; }
  double forward_backward(const batch_type&) { return 0.0; }
};

template <>
struct cohort::ModelTraits<HostLine> : cohort::ModelMembers<HostLine> {};

int main() {
  cohort::Trainer trainer(
      HostLine{}, cohort::strategy::Mirrored<cohort::device::Cuda, cohort::collective::Nccl>({}),
      cohort::optimizer::Sgd({.learning_rate = 0.1}));
  return static_cast<int>(trainer.step());
}
