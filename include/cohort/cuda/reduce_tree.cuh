// reduce_tree: several gradient buffers combined element by element in the canonical tree.
#pragma once

#if !defined(__CUDACC__)
#error \
    "cohort/cuda/*.cuh are CUDA sources: include them from a .cu file (host code: cuda/launch.hpp)"
#endif

#include <string>

#include "cohort/core/error.hpp"
#include "cohort/cuda/common.cuh"

namespace cohort::cuda {
namespace detail {

template <class T>
struct TreeInputs {
  const T* data[kMaxTreeInputs];
  unsigned count;
};

// Purpose: out[i] = the canonical-tree reduction of inputs.data[0][i] .. inputs.data[k-1][i]
// (device::cpu::reduce_tree, core/reduction_tree.hpp).
// Algorithm: one element per thread (grid-stride). The tree is computed as tree::StreamingFold
// does: leaves pushed in index order onto a stack of partial results, the top two merged while
// they cover equally many leaves, then the right spine merged from the top. Every node is
// left (+) right, rounded to T, exactly as on the CPU. The stack holds at most
// bit_width(kMaxTreeInputs) + 1 entries.
// Preconditions: 1 <= k <= kMaxTreeInputs; every input and out hold n elements; out aliases none.
template <class T>
__global__ void reduce_tree_kernel(ReduceOp op, TreeInputs<T> inputs, T* out, std::size_t n) {
  using A = Arithmetic<T>;
  using C = typename A::Compute;
  constexpr int kDepth = 8;  // bit_width(64) + 1
  static_assert(kMaxTreeInputs <= 64, "reduce_tree_kernel's stack holds a tree of 64 leaves");
  for (std::size_t i = first_index(); i < n; i += grid_stride()) {
    T value[kDepth];
    unsigned leaves[kDepth];
    int depth = 0;
    for (unsigned leaf = 0; leaf < inputs.count; ++leaf) {
      value[depth] = inputs.data[leaf][i];
      leaves[depth] = 1;
      ++depth;
      while (depth >= 2 && leaves[depth - 1] == leaves[depth - 2]) {
        value[depth - 2] =
            A::round(combine_pair<C>(op, A::widen(value[depth - 2]), A::widen(value[depth - 1])));
        leaves[depth - 2] += leaves[depth - 1];
        --depth;
      }
    }
    while (depth >= 2) {
      value[depth - 2] =
          A::round(combine_pair<C>(op, A::widen(value[depth - 2]), A::widen(value[depth - 1])));
      --depth;
    }
    out[i] = value[0];
  }
}

}  // namespace detail

template <class T>
void reduce_tree(ReduceOp op, std::span<const T* const> inputs, T* out, std::size_t n,
                 cudaStream_t stream) {
  if (inputs.empty() || inputs.size() > kMaxTreeInputs) {
    throw ConfigError("inputs = " + std::to_string(inputs.size()) +
                      " buffers: cohort::cuda::reduce_tree takes 1 to " +
                      std::to_string(kMaxTreeInputs));
  }
  if (n == 0) return;
  detail::TreeInputs<T> packed{};
  for (std::size_t k = 0; k < inputs.size(); ++k) packed.data[k] = inputs[k];
  packed.count = static_cast<unsigned>(inputs.size());
  detail::reduce_tree_kernel<<<detail::blocks_for(n), detail::kThreads, 0, stream>>>(op, packed,
                                                                                     out, n);
  device::cuda::check_launch("cohort::cuda::reduce_tree");
}

}  // namespace cohort::cuda
