// A small, fast training setup shared by the strategy and checkpoint tests: the examples' MLP on
// a small generated task.
#pragma once

#include <cohort/cohort.hpp>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <span>
#include <string>
#include <vector>

#include "clusters.hpp"
#include "mlp.hpp"

namespace cohort::testing {

inline const example::ClusterData& small_task_data() {
  static const example::ClusterData data =
      example::ClusterTask({.features = 8, .classes = 4, .blobs_per_class = 2, .seed = 3})
          .sample(2000, 0);
  return data;
}

inline example::Mlp small_model(std::uint64_t seed = 7) { return example::Mlp({8, 16, 4}, seed); }

// 13316 parameters: four blocks of the gradient norm (device::cpu::kNormBlock), so that a
// parameter server's block-aligned shards spread it over several servers.
inline example::Mlp wide_model(std::uint64_t seed = 7) { return example::Mlp({8, 1024, 4}, seed); }

// The optimizers the strategy tests train with, one of each kind; Adam clips at a norm the first
// steps exceed, so that the sum of squares takes part.
template <class Optimizer>
Optimizer test_optimizer();
template <>
inline optimizer::Sgd test_optimizer() {
  return optimizer::Sgd({.learning_rate = 0.1, .weight_decay = 1e-4});
}
template <>
inline optimizer::Momentum test_optimizer() {
  return optimizer::Momentum({.learning_rate = 0.05, .momentum = 0.9, .nesterov = true});
}
template <>
inline optimizer::Adam test_optimizer() {
  return optimizer::Adam({.learning_rate = 3e-3, .max_gradient_norm = 0.5});
}
template <>
inline optimizer::AdamW test_optimizer() {
  return optimizer::AdamW({.learning_rate = 3e-3, .weight_decay = 0.01});
}

// The bytes of a parameter vector: what the test programs write (write_parameters) and the tests
// compare, bit for bit, with what they read back (read_file).
inline std::string bytes_of(std::span<const float> values) {
  return {reinterpret_cast<const char*>(values.data()), values.size_bytes()};
}

inline void write_parameters(const std::filesystem::path& file, std::span<const float> values) {
  std::ofstream(file, std::ios::binary) << bytes_of(values);
}

template <Model M>
std::vector<float> parameters_of(const M& model) {
  auto copy = model;
  const auto parameters = ModelTraits<M>::parameters(copy);
  return {parameters.begin(), parameters.end()};
}

}  // namespace cohort::testing
