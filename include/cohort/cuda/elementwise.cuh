// scale, axpy, combine_into, flag_nonfinite and first_nonfinite, the elementwise kernels of
// device/cpu.hpp, and cast between float and the other floating-point types.
#pragma once

#if !defined(__CUDACC__)
#error \
    "cohort/cuda/*.cuh are CUDA sources: include them from a .cu file (host code: cuda/launch.hpp)"
#endif

#include <type_traits>

#include "cohort/cuda/common.cuh"

namespace cohort::cuda {
namespace detail {

// Purpose: x[i] = alpha * x[i] (device::cpu::scale).
// Algorithm: grid-stride loop, one product per element, rounded to T.
// Preconditions: x holds n elements.
template <class T>
__global__ void scale_kernel(T* x, std::size_t n, T alpha) {
  using A = Arithmetic<T>;
  for (std::size_t i = first_index(); i < n; i += grid_stride()) {
    x[i] = A::round(A::widen(alpha) * A::widen(x[i]));
  }
}

// Purpose: y[i] = alpha * x[i] + y[i] (device::cpu::axpy).
// Algorithm: grid-stride loop; the product and the sum are separate statements, each rounded to
// T, and -fmad=false keeps them from becoming one FMA, as -ffp-contract=off does on the CPU.
// Preconditions: x and y hold n elements and do not overlap unless equal.
template <class T>
__global__ void axpy_kernel(T alpha, const T* x, T* y, std::size_t n) {
  using A = Arithmetic<T>;
  for (std::size_t i = first_index(); i < n; i += grid_stride()) {
    const T product = A::round(A::widen(alpha) * A::widen(x[i]));
    y[i] = A::round(A::widen(product) + A::widen(y[i]));
  }
}

// Purpose: inout[i] = inout[i] (op) in[i] (device::cpu::combine_into).
// Algorithm: grid-stride loop, one combine_pair per element in the CPU's argument order (inout on
// the left), computed in Arithmetic<T>::Compute and rounded once to T.
// Preconditions: inout and in hold n elements and do not overlap.
template <class T>
__global__ void combine_into_kernel(ReduceOp op, T* inout, const T* in, std::size_t n) {
  using A = Arithmetic<T>;
  using C = typename A::Compute;
  for (std::size_t i = first_index(); i < n; i += grid_stride()) {
    inout[i] = A::round(combine_pair<C>(op, A::widen(inout[i]), A::widen(in[i])));
  }
}

// Purpose: *flag = 1 if some x[i] is infinite or NaN (device::cpu::all_finite, negated).
// Algorithm: grid-stride loop; every thread that finds one stores 1 (a benign race: all store
// the same value). No atomics, no reduction.
// Preconditions: x holds n elements; *flag was zeroed by the caller.
template <class T>
__global__ void flag_nonfinite_kernel(const T* x, std::size_t n, int* flag) {
  using A = Arithmetic<T>;
  bool bad = false;
  for (std::size_t i = first_index(); i < n; i += grid_stride()) bad |= !is_finite(A::widen(x[i]));
  if (bad) *flag = 1;
}

// Purpose: *first = the least i for which x[i] is infinite or NaN (device::cpu::first_nonfinite),
// left as it was when there is none.
// Algorithm: grid-stride loop; each thread keeps the first it finds (its indices grow) and, if
// any, takes the minimum with *first by one atomicMin. The result does not depend on the schedule.
// Preconditions: x holds n elements; *first was set to a value >= n by the caller (all ones).
template <class T>
__global__ void first_nonfinite_kernel(const T* x, std::size_t n, unsigned long long* first) {
  using A = Arithmetic<T>;
  for (std::size_t i = first_index(); i < n; i += grid_stride()) {
    if (!is_finite(A::widen(x[i]))) {
      atomicMin(first, static_cast<unsigned long long>(i));
      return;
    }
  }
}

// Purpose: out[i] = in[i] converted to To (cuda::cast).
// Algorithm: grid-stride loop; the value is widened to From's compute type and rounded once to
// To, to nearest even. One of the two types is float (cast's static_assert), so the conversion
// is a single rounding at most: never two.
// Preconditions: in and out hold n elements and do not overlap.
template <class From, class To>
__global__ void cast_kernel(const From* in, To* out, std::size_t n) {
  using A = Arithmetic<To>;
  for (std::size_t i = first_index(); i < n; i += grid_stride()) {
    out[i] = A::round(static_cast<typename A::Compute>(Arithmetic<From>::widen(in[i])));
  }
}

}  // namespace detail

template <class T>
void scale(T* x, std::size_t n, T alpha, cudaStream_t stream) {
  if (n == 0) return;
  detail::scale_kernel<<<detail::blocks_for(n), detail::kThreads, 0, stream>>>(x, n, alpha);
  device::cuda::check_launch("cohort::cuda::scale");
}

template <class T>
void axpy(T alpha, const T* x, T* y, std::size_t n, cudaStream_t stream) {
  if (n == 0) return;
  detail::axpy_kernel<<<detail::blocks_for(n), detail::kThreads, 0, stream>>>(alpha, x, y, n);
  device::cuda::check_launch("cohort::cuda::axpy");
}

template <class T>
void combine_into(ReduceOp op, T* inout, const T* in, std::size_t n, cudaStream_t stream) {
  if (n == 0) return;
  detail::combine_into_kernel<<<detail::blocks_for(n), detail::kThreads, 0, stream>>>(op, inout, in,
                                                                                      n);
  device::cuda::check_launch("cohort::cuda::combine_into");
}

template <class From, class To>
void cast(const From* in, To* out, std::size_t n, cudaStream_t stream) {
  static_assert(std::is_same_v<From, float> || std::is_same_v<To, float>,
                "cohort::cuda::cast converts to or from float (one rounding at most)");
  if (n == 0) return;
  detail::cast_kernel<<<detail::blocks_for(n), detail::kThreads, 0, stream>>>(in, out, n);
  device::cuda::check_launch("cohort::cuda::cast");
}

template <class T>
void flag_nonfinite(const T* x, std::size_t n, int* flag, cudaStream_t stream) {
  if (n == 0) return;
  detail::flag_nonfinite_kernel<<<detail::blocks_for(n), detail::kThreads, 0, stream>>>(x, n, flag);
  device::cuda::check_launch("cohort::cuda::flag_nonfinite");
}

template <class T>
void first_nonfinite(const T* x, std::size_t n, unsigned long long* first, cudaStream_t stream) {
  if (n == 0) return;
  detail::first_nonfinite_kernel<<<detail::blocks_for(n), detail::kThreads, 0, stream>>>(x, n,
                                                                                         first);
  device::cuda::check_launch("cohort::cuda::first_nonfinite");
}

}  // namespace cohort::cuda
