// A multilayer perceptron written the way a researcher writes one: its own forward and backward
// passes over plain vectors, nothing of cohort inside. Layers are dense with ReLU between them and
// a softmax cross-entropy at the end; Mlp({16, 10}) is the linear baseline (softmax regression).
//
// The one line that makes it trainable by cohort is the ModelTraits specialization at the bottom.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "batch.hpp"
#include "cohort/core/model.hpp"
#include "mlp_layout.hpp"

namespace example {

class Mlp {
 public:
  using value_type = float;
  using batch_type = Batch;

  // layer_sizes: inputs, hidden..., classes. Weights by He initialization from seed.
  Mlp(std::vector<std::size_t> layer_sizes, std::uint64_t seed) : sizes_(std::move(layer_sizes)) {
    const std::size_t total = lay_out(sizes_, weight_offsets_, bias_offsets_);
    parameters_.assign(total, 0.0f);
    gradients_.assign(total, 0.0f);
    initialize_he(sizes_, weight_offsets_, seed, std::span<float>(parameters_));
    for (std::size_t size : sizes_) activations_.emplace_back(size);
    deltas_ = activations_;
  }

  std::span<float> parameters() { return parameters_; }
  std::span<float> gradients() { return gradients_; }

  // Overwrites the gradients with those of the summed cross-entropy over the batch.
  double forward_backward(const Batch& batch) {
    return forward_backward(batch, [](std::size_t, std::size_t) {});
  }

  // The same, and calls ready(begin, end) as each layer's gradients [begin, end) become final
  // (during the last example's backward pass, last layer first), so that a trainer can start
  // communicating them while the earlier layers are still computed.
  template <class Ready>
  double forward_backward(const Batch& batch, Ready&& ready) {
    std::fill(gradients_.begin(), gradients_.end(), 0.0f);
    double loss = 0.0;
    for (std::size_t example = 0; example < batch.size(); ++example) {
      forward(std::span(batch.inputs).subspan(example * batch.features, batch.features));
      const bool last = example + 1 == batch.size();
      loss += backward(batch.labels[example], [&](std::size_t layer) {
        if (last) ready(weight_offsets_[layer], bias_offsets_[layer] + sizes_[layer + 1]);
      });
    }
    if (batch.size() == 0) ready(std::size_t{0}, gradients_.size());
    return loss;
  }

  // A forward pass only: the summed cross-entropy and the number of correct predictions
  // (cohort's evaluation on held-out data, core/model.hpp).
  cohort::NamedSums evaluate(const Batch& batch) {
    double loss = 0.0;
    double correct = 0.0;
    for (std::size_t example = 0; example < batch.size(); ++example) {
      const std::size_t predicted =
          predict(std::span(batch.inputs).subspan(example * batch.features, batch.features));
      loss += cross_entropy(batch.labels[example]);
      correct += predicted == static_cast<std::size_t>(batch.labels[example]) ? 1.0 : 0.0;
    }
    return {{"loss", loss}, {"correct", correct}};
  }

  // The class of highest logit, for one example's features and for each example of a batch.
  std::size_t predict(std::span<const float> features) {
    forward(features);
    const auto& logits = activations_.back();
    return static_cast<std::size_t>(std::max_element(logits.begin(), logits.end()) -
                                    logits.begin());
  }
  std::vector<std::size_t> predict(const Batch& batch) {
    std::vector<std::size_t> classes(batch.size());
    for (std::size_t example = 0; example < batch.size(); ++example) {
      classes[example] =
          predict(std::span(batch.inputs).subspan(example * batch.features, batch.features));
    }
    return classes;
  }

 private:
  std::size_t layers() const { return sizes_.size() - 1; }

  void forward(std::span<const float> features) {
    std::copy(features.begin(), features.end(), activations_[0].begin());
    for (std::size_t layer = 0; layer < layers(); ++layer) {
      const std::size_t in = sizes_[layer];
      const float* weights = parameters_.data() + weight_offsets_[layer];
      const float* bias = parameters_.data() + bias_offsets_[layer];
      const float* input = activations_[layer].data();
      float* output = activations_[layer + 1].data();
      const bool hidden = layer + 1 < layers();
      for (std::size_t o = 0; o < sizes_[layer + 1]; ++o) {
        float sum = bias[o];
        for (std::size_t i = 0; i < in; ++i) sum += weights[o * in + i] * input[i];
        output[o] = hidden ? std::max(sum, 0.0f) : sum;
      }
    }
  }

  // Softmax cross-entropy of the last forward pass against `label`; leaves its gradient with
  // respect to the logits in the last deltas.
  double cross_entropy(std::int32_t label) {
    auto& logits = activations_.back();
    auto& delta = deltas_.back();
    const float top = *std::max_element(logits.begin(), logits.end());
    double normalizer = 0.0;
    for (std::size_t c = 0; c < logits.size(); ++c) {
      delta[c] = std::exp(logits[c] - top);
      normalizer += delta[c];
    }
    for (float& p : delta) p = static_cast<float>(p / normalizer);
    const double loss = std::log(normalizer) - (logits[label] - top);
    delta[label] -= 1.0f;
    return loss;
  }

  // The cross-entropy of the last forward pass against `label`; accumulates gradients and calls
  // layer_done(layer) when a layer's are accumulated.
  template <class LayerDone>
  double backward(std::int32_t label, LayerDone&& layer_done) {
    const double loss = cross_entropy(label);

    for (std::size_t layer = layers(); layer-- > 0;) {
      const std::size_t in = sizes_[layer];
      const float* weights = parameters_.data() + weight_offsets_[layer];
      float* weight_gradients = gradients_.data() + weight_offsets_[layer];
      float* bias_gradients = gradients_.data() + bias_offsets_[layer];
      const float* input = activations_[layer].data();
      const float* output_delta = deltas_[layer + 1].data();
      for (std::size_t o = 0; o < sizes_[layer + 1]; ++o) {
        bias_gradients[o] += output_delta[o];
        for (std::size_t i = 0; i < in; ++i)
          weight_gradients[o * in + i] += output_delta[o] * input[i];
      }
      layer_done(layer);
      if (layer == 0) break;
      float* input_delta = deltas_[layer].data();
      std::fill(input_delta, input_delta + in, 0.0f);
      for (std::size_t o = 0; o < sizes_[layer + 1]; ++o) {
        for (std::size_t i = 0; i < in; ++i)
          input_delta[i] += weights[o * in + i] * output_delta[o];
      }
      for (std::size_t i = 0; i < in; ++i) {
        if (input[i] <= 0.0f) input_delta[i] = 0.0f;  // ReLU: input is the layer's activation
      }
    }
    return loss;
  }

  std::vector<std::size_t> sizes_;
  std::vector<std::size_t> weight_offsets_;
  std::vector<std::size_t> bias_offsets_;
  std::vector<float> parameters_;
  std::vector<float> gradients_;
  std::vector<std::vector<float>> activations_;  // per layer, of the example in flight
  std::vector<std::vector<float>> deltas_;
};

}  // namespace example

template <>
struct cohort::ModelTraits<example::Mlp> : cohort::ModelMembers<example::Mlp> {};
