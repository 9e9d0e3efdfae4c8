// What every kernel file shares: the nvcc guard, arithmetic on half and bfloat16 through float,
// the finite test, and the launch shape.
#pragma once

#if !defined(__CUDACC__)
#error \
    "cohort/cuda/*.cuh are CUDA sources: include them from a .cu file (host code: cuda/launch.hpp)"
#endif

#include <cfloat>
#include <cstddef>
#include <cstdint>

#include "cohort/cuda/launch.hpp"
#include "cohort/device/cuda.hpp"

namespace cohort::cuda::detail {

// Arithmetic<T>::Compute is the type T's operations are carried out in, and round() brings the
// result back. For half and bfloat16 that is float: a sum, product, or comparison of two of them
// computed in float and rounded once is the correctly rounded result (double rounding is
// innocuous when the wider format has at least 2p + 2 bits), i.e. what native half arithmetic
// gives, on every architecture.
template <class T>
struct Arithmetic {
  using Compute = T;
  static __host__ __device__ T widen(T x) { return x; }
  static __host__ __device__ T round(T x) { return x; }
};
template <>
struct Arithmetic<half> {
  using Compute = float;
  static __host__ __device__ float widen(half x) { return __half2float(x); }
  static __host__ __device__ half round(float x) { return __float2half_rn(x); }
};
template <>
struct Arithmetic<bfloat16> {
  using Compute = float;
  static __host__ __device__ float widen(bfloat16 x) { return __bfloat162float(x); }
  static __host__ __device__ bfloat16 round(float x) { return __float2bfloat16_rn(x); }
};

// Infinite and NaN both fail (NaN fails every comparison).
__device__ inline bool is_finite(float x) { return x <= FLT_MAX && x >= -FLT_MAX; }
__device__ inline bool is_finite(double x) { return x <= DBL_MAX && x >= -DBL_MAX; }

// ReduceOp on one pair, as cohort::combine (std::min / std::max keep their argument order, so
// NaN propagates the same way).
template <class C>
__device__ inline C combine_pair(ReduceOp op, C a, C b) {
  switch (op) {
    case ReduceOp::kSum:
      return a + b;
    case ReduceOp::kProduct:
      return a * b;
    case ReduceOp::kMin:
      return (b < a) ? b : a;
    case ReduceOp::kMax:
      return (a < b) ? b : a;
    case ReduceOp::kSumBfloat16:  // rounded as core/narrow_float.hpp's round_to_bfloat16 rounds
      return static_cast<C>(__bfloat162float(__float2bfloat16_rn(static_cast<float>(a + b))));
    case ReduceOp::kSumFloat16:  // and as its round_to_float16 rounds
      return static_cast<C>(__half2float(__float2half_rn(static_cast<float>(a + b))));
  }
  return a;
}

inline constexpr unsigned kThreads = 256;

// Blocks for a grid-stride loop over n elements (n >= 1): one element per thread up to a cap far
// beyond any GPU's resident threads, so each thread loops only for very large n.
inline unsigned blocks_for(std::size_t n) {
  const std::size_t blocks = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < (std::size_t{1} << 20) ? blocks : (std::size_t{1} << 20));
}

__device__ inline std::size_t first_index() {
  return static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ inline std::size_t grid_stride() {
  return static_cast<std::size_t>(gridDim.x) * blockDim.x;
}

}  // namespace cohort::cuda::detail
