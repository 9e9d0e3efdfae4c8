// What the example MLPs share: the flat parameter layout and its initialization. The plain-loop
// Mlp (mlp.hpp), the Eigen MLP (eigen_mlp.hpp) and the GPU MLP of examples/01_mirrored_gpu lay
// their parameters out alike, so one parameter vector is the same function to each, and for a
// seed they start from the same values.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <random>
#include <span>
#include <vector>

namespace example {

// The flat parameter layout of an MLP with layer sizes `sizes` (inputs, hidden..., classes):
// layer l's weights at weight_offsets[l], sizes[l + 1] rows of sizes[l] (row o holds the weights
// into output unit o), then its sizes[l + 1] biases at bias_offsets[l]. Returns the number of
// parameters.
inline std::size_t lay_out(const std::vector<std::size_t>& sizes,
                           std::vector<std::size_t>& weight_offsets,
                           std::vector<std::size_t>& bias_offsets) {
  std::size_t total = 0;
  for (std::size_t layer = 0; layer + 1 < sizes.size(); ++layer) {
    weight_offsets.push_back(total);
    total += sizes[layer] * sizes[layer + 1];
    bias_offsets.push_back(total);
    total += sizes[layer + 1];
  }
  return total;
}

// He initialization from seed: every weight of layer l drawn from N(0, 2 / sizes[l]) in layout
// order (in double, then rounded to T), the biases left as they are (zero).
template <class T>
void initialize_he(const std::vector<std::size_t>& sizes,
                   const std::vector<std::size_t>& weight_offsets, std::uint64_t seed,
                   std::span<T> parameters) {
  std::mt19937_64 engine(seed);
  for (std::size_t layer = 0; layer + 1 < sizes.size(); ++layer) {
    std::normal_distribution<double> normal(0.0,
                                            std::sqrt(2.0 / static_cast<double>(sizes[layer])));
    const std::span<T> weights =
        parameters.subspan(weight_offsets[layer], sizes[layer] * sizes[layer + 1]);
    for (T& weight : weights) weight = static_cast<T>(normal(engine));
  }
}

}  // namespace example
