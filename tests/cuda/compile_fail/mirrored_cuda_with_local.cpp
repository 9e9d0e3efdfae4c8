// Must not compile: GPU replicas with the host collective. Mirrored on device::Cuda reduces GPU
// memory with collective::Nccl, and says so (tests/cuda/CMakeLists.txt expects the sentence).
#include "cohort/collective/local.hpp"
#include "cohort/strategy/mirrored_cuda.hpp"

int main() {
  cohort::strategy::Mirrored<cohort::device::Cuda, cohort::collective::Local> mirrored(
      {.replicas = 1});
  return static_cast<int>(mirrored.replicas());
}
