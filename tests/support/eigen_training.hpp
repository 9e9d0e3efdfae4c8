// The Eigen MLP of the examples (examples/common/eigen_mlp.hpp) on the small task of
// training.hpp, for the tests that train it in one process and across processes. Apart from
// training.hpp because every file that includes Eigen compiles slowly.
#pragma once

#include <cstddef>
#include <cstdint>

#include "eigen_mlp.hpp"
#include "training.hpp"

namespace cohort::testing {

// Hidden layers wider than one 16-row block, so that 2 or 3 threads split every product.
inline example::EigenMlp small_eigen_model(std::size_t threads = 1, std::uint64_t seed = 7) {
  return example::EigenMlp({8, 40, 24, 4}, seed, threads);
}

}  // namespace cohort::testing
