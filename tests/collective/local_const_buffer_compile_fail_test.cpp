// Must not compile: all_reduce with one buffer works in place, so a read-only buffer is refused
// with a sentence (tests/collective/CMakeLists.txt expects "so pass a mutable std::span<T>").
#include <span>

#include "cohort/collective/local.hpp"

void reduce(cohort::collective::LocalCommunicator& comm, std::span<const float> gradients) {
  comm.all_reduce(gradients, cohort::ReduceOp::kSum);
}
