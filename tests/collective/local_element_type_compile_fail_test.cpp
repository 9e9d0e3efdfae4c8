// Must not compile: Local moves float, double, std::int32_t and std::int64_t only, and says so
// (tests/collective/CMakeLists.txt expects "moves float, double, std::int32_t or std::int64_t").
#include <cstdint>
#include <span>

#include "cohort/collective/local.hpp"

void reduce(cohort::collective::LocalCommunicator& comm, std::span<std::int16_t> counts) {
  comm.all_reduce(counts, cohort::ReduceOp::kSum);
}
