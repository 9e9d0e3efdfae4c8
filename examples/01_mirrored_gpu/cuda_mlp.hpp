// CudaMlp: the MLP of examples/common/mlp.hpp on a GPU, written the way a user writes a CUDA
// model for cohort. The dense layers are cuBLAS SGEMMs; bias, ReLU, softmax cross-entropy and the
// bias gradients are small kernels of its own (cuda_mlp.cu). Its parameters have Mlp's layout
// (per layer: weights [out][in], then bias [out]), so a host Mlp can evaluate them.
//
// What makes it a placed model (core/model.hpp): the prototype holds the initial parameters on
// the host, and replicate(prototype, place) makes a replica on place.device, with its own cuBLAS
// handle bound to place.stream; its parameters() and gradients() are device memory, and
// forward_backward enqueues everything on that stream, waiting only for the batch's loss.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cohort/device/cuda.hpp>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "mlp.hpp"

namespace example {

// The kernels of cuda_mlp.cu, enqueued on `stream`; every pointer is device memory, matrices are
// row-major [examples][width].
namespace mlp_kernels {
// out[e][o] = out[e][o] + bias[o], then ReLU when relu.
void add_bias(float* out, const float* bias, std::size_t examples, std::size_t width, bool relu,
              cudaStream_t stream);
// Per example: delta = softmax(logits) - one_hot(label), losses[e] = its cross-entropy.
void softmax_cross_entropy(const float* logits, const std::int32_t* labels, std::size_t examples,
                           std::size_t classes, float* delta, double* losses, cudaStream_t stream);
// gradient[o] = sum over examples of delta[e][o].
void bias_gradient(const float* delta, std::size_t examples, std::size_t width, float* gradient,
                   cudaStream_t stream);
// delta[i] = 0 where activation[i] <= 0 (ReLU's derivative; activation is the layer's output).
void relu_backward(float* delta, const float* activation, std::size_t n, cudaStream_t stream);
}  // namespace mlp_kernels

inline void check_cublas(cublasStatus_t status, const char* call) {
  if (status == CUBLAS_STATUS_SUCCESS) return;
  throw cohort::DeviceError(std::string(call) + " failed: " + cublasGetStatusName(status) + " (" +
                            std::to_string(static_cast<int>(status)) +
                            "): " + cublasGetStatusString(status));
}
#define EXAMPLE_CUBLAS_CHECK(call) ::example::check_cublas((call), #call)

// A cuBLAS handle on one device, bound to one stream; destroyed with its owner.
class CublasHandle {
 public:
  CublasHandle() = default;
  explicit CublasHandle(const cohort::device::cuda::Place& place) : device_(place.device) {
    cohort::device::cuda::use(place.device);
    EXAMPLE_CUBLAS_CHECK(cublasCreate(&handle_));
    const cublasStatus_t bound = cublasSetStream(handle_, place.stream);
    if (bound != CUBLAS_STATUS_SUCCESS) {
      (void)cublasDestroy(handle_);
      handle_ = nullptr;
      check_cublas(bound, "cublasSetStream(handle_, place.stream)");
    }
  }
  CublasHandle(CublasHandle&& other) noexcept
      : device_(other.device_), handle_(std::exchange(other.handle_, nullptr)) {}
  CublasHandle& operator=(CublasHandle&& other) noexcept {
    CublasHandle moved(std::move(other));
    std::swap(device_, moved.device_);
    std::swap(handle_, moved.handle_);
    return *this;
  }
  CublasHandle(const CublasHandle&) = delete;
  CublasHandle& operator=(const CublasHandle&) = delete;
  ~CublasHandle() {
    if (handle_ == nullptr) return;
    (void)cudaSetDevice(device_);
    (void)cublasDestroy(handle_);
  }
  cublasHandle_t get() const { return handle_; }

 private:
  int device_ = 0;
  cublasHandle_t handle_ = nullptr;
};

class CudaMlp {
 public:
  using value_type = float;
  using batch_type = Batch;
  using Place = cohort::device::cuda::Place;
  template <class T>
  using Buffer = cohort::device::cuda::Buffer<T>;

  // The prototype: layer sizes (inputs, hidden..., classes) and the initial parameters in Mlp's
  // layout, on the host.
  CudaMlp(std::vector<std::size_t> sizes, std::vector<float> initial)
      : sizes_(std::move(sizes)), host_parameters_(std::move(initial)) {
    const std::size_t total = lay_out(sizes_, weight_offsets_, bias_offsets_);
    if (total != host_parameters_.size()) {
      throw std::invalid_argument("CudaMlp: " + std::to_string(host_parameters_.size()) +
                                  " initial parameters for layers that need " +
                                  std::to_string(total));
    }
    host_gradients_.assign(total, 0.0f);
  }

  // A replica of prototype (placed or not) on place.device, working on place.stream.
  static CudaMlp replicate(const CudaMlp& prototype, const Place& place) {
    CudaMlp replica(prototype.sizes_, prototype.host_parameters());
    replica.place_ = place;
    replica.blas_ = CublasHandle(place);
    replica.parameters_ = Buffer<float>(replica.host_parameters_.size(), place);
    replica.gradients_ = Buffer<float>(replica.host_parameters_.size(), place);
    cohort::device::Cuda::from_host(place, std::span<const float>(replica.host_parameters_),
                                    replica.parameters_.span());
    replica.host_parameters_ = {};
    replica.host_gradients_ = {};
    return replica;
  }

  // A copy lives where the original does.
  CudaMlp(const CudaMlp& other)
      : CudaMlp(other.place_ ? replicate(other, *other.place_)
                             : CudaMlp(other.sizes_, other.host_parameters_)) {}
  CudaMlp& operator=(const CudaMlp& other) {
    if (this != &other) *this = CudaMlp(other);
    return *this;
  }
  CudaMlp(CudaMlp&&) noexcept = default;
  CudaMlp& operator=(CudaMlp&&) noexcept = default;
  ~CudaMlp() = default;

  std::span<float> parameters() {
    return place_ ? parameters_.span() : std::span<float>(host_parameters_);
  }
  std::span<float> gradients() {
    return place_ ? gradients_.span() : std::span<float>(host_gradients_);
  }

  std::vector<float> host_parameters() const {
    if (!place_) return host_parameters_;
    std::vector<float> host(parameters_.size());
    cohort::device::Cuda::to_host(*place_, parameters_.span(), std::span<float>(host));
    return host;
  }

  // Overwrites the gradients with those of the summed cross-entropy over the batch.
  double forward_backward(const Batch& batch) {
    if (!place_) throw std::logic_error("CudaMlp::forward_backward on an unplaced prototype");
    const Place& place = *place_;
    const std::size_t examples = batch.size();
    if (batch.features != sizes_[0] || batch.inputs.size() != examples * sizes_[0]) {
      throw std::invalid_argument("CudaMlp: a batch of " + std::to_string(batch.features) +
                                  " features for a model of " + std::to_string(sizes_[0]));
    }
    if (examples == 0) {
      COHORT_CUDA_CHECK(cudaMemsetAsync(gradients_.span().data(), 0,
                                        gradients_.size() * sizeof(float), place.stream));
      return 0.0;
    }
    reserve(examples);
    cohort::device::cuda::use(place.device);
    COHORT_CUDA_CHECK(cudaMemcpyAsync(activations_[0].span().data(), batch.inputs.data(),
                                      batch.inputs.size() * sizeof(float), cudaMemcpyHostToDevice,
                                      place.stream));
    COHORT_CUDA_CHECK(cudaMemcpyAsync(labels_.span().data(), batch.labels.data(),
                                      examples * sizeof(std::int32_t), cudaMemcpyHostToDevice,
                                      place.stream));
    const float one = 1.0f;
    const float zero = 0.0f;
    const int b = static_cast<int>(examples);
    float* const p = parameters_.span().data();
    float* const g = gradients_.span().data();
    // Row-major [examples][width] is column-major (width x examples): cuBLAS sees X^T, W^T.
    for (std::size_t layer = 0; layer < layers(); ++layer) {
      const int in = static_cast<int>(sizes_[layer]);
      const int out = static_cast<int>(sizes_[layer + 1]);
      // Y (out x B) = W (out x in, stored as in x out) * X (in x B)
      EXAMPLE_CUBLAS_CHECK(cublasSgemm(blas_.get(), CUBLAS_OP_T, CUBLAS_OP_N, out, b, in, &one,
                                       p + weight_offsets_[layer], in,
                                       activations_[layer].span().data(), in, &zero,
                                       activations_[layer + 1].span().data(), out));
      mlp_kernels::add_bias(activations_[layer + 1].span().data(), p + bias_offsets_[layer],
                            examples, sizes_[layer + 1], layer + 1 < layers(), place.stream);
    }
    mlp_kernels::softmax_cross_entropy(activations_[layers()].span().data(), labels_.span().data(),
                                       examples, sizes_.back(), deltas_[layers()].span().data(),
                                       losses_.span().data(), place.stream);
    for (std::size_t layer = layers(); layer-- > 0;) {
      const int in = static_cast<int>(sizes_[layer]);
      const int out = static_cast<int>(sizes_[layer + 1]);
      const float* delta = deltas_[layer + 1].span().data();
      // dW (stored as in x out) = X (in x B) * delta^T (B x out)
      EXAMPLE_CUBLAS_CHECK(cublasSgemm(blas_.get(), CUBLAS_OP_N, CUBLAS_OP_T, in, out, b, &one,
                                       activations_[layer].span().data(), in, delta, out, &zero,
                                       g + weight_offsets_[layer], in));
      mlp_kernels::bias_gradient(delta, examples, sizes_[layer + 1], g + bias_offsets_[layer],
                                 place.stream);
      if (layer == 0) break;
      // delta_in (in x B) = W (stored as in x out) * delta (out x B), then ReLU's derivative.
      EXAMPLE_CUBLAS_CHECK(cublasSgemm(blas_.get(), CUBLAS_OP_N, CUBLAS_OP_N, in, b, out, &one,
                                       p + weight_offsets_[layer], in, delta, out, &zero,
                                       deltas_[layer].span().data(), in));
      mlp_kernels::relu_backward(deltas_[layer].span().data(), activations_[layer].span().data(),
                                 examples * sizes_[layer], place.stream);
    }
    host_losses_.resize(examples);
    cohort::device::Cuda::to_host(place, std::span<const double>(losses_.span().first(examples)),
                                  std::span<double>(host_losses_));
    double loss = 0.0;
    for (double example_loss : host_losses_) loss += example_loss;
    return loss;
  }

 private:
  std::size_t layers() const { return sizes_.size() - 1; }

  // Activations, deltas, labels and losses for batches of up to `examples` examples.
  void reserve(std::size_t examples) {
    if (labels_.size() >= examples) return;
    const Place& place = *place_;
    activations_.clear();
    deltas_.clear();
    for (std::size_t size : sizes_) {
      activations_.emplace_back(examples * size, place);
      deltas_.emplace_back(examples * size, place);
    }
    labels_ = Buffer<std::int32_t>(examples, place);
    losses_ = Buffer<double>(examples, place);
  }

  std::vector<std::size_t> sizes_;
  std::vector<std::size_t> weight_offsets_;
  std::vector<std::size_t> bias_offsets_;
  std::vector<float> host_parameters_;  // the prototype's
  std::vector<float> host_gradients_;
  std::optional<Place> place_;  // set for a replica
  CublasHandle blas_;
  Buffer<float> parameters_, gradients_;
  std::vector<Buffer<float>> activations_, deltas_;  // per layer, [examples][width]
  Buffer<std::int32_t> labels_;
  Buffer<double> losses_;
  std::vector<double> host_losses_;
};

}  // namespace example

#include <cohort/core/model.hpp>

template <>
struct cohort::ModelTraits<example::CudaMlp> : cohort::ModelMembers<example::CudaMlp> {};
