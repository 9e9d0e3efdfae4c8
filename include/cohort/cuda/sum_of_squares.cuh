// sum_of_squares: the global-norm reduction of gradient clipping, in the CPU's order.
#pragma once

#if !defined(__CUDACC__)
#error \
    "cohort/cuda/*.cuh are CUDA sources: include them from a .cu file (host code: cuda/launch.hpp)"
#endif

#include "cohort/cuda/common.cuh"

namespace cohort::cuda {
namespace detail {

// The block sums' layout: a warp owns kNormLanes consecutive norm blocks, lane l the sum of the
// l-th; each round stages kNormTile elements of every one of them. A CTA is kNormWarps warps.
inline constexpr unsigned kNormLanes = 32;
inline constexpr unsigned kNormTile = 32;
inline constexpr unsigned kNormWarps = 4;
static_assert(kNormBlock % kNormTile == 0, "a round reads within its norm blocks");

// Purpose: partial[b] = sum of x[i]^2 over norm block b (kNormBlock elements), in double.
// Algorithm: the CPU's order (device::cpu::block_sum_of_squares): each block summed sequentially
// from its first element, one thread per block, the square and the sum separate roundings
// (-fmad=false); only the loads are the warp's. Each round, the warp reads the next kNormTile
// elements of each of its kNormLanes blocks in turn, one element per lane (32 consecutive
// elements: one coalesced access), squares them in double into a shared tile (row = block), and
// then every lane adds its own row in index order. So the sum of a block is the same additions of
// the same squares in the same order as on the CPU, and the blocks go to the tree unchanged.
// Elements past n are never added.
// Preconditions: partial holds ceil(n / kNormBlock) doubles; blockDim.x == kNormWarps * 32.
template <class T>
__global__ void block_squares_kernel(const T* x, std::size_t n, double* partial) {
  using A = Arithmetic<T>;
  // One tile per warp; a row is padded by one double, so that the lanes reading their own rows
  // (addresses kNormTile + 1 doubles apart) fall in different banks.
  __shared__ double tiles[kNormWarps][kNormLanes][kNormTile + 1];
  const unsigned warp = threadIdx.x / kNormLanes;
  const unsigned lane = threadIdx.x % kNormLanes;
  double(*const tile)[kNormTile + 1] = tiles[warp];
  const std::size_t blocks = (n + kNormBlock - 1) / kNormBlock;
  const std::size_t groups = (blocks + kNormLanes - 1) / kNormLanes;
  const std::size_t warps = static_cast<std::size_t>(gridDim.x) * kNormWarps;
  // Warp-uniform loops: every lane of the warp takes each __syncwarp.
  for (std::size_t group = static_cast<std::size_t>(blockIdx.x) * kNormWarps + warp; group < groups;
       group += warps) {
    const std::size_t first_block = group * kNormLanes;
    const std::size_t block = first_block + lane;  // the one this lane sums
    const std::size_t begin = block * kNormBlock;
    const std::size_t end = begin + kNormBlock < n ? begin + kNormBlock : n;  // if block < blocks
    double sum = 0.0;
    for (std::size_t offset = 0; offset < kNormBlock; offset += kNormTile) {
      for (unsigned row = 0; row < kNormLanes; ++row) {
        const std::size_t i = (first_block + row) * kNormBlock + offset + lane;
        double square = 0.0;
        if (i < n) {
          const double value = static_cast<double>(A::widen(x[i]));
          square = value * value;
        }
        tile[row][lane] = square;
      }
      __syncwarp();
      if (block < blocks && begin + offset < end) {
        const std::size_t left = end - (begin + offset);
        const unsigned count = left < kNormTile ? static_cast<unsigned>(left) : kNormTile;
        for (unsigned k = 0; k < count; ++k) sum = sum + tile[lane][k];
      }
      __syncwarp();  // the tile is read before the next round overwrites it
    }
    if (block < blocks) partial[block] = sum;
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
    // A warp per kNormLanes blocks, a grid-stride loop beyond the cap.
    const std::size_t warps = (blocks + detail::kNormLanes - 1) / detail::kNormLanes;
    const std::size_t ctas = (warps + detail::kNormWarps - 1) / detail::kNormWarps;
    const auto grid = static_cast<unsigned>(ctas < (std::size_t{1} << 16) ? ctas : (1u << 16));
    detail::block_squares_kernel<<<grid, detail::kNormWarps * detail::kNormLanes, 0, stream>>>(
        x, n, workspace);
    device::cuda::check_launch("cohort::cuda::sum_of_squares (blocks)");
  }
  detail::tree_sum_kernel<<<1, detail::kTreeThreads, 0, stream>>>(workspace, blocks, result);
  device::cuda::check_launch("cohort::cuda::sum_of_squares (tree)");
}

}  // namespace cohort::cuda
