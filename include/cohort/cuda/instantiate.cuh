// Instantiates every kernel of cuda/launch.hpp. Include it from exactly one .cu of a program (the
// Boost.Asio impl/src.hpp pattern); the program's .cpp files then call the launch.hpp
// declarations and never need nvcc. tests/cuda/instantiate.cu and benchmarks/cuda/instantiate.cu
// are the whole of such a file.
#pragma once

#if !defined(__CUDACC__)
#error "cohort/cuda/instantiate.cuh is a CUDA source: include it from one .cu file"
#endif

#include "cohort/cuda/elementwise.cuh"
#include "cohort/cuda/optimizer_update.cuh"
#include "cohort/cuda/reduce_tree.cuh"
#include "cohort/cuda/sum_of_squares.cuh"

namespace cohort::cuda::detail {
// Names without a comma, for the macros below.
template <class P>
using AdamRuleOf = optimizer::AdamRule<P, optimizer::WeightDecay::kCoupled>;
template <class P>
using AdamWRuleOf = optimizer::AdamRule<P, optimizer::WeightDecay::kDecoupled>;
}  // namespace cohort::cuda::detail

#define COHORT_CUDA_INSTANTIATE_VALUE(T)                                                      \
  template void cohort::cuda::scale<T>(T*, std::size_t, T, cudaStream_t);                     \
  template void cohort::cuda::axpy<T>(T, const T*, T*, std::size_t, cudaStream_t);            \
  template void cohort::cuda::combine_into<T>(cohort::ReduceOp, T*, const T*, std::size_t,    \
                                              cudaStream_t);                                  \
  template void cohort::cuda::reduce_tree<T>(cohort::ReduceOp, std::span<const T* const>, T*, \
                                             std::size_t, cudaStream_t);                      \
  template void cohort::cuda::sum_of_squares<T>(const T*, std::size_t, double*, double*,      \
                                                cudaStream_t);                                \
  template void cohort::cuda::flag_nonfinite<T>(const T*, std::size_t, int*, cudaStream_t);   \
  template void cohort::cuda::first_nonfinite<T>(const T*, std::size_t, unsigned long long*,  \
                                                 cudaStream_t);

#define COHORT_CUDA_INSTANTIATE_UPDATE(Rule, P, G)                                                 \
  template void cohort::cuda::update<Rule, P, G>(const Rule&, P*, const G*, P*, std::size_t, int*, \
                                                 cudaStream_t);

#define COHORT_CUDA_INSTANTIATE_RULES(P, G)                                 \
  COHORT_CUDA_INSTANTIATE_UPDATE(cohort::optimizer::SgdRule<P>, P, G)       \
  COHORT_CUDA_INSTANTIATE_UPDATE(cohort::optimizer::MomentumRule<P>, P, G)  \
  COHORT_CUDA_INSTANTIATE_UPDATE(cohort::cuda::detail::AdamRuleOf<P>, P, G) \
  COHORT_CUDA_INSTANTIATE_UPDATE(cohort::cuda::detail::AdamWRuleOf<P>, P, G)

#define COHORT_CUDA_INSTANTIATE_CAST(From, To) \
  template void cohort::cuda::cast<From, To>(const From*, To*, std::size_t, cudaStream_t);

COHORT_CUDA_INSTANTIATE_CAST(float, cohort::cuda::half)
COHORT_CUDA_INSTANTIATE_CAST(cohort::cuda::half, float)
COHORT_CUDA_INSTANTIATE_CAST(float, cohort::cuda::bfloat16)
COHORT_CUDA_INSTANTIATE_CAST(cohort::cuda::bfloat16, float)
COHORT_CUDA_INSTANTIATE_CAST(float, double)
COHORT_CUDA_INSTANTIATE_CAST(double, float)
COHORT_CUDA_INSTANTIATE_VALUE(float)
COHORT_CUDA_INSTANTIATE_VALUE(double)
COHORT_CUDA_INSTANTIATE_VALUE(cohort::cuda::half)
COHORT_CUDA_INSTANTIATE_VALUE(cohort::cuda::bfloat16)
COHORT_CUDA_INSTANTIATE_RULES(float, float)
COHORT_CUDA_INSTANTIATE_RULES(float, cohort::cuda::half)
COHORT_CUDA_INSTANTIATE_RULES(float, cohort::cuda::bfloat16)
COHORT_CUDA_INSTANTIATE_RULES(double, double)
