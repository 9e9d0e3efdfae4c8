// A classification task made from Gaussian blobs: every class owns several blobs at random places,
// so its examples do not lie on one side of any hyperplane and a linear model stays far from what
// a small MLP reaches. The task (blob centres) comes from one seed; training and held-out sets are
// independent samples of it.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>
#include <span>
#include <vector>

#include "batch.hpp"

namespace example {

class ClusterData {
 public:
  std::size_t size() const { return labels_.size(); }
  std::size_t features() const { return features_; }
  std::span<const float> example(std::size_t index) const {
    return std::span(inputs_).subspan(index * features_, features_);
  }
  std::int32_t label(std::size_t index) const { return labels_[index]; }

  // Gives example `index` a NaN feature: what a corrupted record does to training (the failure
  // demo, scripts/failures).
  void poison(std::size_t index) {
    inputs_.at(index * features_) = std::numeric_limits<float>::quiet_NaN();
  }

  Batch batch(std::span<const std::size_t> indices) const {
    Batch batch;
    batch.features = features_;
    batch.inputs.reserve(indices.size() * features_);
    batch.labels.reserve(indices.size());
    for (std::size_t index : indices) {
      const auto features = example(index);
      batch.inputs.insert(batch.inputs.end(), features.begin(), features.end());
      batch.labels.push_back(labels_[index]);
    }
    return batch;
  }

 private:
  friend class ClusterTask;
  std::size_t features_ = 0;
  std::vector<float> inputs_;
  std::vector<std::int32_t> labels_;
};

class ClusterTask {
 public:
  struct Options {
    std::size_t features = 8;
    std::size_t classes = 10;
    std::size_t blobs_per_class = 8;
    double blob_spread = 0.4;  // standard deviation of a blob; centres are standard normal
    std::uint64_t seed = 1;
  };

  explicit ClusterTask(Options options) : options_(options) {
    std::mt19937_64 engine(options_.seed);
    std::normal_distribution<float> normal;
    centres_.resize(options_.classes * options_.blobs_per_class * options_.features);
    for (float& coordinate : centres_) coordinate = normal(engine);
  }

  // `examples` examples drawn with their own stream, so that training and held-out sets differ.
  ClusterData sample(std::size_t examples, std::uint64_t stream) const {
    std::mt19937_64 engine(options_.seed * 0x9e3779b97f4a7c15ULL + stream + 1);
    std::normal_distribution<float> noise(0.0f, static_cast<float>(options_.blob_spread));
    std::uniform_int_distribution<std::size_t> pick_blob(
        0, options_.classes * options_.blobs_per_class - 1);
    ClusterData data;
    data.features_ = options_.features;
    data.inputs_.resize(examples * options_.features);
    data.labels_.resize(examples);
    for (std::size_t example = 0; example < examples; ++example) {
      const std::size_t blob = pick_blob(engine);
      data.labels_[example] = static_cast<std::int32_t>(blob / options_.blobs_per_class);
      for (std::size_t f = 0; f < options_.features; ++f) {
        data.inputs_[example * options_.features + f] =
            centres_[blob * options_.features + f] + noise(engine);
      }
    }
    return data;
  }

  const Options& options() const { return options_; }

 private:
  Options options_;
  std::vector<float> centres_;
};

// Fraction of `data` that `model` classifies correctly: any model with
// `std::vector<std::size_t> predict(const Batch&)`, asked 1024 examples at a time.
template <class Model>
double accuracy(Model& model, const ClusterData& data) {
  constexpr std::size_t kChunk = 1024;
  std::vector<std::size_t> indices;
  std::size_t correct = 0;
  for (std::size_t first = 0; first < data.size(); first += kChunk) {
    indices.resize(std::min(kChunk, data.size() - first));
    std::iota(indices.begin(), indices.end(), first);
    const std::vector<std::size_t> classes = model.predict(data.batch(indices));
    for (std::size_t i = 0; i < indices.size(); ++i) {
      correct += classes[i] == static_cast<std::size_t>(data.label(indices[i]));
    }
  }
  return static_cast<double>(correct) / static_cast<double>(data.size());
}

}  // namespace example
