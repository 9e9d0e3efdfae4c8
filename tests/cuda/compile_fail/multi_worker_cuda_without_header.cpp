// Must not compile: MultiWorkerMirrored<device::Cuda> named with only
// strategy/multi_worker_mirrored.hpp included; the sentence names the header that defines it.
#include "cohort/device/cuda.hpp"
#include "cohort/strategy/multi_worker_mirrored.hpp"

int main() {
  cohort::strategy::MultiWorkerMirrored<cohort::device::Cuda> strategy({});
  return static_cast<int>(strategy.replicas());
}
