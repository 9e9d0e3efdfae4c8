// The CUDA kernels as plain C++: what host code (.cpp, compiled by the host compiler) calls.
//
// Every function enqueues work on `stream` and returns; pointers are device pointers unless said
// otherwise; n is a number of elements; n = 0 enqueues nothing. Each launch is checked
// (DeviceError naming the kernel). The definitions are in the .cuh files beside this header,
// instantiated once per program by a .cu that includes cuda/instantiate.cuh (the Boost.Asio
// impl/src.hpp pattern), for T in {float, double, half, bfloat16} and, for the optimizer updates,
// (parameter, gradient) in {(float, float), (float, half), (float, bfloat16), (double, double)},
// and for cast, the pairs it names.
//
// Values: each function computes exactly what its device/cpu.hpp counterpart computes, in the
// same order, so the results are bit-identical when the CUDA code is built with -fmad=false
// (cohort::cuda adds it). half and bfloat16 arithmetic is done in float and rounded once to the
// type, which is the correctly rounded result (float has more than twice their precision + 2).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <span>

#include "cohort/core/reduce_op.hpp"
#include "cohort/optimizer/adam.hpp"
#include "cohort/optimizer/momentum.hpp"
#include "cohort/optimizer/optimizer.hpp"
#include "cohort/optimizer/sgd.hpp"

namespace cohort::cuda {

using half = __half;
using bfloat16 = __nv_bfloat16;

// x = alpha * x
template <class T>
void scale(T* x, std::size_t n, T alpha, cudaStream_t stream);

// y = alpha * x + y (a product rounded, then a sum rounded: never an FMA)
template <class T>
void axpy(T alpha, const T* x, T* y, std::size_t n, cudaStream_t stream);

// inout = inout (op) in, elementwise, as device::cpu::combine_into: one node of a fold of two
// buffers (the Trainer's gradient fold adds each micro-batch's gradient this way). inout and in
// hold n elements and do not overlap.
template <class T>
void combine_into(ReduceOp op, T* inout, const T* in, std::size_t n, cudaStream_t stream);

// The most buffers reduce_tree combines in one call (they travel as a kernel parameter).
inline constexpr std::size_t kMaxTreeInputs = 64;

// out[i] = the canonical-tree reduction (core/reduction_tree.hpp) of inputs[0][i] ..
// inputs[k-1][i], as device::cpu::reduce_tree. `inputs` is a host span of 1 .. kMaxTreeInputs
// device pointers (else ConfigError); out may alias no input.
template <class T>
void reduce_tree(ReduceOp op, std::span<const T* const> inputs, T* out, std::size_t n,
                 cudaStream_t stream);

// Elements per block of sum_of_squares: device::cpu::kNormBlock, part of the result's definition.
inline constexpr std::size_t kNormBlock = 4096;

// Doubles of device workspace sum_of_squares needs for n elements.
constexpr std::size_t sum_of_squares_workspace(std::size_t n) {
  const std::size_t blocks = (n + kNormBlock - 1) / kNormBlock;
  return blocks < 1 ? 2 : 2 * blocks;
}

// *result (device) = device::cpu::sum_of_squares(x): each kNormBlock block summed sequentially in
// double, blocks combined in the canonical tree. Bit-identical to the CPU. For float, half and
// bfloat16 the result is finite exactly when every element is (a square of one cannot overflow a
// double), so it doubles as the finite check of global-norm clipping.
template <class T>
void sum_of_squares(const T* x, std::size_t n, double* workspace, double* result,
                    cudaStream_t stream);

// out[i] = in[i] as To, rounded to nearest even where To is narrower (float to half or
// bfloat16, double to float), exact where it is wider: what a static_cast or the CUDA headers'
// host conversions (__float2half_rn, ...) give on the CPU. One of From and To is float (else a
// compile-time error): float <-> half, float <-> bfloat16, float <-> double. For a model's
// mixed-precision copies (bfloat16 weights for its forward pass, float gradients from bfloat16
// ones); in and out hold n elements and do not overlap.
template <class From, class To>
void cast(const From* in, To* out, std::size_t n, cudaStream_t stream);

// Sets *flag (device int) to 1 when an element of x is infinite or NaN; never clears it, so one
// flag can collect several buffers. Zero it first (cudaMemsetAsync).
template <class T>
void flag_nonfinite(const T* x, std::size_t n, int* flag, cudaStream_t stream);

// Sets *first (device) to the least i for which x[i] is infinite or NaN, as
// device::cpu::first_nonfinite; leaves it unchanged when every element is finite. Set it to all
// ones first (cudaMemsetAsync(first, 0xff, ...)): then a value >= n means "none".
template <class T>
void first_nonfinite(const T* x, std::size_t n, unsigned long long* first, cudaStream_t stream);

// Values of optimizer state per parameter that each rule reads and writes (the optimizer's
// kStateSlots), slot-major as optimizer/optimizer.hpp lays it out.
template <class Rule>
inline constexpr std::size_t kRuleSlots = 0;
template <class T>
inline constexpr std::size_t kRuleSlots<optimizer::MomentumRule<T>> = 1;
template <class T, optimizer::WeightDecay D>
inline constexpr std::size_t kRuleSlots<optimizer::AdamRule<T, D>> = 2;

// One fused optimizer step: for each i, the gradient is read once, converted to P and handed with
// params[i] and its state to rule, the optimizer's own COHORT_HOST_DEVICE per-element rule (the
// one its CPU step() calls), so GPU bits equal CPU bits. state holds kRuleSlots<Rule> * n values.
// When nonfinite is not null, *nonfinite is set to 1 if a gradient is infinite or NaN (never
// cleared; the update is applied regardless, as on the CPU).
template <class Rule, class P, class G>
void update(const Rule& rule, P* params, const G* gradients, P* state, std::size_t n,
            int* nonfinite, cudaStream_t stream);

// o.step(...) on the device: the rule is built on the host by o.rule<P>(context), exactly as the
// CPU step builds it.
template <optimizer::Optimizer O, class P, class G>
void step(const O& o, P* params, const G* gradients, P* state, std::size_t n,
          optimizer::StepContext context, cudaStream_t stream, int* nonfinite = nullptr) {
  update(o.template rule<P>(context), params, gradients, state, n, nonfinite, stream);
}

}  // namespace cohort::cuda
