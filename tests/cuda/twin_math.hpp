// The arithmetic of the twin test models (twin_model.hpp), one element at a time, written once for
// both: CpuTwin calls these functions in host loops, CudaTwin's kernels (twin_kernels.cu) call
// them one element per thread. Each sum runs sequentially in index order, each product and sum is
// its own statement (rounded; -ffp-contract=off and -fmad=false keep them from becoming an FMA),
// and nothing calls a library function whose last bit may differ between the host and the GPU
// (no exp, no log): so a CudaTwin computes its CpuTwin's bits.
//
// The model: inputs -> hidden (ReLU) -> outputs, with the loss 0.5 * |outputs - one_hot(label)|^2
// per example, summed over the batch. Parameters, in order: W1 [hidden][inputs], b1 [hidden],
// W2 [outputs][hidden], b2 [outputs]. Batches are example::Batch (row-major inputs, int32 labels).
#pragma once

#include <cstddef>
#include <cstdint>

#include "cohort/core/host_device.hpp"

namespace cohort::test::twin {

struct Shape {
  std::size_t inputs = 8;
  std::size_t hidden = 16;
  std::size_t outputs = 4;

  COHORT_HOST_DEVICE std::size_t w1() const { return 0; }
  COHORT_HOST_DEVICE std::size_t b1() const { return hidden * inputs; }
  COHORT_HOST_DEVICE std::size_t w2() const { return b1() + hidden; }
  COHORT_HOST_DEVICE std::size_t b2() const { return w2() + outputs * hidden; }
  COHORT_HOST_DEVICE std::size_t parameters() const { return b2() + outputs; }
};

// bias + sum_i weights[i] * values[i], i from 0 to n - 1.
COHORT_HOST_DEVICE inline float affine(float bias, const float* weights, const float* values,
                                       std::size_t n) {
  float sum = bias;
  for (std::size_t i = 0; i < n; ++i) {
    const float product = weights[i] * values[i];
    sum = sum + product;
  }
  return sum;
}

// hidden[e * H + k]: ReLU(b1[k] + sum_i W1[k][i] * x[e][i]).
COHORT_HOST_DEVICE inline float hidden_unit(const Shape& s, const float* p, const float* x,
                                            std::size_t e, std::size_t k) {
  const float sum = affine(p[s.b1() + k], p + s.w1() + k * s.inputs, x + e * s.inputs, s.inputs);
  return sum > 0.0f ? sum : 0.0f;
}

// error[e * O + o]: b2[o] + sum_k W2[o][k] * hidden[e][k], minus the one-hot target.
COHORT_HOST_DEVICE inline float output_error(const Shape& s, const float* p, const float* hidden,
                                             const std::int32_t* labels, std::size_t e,
                                             std::size_t o) {
  const float sum =
      affine(p[s.b2() + o], p + s.w2() + o * s.hidden, hidden + e * s.hidden, s.hidden);
  const float target = labels[e] == static_cast<std::int32_t>(o) ? 1.0f : 0.0f;
  return sum - target;
}

// Example e's loss, in double: 0.5 * sum_o error^2.
COHORT_HOST_DEVICE inline double example_loss(const Shape& s, const float* error, std::size_t e) {
  double sum = 0.0;
  for (std::size_t o = 0; o < s.outputs; ++o) {
    const double value = static_cast<double>(error[e * s.outputs + o]);
    const double square = value * value;
    sum = sum + square;
  }
  return 0.5 * sum;
}

// hidden_delta[e * H + k]: the loss's gradient at hidden unit k's input (0 where ReLU cut it).
COHORT_HOST_DEVICE inline float hidden_delta(const Shape& s, const float* p, const float* hidden,
                                             const float* error, std::size_t e, std::size_t k) {
  if (!(hidden[e * s.hidden + k] > 0.0f)) return 0.0f;
  float sum = 0.0f;
  for (std::size_t o = 0; o < s.outputs; ++o) {
    const float product = p[s.w2() + o * s.hidden + k] * error[e * s.outputs + o];
    sum = sum + product;
  }
  return sum;
}

// The gradient of the batch's summed loss for parameter j, examples added in order.
COHORT_HOST_DEVICE inline float gradient(const Shape& s, const float* x, const float* hidden,
                                         const float* error, const float* delta,
                                         std::size_t examples, std::size_t j) {
  float sum = 0.0f;
  if (j < s.b1()) {
    const std::size_t k = j / s.inputs;
    const std::size_t i = j % s.inputs;
    for (std::size_t e = 0; e < examples; ++e) {
      const float product = delta[e * s.hidden + k] * x[e * s.inputs + i];
      sum = sum + product;
    }
  } else if (j < s.w2()) {
    const std::size_t k = j - s.b1();
    for (std::size_t e = 0; e < examples; ++e) sum = sum + delta[e * s.hidden + k];
  } else if (j < s.b2()) {
    const std::size_t o = (j - s.w2()) / s.hidden;
    const std::size_t k = (j - s.w2()) % s.hidden;
    for (std::size_t e = 0; e < examples; ++e) {
      const float product = error[e * s.outputs + o] * hidden[e * s.hidden + k];
      sum = sum + product;
    }
  } else {
    const std::size_t o = j - s.b2();
    for (std::size_t e = 0; e < examples; ++e) sum = sum + error[e * s.outputs + o];
  }
  return sum;
}

}  // namespace cohort::test::twin
