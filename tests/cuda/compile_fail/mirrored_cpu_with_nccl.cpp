// Must not compile: host replicas with the GPU collective (tests/cuda/CMakeLists.txt expects the
// sentence that says what to use instead).
#include "cohort/collective/nccl.hpp"
#include "cohort/strategy/mirrored_cuda.hpp"

int main() {
  cohort::strategy::Mirrored<cohort::device::Cpu, cohort::collective::Nccl> mirrored(
      {.replicas = 1});
  return static_cast<int>(mirrored.replicas());
}
