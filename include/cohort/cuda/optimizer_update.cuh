// update: the fused optimizer step, calling the optimizer's own per-element rule.
#pragma once

#if !defined(__CUDACC__)
#error \
    "cohort/cuda/*.cuh are CUDA sources: include them from a .cu file (host code: cuda/launch.hpp)"
#endif

#include "cohort/cuda/common.cuh"

namespace cohort::cuda {
namespace detail {

// The optimizer state of one parameter: its kRuleSlots<Rule> values (one unused when there are
// none, since an array cannot be empty).
template <class Rule, class P>
struct Slots {
  static constexpr int kCount = static_cast<int>(kRuleSlots<Rule>);
  P value[kCount > 0 ? kCount : 1];
};

// rule applied to one parameter, its gradient (already converted to P) and its state.
template <class Rule, class P>
__device__ inline void apply_rule(const Rule& rule, P& param, P gradient, Slots<Rule, P>& slots) {
  constexpr int kSlots = Slots<Rule, P>::kCount;
  if constexpr (kSlots == 0) {
    rule(param, gradient);
  } else if constexpr (kSlots == 1) {
    rule(param, gradient, slots.value[0]);
  } else {
    static_assert(kSlots == 2, "update_kernel knows rules with 0, 1 or 2 state slots");
    rule(param, gradient, slots.value[0], slots.value[1]);
  }
}

// Purpose: one optimizer step over n parameters (Sgd, Momentum, Adam, AdamW: whatever Rule is).
// Algorithm: grid-stride loop; per element, read the gradient once and convert it to P, load the
// parameter and its kRuleSlots<Rule> state values (slot-major: slot s of element i at
// state[s * n + i]), call rule, the same COHORT_HOST_DEVICE function the CPU step() calls, and
// store them back. Optionally marks a non-finite gradient in *nonfinite (a benign race).
// Preconditions: params and gradients hold n elements, state kRuleSlots<Rule> * n; no overlap.
template <class Rule, class P, class G>
__global__ void update_kernel(Rule rule, P* params, const G* gradients, P* state, std::size_t n,
                              int* nonfinite) {
  constexpr int kSlots = Slots<Rule, P>::kCount;
  bool bad = false;
  for (std::size_t i = first_index(); i < n; i += grid_stride()) {
    const P gradient = static_cast<P>(Arithmetic<G>::widen(gradients[i]));
    bad |= !is_finite(gradient);
    P param = params[i];
    Slots<Rule, P> slots;
#pragma unroll
    for (int s = 0; s < kSlots; ++s) slots.value[s] = state[s * n + i];
    apply_rule(rule, param, gradient, slots);
#pragma unroll
    for (int s = 0; s < kSlots; ++s) state[s * n + i] = slots.value[s];
    params[i] = param;
  }
  if (bad && nonfinite != nullptr) *nonfinite = 1;
}

// Parameters one thread of update_packed_kernel takes at a time: 16 bytes of P.
template <class P>
inline constexpr std::size_t kPack = 16 / sizeof(P);

// kPack<P> consecutive values, loaded and stored as one access of kPack<P> * sizeof(T) bytes.
template <class T, class P>
struct alignas(kPack<P> * sizeof(T)) Pack {
  T value[kPack<P>];
};

// Purpose: update_kernel's step, for arrays whose every row starts on a 16-byte boundary.
// Algorithm: as update_kernel, but each thread loads kPack<P> consecutive parameters (16 bytes),
// their gradients and each state slot's values with one vector access per array before the
// first use, so that several loads of every array are in flight; per element the same rule.
// Preconditions: n is a multiple of kPack<P>; params and each state slot are 16-byte aligned,
// gradients aligned to kPack<P> * sizeof(G); otherwise as update_kernel.
template <class Rule, class P, class G>
__global__ void update_packed_kernel(Rule rule, P* params, const G* gradients, P* state,
                                     std::size_t n, int* nonfinite) {
  constexpr int kSlots = Slots<Rule, P>::kCount;
  constexpr std::size_t kWidth = kPack<P>;
  using Params = Pack<P, P>;
  using Gradients = Pack<G, P>;
  bool bad = false;
  for (std::size_t j = first_index(); j < n / kWidth; j += grid_stride()) {
    Params param = reinterpret_cast<const Params*>(params)[j];
    const Gradients gradient = reinterpret_cast<const Gradients*>(gradients)[j];
    Params slot[kSlots > 0 ? kSlots : 1];
#pragma unroll
    for (int s = 0; s < kSlots; ++s) {
      slot[s] = reinterpret_cast<const Params*>(state + s * n)[j];
    }
#pragma unroll
    for (std::size_t k = 0; k < kWidth; ++k) {
      const P widened = static_cast<P>(Arithmetic<G>::widen(gradient.value[k]));
      bad |= !is_finite(widened);
      Slots<Rule, P> slots;
#pragma unroll
      for (int s = 0; s < kSlots; ++s) slots.value[s] = slot[s].value[k];
      apply_rule(rule, param.value[k], widened, slots);
#pragma unroll
      for (int s = 0; s < kSlots; ++s) slot[s].value[k] = slots.value[s];
    }
    reinterpret_cast<Params*>(params)[j] = param;
#pragma unroll
    for (int s = 0; s < kSlots; ++s) reinterpret_cast<Params*>(state + s * n)[j] = slot[s];
  }
  if (bad && nonfinite != nullptr) *nonfinite = 1;
}

inline bool aligned_to(const void* pointer, std::size_t bytes) {
  return reinterpret_cast<std::uintptr_t>(pointer) % bytes == 0;
}

}  // namespace detail

template <class Rule, class P, class G>
void update(const Rule& rule, P* params, const G* gradients, P* state, std::size_t n,
            int* nonfinite, cudaStream_t stream) {
  if (n == 0) return;
  constexpr std::size_t kWidth = detail::kPack<P>;
  const bool packed = n % kWidth == 0 && detail::aligned_to(params, 16) &&
                      detail::aligned_to(gradients, kWidth * sizeof(G)) &&
                      (kRuleSlots<Rule> == 0 || detail::aligned_to(state, 16));
  if (packed) {
    detail::update_packed_kernel<<<detail::blocks_for(n / kWidth), detail::kThreads, 0, stream>>>(
        rule, params, gradients, state, n, nonfinite);
  } else {
    detail::update_kernel<<<detail::blocks_for(n), detail::kThreads, 0, stream>>>(
        rule, params, gradients, state, n, nonfinite);
  }
  device::cuda::check_launch("cohort::cuda::update");
}

}  // namespace cohort::cuda
