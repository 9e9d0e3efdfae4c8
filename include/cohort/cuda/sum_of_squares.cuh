// sum_of_squares: the global-norm reduction of gradient clipping, in the CPU's order.
#pragma once

#if !defined(__CUDACC__)
#error \
    "cohort/cuda/*.cuh are CUDA sources: include them from a .cu file (host code: cuda/launch.hpp)"
#endif

#include "cohort/cuda/common.cuh"

namespace cohort::cuda {
namespace detail {

// Purpose: partial[b] = sum of x[i]^2 over norm block b (kNormBlock elements), in double.
// Algorithm: one thread per block, adding its elements sequentially from the first, as
// device::cpu::sum_of_squares does; the square and the sum are separate roundings
// (-fmad=false). Thread t of a CTA walks addresses kNormBlock elements away from thread t + 1's,
// so the lines a warp touches stay in L1 across the next iterations.
// Preconditions: partial holds ceil(n / kNormBlock) doubles.
template <class T>
__global__ void block_squares_kernel(const T* x, std::size_t n, double* partial) {
  using A = Arithmetic<T>;
  const std::size_t blocks = (n + kNormBlock - 1) / kNormBlock;
  for (std::size_t b = first_index(); b < blocks; b += grid_stride()) {
    const std::size_t begin = b * kNormBlock;
    const std::size_t end = begin + kNormBlock < n ? begin + kNormBlock : n;
    double sum = 0.0;
    for (std::size_t i = begin; i < end; ++i) {
      const double value = static_cast<double>(A::widen(x[i]));
      const double square = value * value;
      sum = sum + square;
    }
    partial[b] = sum;
  }
}

inline constexpr unsigned kTreeThreads = 1024;

// Purpose: *result = the canonical-tree fold of partial[0 .. count).
// Algorithm: one CTA adds neighbours level by level ((p0+p1), (p2+p3), ..., an odd last carried
// up), which is the canonical tree of core/reduction_tree.hpp; each level reads one half of the
// workspace and writes the other, with a __syncthreads between levels.
// Preconditions: a single CTA; workspace holds 2 * max(count, 1) doubles, partial = workspace.
__global__ void tree_sum_kernel(double* workspace, std::size_t count, double* result) {
  if (count == 0) {
    if (threadIdx.x == 0) *result = 0.0;
    return;
  }
  double* from = workspace;
  double* to = workspace + count;
  while (count > 1) {
    const std::size_t pairs = count / 2;
    for (std::size_t i = threadIdx.x; i < pairs; i += blockDim.x) {
      to[i] = from[2 * i] + from[2 * i + 1];
    }
    if (count % 2 == 1 && threadIdx.x == 0) to[pairs] = from[count - 1];
    __syncthreads();
    count = pairs + count % 2;
    double* swap = from;
    from = to;
    to = swap;
  }
  if (threadIdx.x == 0) *result = from[0];
}

}  // namespace detail

template <class T>
void sum_of_squares(const T* x, std::size_t n, double* workspace, double* result,
                    cudaStream_t stream) {
  const std::size_t blocks = (n + kNormBlock - 1) / kNormBlock;
  if (blocks > 0) {
    detail::block_squares_kernel<<<detail::blocks_for(blocks), detail::kThreads, 0, stream>>>(
        x, n, workspace);
    device::cuda::check_launch("cohort::cuda::sum_of_squares (blocks)");
  }
  detail::tree_sum_kernel<<<1, detail::kTreeThreads, 0, stream>>>(workspace, blocks, result);
  device::cuda::check_launch("cohort::cuda::sum_of_squares (tree)");
}

}  // namespace cohort::cuda
