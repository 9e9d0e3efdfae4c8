// update: the fused optimizer step, calling the optimizer's own per-element rule.
#pragma once

#if !defined(__CUDACC__)
#error \
    "cohort/cuda/*.cuh are CUDA sources: include them from a .cu file (host code: cuda/launch.hpp)"
#endif

#include "cohort/cuda/common.cuh"

namespace cohort::cuda {
namespace detail {

// Purpose: one optimizer step over n parameters (Sgd, Momentum, Adam, AdamW: whatever Rule is).
// Algorithm: grid-stride loop; per element, read the gradient once and convert it to P, load the
// parameter and its kRuleSlots<Rule> state values (slot-major: slot s of element i at
// state[s * n + i]), call rule, the same COHORT_HOST_DEVICE function the CPU step() calls, and
// store them back. Optionally marks a non-finite gradient in *nonfinite (a benign race).
// Preconditions: params and gradients hold n elements, state kRuleSlots<Rule> * n; no overlap.
template <class Rule, class P, class G>
__global__ void update_kernel(Rule rule, P* params, const G* gradients, P* state, std::size_t n,
                              int* nonfinite) {
  constexpr std::size_t kSlots = kRuleSlots<Rule>;
  bool bad = false;
  for (std::size_t i = first_index(); i < n; i += grid_stride()) {
    const P gradient = static_cast<P>(Arithmetic<G>::widen(gradients[i]));
    bad |= !is_finite(gradient);
    P param = params[i];
    if constexpr (kSlots == 0) {
      rule(param, gradient);
    } else if constexpr (kSlots == 1) {
      P slot0 = state[i];
      rule(param, gradient, slot0);
      state[i] = slot0;
    } else {
      static_assert(kSlots == 2, "update_kernel knows rules with 0, 1 or 2 state slots");
      P slot0 = state[i];
      P slot1 = state[n + i];
      rule(param, gradient, slot0, slot1);
      state[i] = slot0;
      state[n + i] = slot1;
    }
    params[i] = param;
  }
  if (bad && nonfinite != nullptr) *nonfinite = 1;
}

}  // namespace detail

template <class Rule, class P, class G>
void update(const Rule& rule, P* params, const G* gradients, P* state, std::size_t n,
            int* nonfinite, cudaStream_t stream) {
  if (n == 0) return;
  detail::update_kernel<<<detail::blocks_for(n), detail::kThreads, 0, stream>>>(
      rule, params, gradients, state, n, nonfinite);
  device::cuda::check_launch("cohort::cuda::update");
}

}  // namespace cohort::cuda
