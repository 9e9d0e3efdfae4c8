// CudaTwin's kernels (twin_model.hpp): each computes one element with the twin_math.hpp function
// that CpuTwin's loops call, one element per thread, so the results are CpuTwin's bits.
#include "cohort/device/cuda.hpp"
#include "twin_math.hpp"
#include "twin_model.hpp"

namespace cohort::test {
namespace {

constexpr unsigned kThreads = 128;

unsigned blocks_for(std::size_t n) { return static_cast<unsigned>((n + kThreads - 1) / kThreads); }

__device__ std::size_t index() {
  return static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}

__global__ void hidden_kernel(twin::Shape s, const float* p, const float* x, std::size_t examples,
                              float* hidden) {
  const std::size_t t = index();
  if (t < examples * s.hidden) hidden[t] = twin::hidden_unit(s, p, x, t / s.hidden, t % s.hidden);
}

__global__ void error_kernel(twin::Shape s, const float* p, const float* hidden,
                             const std::int32_t* labels, std::size_t examples, float* error) {
  const std::size_t t = index();
  if (t < examples * s.outputs) {
    error[t] = twin::output_error(s, p, hidden, labels, t / s.outputs, t % s.outputs);
  }
}

__global__ void loss_kernel(twin::Shape s, const float* error, std::size_t examples,
                            double* losses) {
  const std::size_t e = index();
  if (e < examples) losses[e] = twin::example_loss(s, error, e);
}

__global__ void delta_kernel(twin::Shape s, const float* p, const float* hidden, const float* error,
                             std::size_t examples, float* delta) {
  const std::size_t t = index();
  if (t < examples * s.hidden) {
    delta[t] = twin::hidden_delta(s, p, hidden, error, t / s.hidden, t % s.hidden);
  }
}

__global__ void gradient_kernel(twin::Shape s, const float* x, const float* hidden,
                                const float* error, const float* delta, std::size_t examples,
                                float* gradients) {
  const std::size_t j = index();
  if (j < s.parameters()) gradients[j] = twin::gradient(s, x, hidden, error, delta, examples, j);
}

}  // namespace

void twin_forward_backward(const twin::Shape& shape, const float* parameters, float* gradients,
                           const float* inputs, const std::int32_t* labels, std::size_t examples,
                           float* hidden, float* error, float* delta, double* losses,
                           cudaStream_t stream) {
  if (examples > 0) {
    hidden_kernel<<<blocks_for(examples * shape.hidden), kThreads, 0, stream>>>(
        shape, parameters, inputs, examples, hidden);
    device::cuda::check_launch("twin hidden_kernel");
    error_kernel<<<blocks_for(examples * shape.outputs), kThreads, 0, stream>>>(
        shape, parameters, hidden, labels, examples, error);
    device::cuda::check_launch("twin error_kernel");
    loss_kernel<<<blocks_for(examples), kThreads, 0, stream>>>(shape, error, examples, losses);
    device::cuda::check_launch("twin loss_kernel");
    delta_kernel<<<blocks_for(examples * shape.hidden), kThreads, 0, stream>>>(
        shape, parameters, hidden, error, examples, delta);
    device::cuda::check_launch("twin delta_kernel");
  }
  gradient_kernel<<<blocks_for(shape.parameters()), kThreads, 0, stream>>>(
      shape, inputs, hidden, error, delta, examples, gradients);
  device::cuda::check_launch("twin gradient_kernel");
}

}  // namespace cohort::test
