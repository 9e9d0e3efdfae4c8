// Twin test models: CpuTwin, a host model, and CudaTwin, the same model on a GPU with its own
// kernels (twin_kernels.cu), which computes CpuTwin's bits (twin_math.hpp says why). With them the
// GPU strategies are checked against Mirrored<> on the CPU with ==, never with a tolerance.
//
// CudaTwin is written as a user writes a CUDA model for cohort: the prototype holds its
// parameters on the host; ModelTraits<CudaTwin>::replicate (a static member, through
// ModelMembers) makes a replica at a device::cuda::Place, whose parameters() and gradients() are
// device memory and whose forward_backward enqueues its kernels on the place's stream.
#pragma once

#include <cuda_runtime_api.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <random>
#include <span>
#include <stdexcept>
#include <vector>

#include "cohort/core/model.hpp"
#include "cohort/device/cuda.hpp"
#include "mlp.hpp"  // example::Batch
#include "twin_math.hpp"

namespace cohort::test {

// Launches the twin's forward and backward over `examples` examples on `stream` (all pointers are
// device memory): hidden, error and delta are scratch of examples x hidden / outputs / hidden
// floats, losses receives each example's loss, gradients every parameter's gradient.
void twin_forward_backward(const twin::Shape& shape, const float* parameters, float* gradients,
                           const float* inputs, const std::int32_t* labels, std::size_t examples,
                           float* hidden, float* error, float* delta, double* losses,
                           cudaStream_t stream);

// He initialization from seed, biases zero: both twins start from these bits.
inline std::vector<float> twin_initial_parameters(const twin::Shape& shape, std::uint64_t seed) {
  std::vector<float> parameters(shape.parameters(), 0.0f);
  std::mt19937_64 engine(seed);
  std::normal_distribution<double> first(0.0, std::sqrt(2.0 / static_cast<double>(shape.inputs)));
  for (std::size_t j = shape.w1(); j < shape.b1(); ++j) {
    parameters[j] = static_cast<float>(first(engine));
  }
  std::normal_distribution<double> second(0.0, std::sqrt(2.0 / static_cast<double>(shape.hidden)));
  for (std::size_t j = shape.w2(); j < shape.b2(); ++j) {
    parameters[j] = static_cast<float>(second(engine));
  }
  return parameters;
}

class CpuTwin {
 public:
  using value_type = float;
  using batch_type = example::Batch;

  CpuTwin(twin::Shape shape, std::uint64_t seed)
      : shape_(shape),
        parameters_(twin_initial_parameters(shape, seed)),
        gradients_(parameters_.size(), 0.0f) {}

  std::span<float> parameters() { return parameters_; }
  std::span<float> gradients() { return gradients_; }
  std::vector<float> host_parameters() const { return parameters_; }

  double forward_backward(const example::Batch& batch) {
    const std::size_t examples = batch.size();
    const float* p = parameters_.data();
    const float* x = batch.inputs.data();
    hidden_.resize(examples * shape_.hidden);
    error_.resize(examples * shape_.outputs);
    delta_.resize(examples * shape_.hidden);
    for (std::size_t e = 0; e < examples; ++e) {
      for (std::size_t k = 0; k < shape_.hidden; ++k) {
        hidden_[e * shape_.hidden + k] = twin::hidden_unit(shape_, p, x, e, k);
      }
    }
    for (std::size_t e = 0; e < examples; ++e) {
      for (std::size_t o = 0; o < shape_.outputs; ++o) {
        error_[e * shape_.outputs + o] =
            twin::output_error(shape_, p, hidden_.data(), batch.labels.data(), e, o);
      }
    }
    double loss = 0.0;
    for (std::size_t e = 0; e < examples; ++e) {
      loss = loss + twin::example_loss(shape_, error_.data(), e);
    }
    for (std::size_t e = 0; e < examples; ++e) {
      for (std::size_t k = 0; k < shape_.hidden; ++k) {
        delta_[e * shape_.hidden + k] =
            twin::hidden_delta(shape_, p, hidden_.data(), error_.data(), e, k);
      }
    }
    for (std::size_t j = 0; j < gradients_.size(); ++j) {
      gradients_[j] =
          twin::gradient(shape_, x, hidden_.data(), error_.data(), delta_.data(), examples, j);
    }
    return loss;
  }

 private:
  twin::Shape shape_;
  std::vector<float> parameters_;
  std::vector<float> gradients_;
  std::vector<float> hidden_, error_, delta_;
};

class CudaTwin {
 public:
  using value_type = float;
  using batch_type = example::Batch;
  using Place = device::cuda::Place;

  // The prototype: parameters on the host, not placed.
  CudaTwin(twin::Shape shape, std::uint64_t seed)
      : shape_(shape),
        host_parameters_(twin_initial_parameters(shape, seed)),
        host_gradients_(host_parameters_.size(), 0.0f) {}

  // A replica of prototype (placed or not) at place: its parameters in place.device's memory.
  static CudaTwin replicate(const CudaTwin& prototype, const Place& place) {
    CudaTwin replica(prototype.shape_);
    const std::vector<float> initial = prototype.host_parameters();
    replica.place_ = place;
    replica.parameters_ = device::cuda::Buffer<float>(initial.size(), place);
    replica.gradients_ = device::cuda::Buffer<float>(initial.size(), place);
    device::Cuda::from_host(place, std::span<const float>(initial), replica.parameters_.span());
    return replica;
  }

  // A copy lives where the original does.
  CudaTwin(const CudaTwin& other)
      : CudaTwin(other.place_ ? replicate(other, *other.place_) : CudaTwin(other, Unplaced{})) {}
  CudaTwin& operator=(const CudaTwin& other) {
    if (this != &other) *this = CudaTwin(other);
    return *this;
  }
  CudaTwin(CudaTwin&&) noexcept = default;
  CudaTwin& operator=(CudaTwin&&) noexcept = default;
  ~CudaTwin() = default;

  std::span<float> parameters() {
    return place_ ? parameters_.span() : std::span<float>(host_parameters_);
  }
  std::span<float> gradients() {
    return place_ ? gradients_.span() : std::span<float>(host_gradients_);
  }
  const std::optional<Place>& place() const { return place_; }

  std::vector<float> host_parameters() const {
    if (!place_) return host_parameters_;
    std::vector<float> host(parameters_.size());
    device::Cuda::to_host(*place_, parameters_.span(), std::span<float>(host));
    return host;
  }

  double forward_backward(const example::Batch& batch) {
    if (!place_) throw std::logic_error("CudaTwin::forward_backward on an unplaced prototype");
    const Place& place = *place_;
    const std::size_t examples = batch.size();
    reserve(examples);
    const std::size_t inputs = examples * shape_.inputs;
    device::Cuda::from_host(place, std::span<const float>(batch.inputs),
                            inputs_.span().first(inputs));
    device::Cuda::from_host(place, std::span<const std::int32_t>(batch.labels),
                            labels_.span().first(examples));
    twin_forward_backward(shape_, parameters_.span().data(), gradients_.span().data(),
                          inputs_.span().data(), labels_.span().data(), examples,
                          hidden_.span().data(), error_.span().data(), delta_.span().data(),
                          losses_.span().data(), place.stream);
    host_losses_.resize(examples);
    device::Cuda::to_host(place, std::span<const double>(losses_.span().first(examples)),
                          std::span<double>(host_losses_));
    double loss = 0.0;
    for (double example_loss : host_losses_) loss = loss + example_loss;
    return loss;
  }

 private:
  struct Unplaced {};
  explicit CudaTwin(twin::Shape shape) : shape_(shape) {}
  CudaTwin(const CudaTwin& other, Unplaced)
      : shape_(other.shape_),
        host_parameters_(other.host_parameters_),
        host_gradients_(other.host_gradients_) {}

  // Scratch for batches of up to `examples` examples.
  void reserve(std::size_t examples) {
    if (labels_.size() >= examples) return;
    const Place& place = *place_;
    inputs_ = device::cuda::Buffer<float>(examples * shape_.inputs, place);
    labels_ = device::cuda::Buffer<std::int32_t>(examples, place);
    hidden_ = device::cuda::Buffer<float>(examples * shape_.hidden, place);
    error_ = device::cuda::Buffer<float>(examples * shape_.outputs, place);
    delta_ = device::cuda::Buffer<float>(examples * shape_.hidden, place);
    losses_ = device::cuda::Buffer<double>(examples, place);
  }

  twin::Shape shape_;
  std::vector<float> host_parameters_;  // the prototype's
  std::vector<float> host_gradients_;
  std::optional<Place> place_;  // set for a replica
  device::cuda::Buffer<float> parameters_, gradients_;
  device::cuda::Buffer<float> inputs_;
  device::cuda::Buffer<std::int32_t> labels_;
  device::cuda::Buffer<float> hidden_, error_, delta_;
  device::cuda::Buffer<double> losses_;
  std::vector<double> host_losses_;
};

}  // namespace cohort::test

template <>
struct cohort::ModelTraits<cohort::test::CpuTwin> : cohort::ModelMembers<cohort::test::CpuTwin> {};
template <>
struct cohort::ModelTraits<cohort::test::CudaTwin> : cohort::ModelMembers<cohort::test::CudaTwin> {
};
