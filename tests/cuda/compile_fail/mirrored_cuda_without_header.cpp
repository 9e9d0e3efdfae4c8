// Must not compile: Mirrored<device::Cuda, collective::Nccl> named with only strategy/mirrored.hpp
// included; the sentence names the header that defines it.
#include "cohort/collective/nccl.hpp"
#include "cohort/device/cuda.hpp"
#include "cohort/strategy/mirrored.hpp"

int main() {
  cohort::strategy::Mirrored<cohort::device::Cuda, cohort::collective::Nccl> mirrored({});
  return static_cast<int>(mirrored.replicas());
}
