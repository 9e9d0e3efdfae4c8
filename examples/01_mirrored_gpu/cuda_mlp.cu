// The one CUDA translation unit of mirrored_gpu: CudaMlp's own kernels (cuda_mlp.hpp), and
// cohort's kernels instantiated for the program (cohort/cuda/instantiate.cuh).
#include <cohort/cuda/instantiate.cuh>
#include <cohort/device/cuda.hpp>
#include <cstddef>
#include <cstdint>

#include "cuda_mlp.hpp"

namespace example::mlp_kernels {
namespace {

constexpr unsigned kThreads = 256;

unsigned blocks_for(std::size_t n) { return static_cast<unsigned>((n + kThreads - 1) / kThreads); }

__device__ std::size_t index() {
  return static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}

__global__ void add_bias_kernel(float* out, const float* bias, std::size_t n, std::size_t width,
                                bool relu) {
  const std::size_t i = index();
  if (i >= n) return;
  const float value = out[i] + bias[i % width];
  out[i] = relu && !(value > 0.0f) ? 0.0f : value;
}

// One thread per example: the host Mlp's softmax cross-entropy (examples/common/mlp.hpp).
__global__ void softmax_cross_entropy_kernel(const float* logits, const std::int32_t* labels,
                                             std::size_t examples, std::size_t classes,
                                             float* delta, double* losses) {
  const std::size_t e = index();
  if (e >= examples) return;
  const float* z = logits + e * classes;
  float* d = delta + e * classes;
  float top = z[0];
  for (std::size_t c = 1; c < classes; ++c) top = z[c] > top ? z[c] : top;
  double normalizer = 0.0;
  for (std::size_t c = 0; c < classes; ++c) {
    d[c] = expf(z[c] - top);
    normalizer += d[c];
  }
  for (std::size_t c = 0; c < classes; ++c) d[c] = static_cast<float>(d[c] / normalizer);
  const auto label = static_cast<std::size_t>(labels[e]);
  losses[e] = log(normalizer) - static_cast<double>(z[label] - top);
  d[label] -= 1.0f;
}

__global__ void bias_gradient_kernel(const float* delta, std::size_t examples, std::size_t width,
                                     float* gradient) {
  const std::size_t o = index();
  if (o >= width) return;
  float sum = 0.0f;
  for (std::size_t e = 0; e < examples; ++e) sum += delta[e * width + o];
  gradient[o] = sum;
}

__global__ void relu_backward_kernel(float* delta, const float* activation, std::size_t n) {
  const std::size_t i = index();
  if (i < n && activation[i] <= 0.0f) delta[i] = 0.0f;
}

}  // namespace

void add_bias(float* out, const float* bias, std::size_t examples, std::size_t width, bool relu,
              cudaStream_t stream) {
  const std::size_t n = examples * width;
  if (n == 0) return;
  add_bias_kernel<<<blocks_for(n), kThreads, 0, stream>>>(out, bias, n, width, relu);
  cohort::device::cuda::check_launch("add_bias_kernel");
}

void softmax_cross_entropy(const float* logits, const std::int32_t* labels, std::size_t examples,
                           std::size_t classes, float* delta, double* losses, cudaStream_t stream) {
  if (examples == 0) return;
  softmax_cross_entropy_kernel<<<blocks_for(examples), kThreads, 0, stream>>>(
      logits, labels, examples, classes, delta, losses);
  cohort::device::cuda::check_launch("softmax_cross_entropy_kernel");
}

void bias_gradient(const float* delta, std::size_t examples, std::size_t width, float* gradient,
                   cudaStream_t stream) {
  if (width == 0) return;
  bias_gradient_kernel<<<blocks_for(width), kThreads, 0, stream>>>(delta, examples, width,
                                                                   gradient);
  cohort::device::cuda::check_launch("bias_gradient_kernel");
}

void relu_backward(float* delta, const float* activation, std::size_t n, cudaStream_t stream) {
  if (n == 0) return;
  relu_backward_kernel<<<blocks_for(n), kThreads, 0, stream>>>(delta, activation, n);
  cohort::device::cuda::check_launch("relu_backward_kernel");
}

}  // namespace example::mlp_kernels
