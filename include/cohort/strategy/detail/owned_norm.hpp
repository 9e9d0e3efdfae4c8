// The gradient's sum of squares in the sharded update over TCP (owned_update.hpp), where each
// process holds the reduced sums of the elements it owns only: the bits of device::cpu::
// sum_of_squares over the whole gradient, so that clipping scales alike on every path.
//
// sum_of_squares sums each kNormBlock block of the gradient in order, then the blocks in the
// canonical tree. A block that one process owns whole, it sums alone. A block whose elements
// several processes own (an owner's run ends inside it) is summed in turns: the owner of its first
// piece sums that piece from 0, and the owner of each next piece goes on from the sum so far
// (device::cpu::add_squares), which are the bits of one pass over the block. Each turn is an
// all-reduce of one double per block, to which only the owner of that block's piece in this turn
// adds anything other than 0: a sum of one value and zeros is that value, exactly. Blocks of runs
// of at least kNormBlock elements take two turns; every process then holds every block's sum and
// combines them in the tree.
#pragma once

#include <algorithm>
#include <cstddef>
#include <span>
#include <utility>
#include <vector>

#include "cohort/collective/collective.hpp"
#include "cohort/core/reduce_op.hpp"
#include "cohort/device/cpu.hpp"

namespace cohort::strategy::detail {

// `buckets`: the [first, last) ranges the gradient was reduced to its owners in, each as one call
// (ownership depends on a call's length). A collective over the communicator's processes.
template <class T, class Communicator>
requires collective::ReducesToOwners<Communicator, T>
double owned_sum_of_squares(Communicator& communicator, std::span<const T> gradient,
                            std::span<const std::pair<std::size_t, std::size_t>> buckets) {
  struct Run {  // elements [begin, end), which `owner` holds
    std::size_t begin;
    std::size_t end;
    int owner;
  };
  std::vector<Run> runs;
  for (const auto& [first, last] : buckets) {
    communicator.template for_each_owner<T>(
        last - first, [&](std::size_t begin, std::size_t count, int owner) {
          runs.push_back({first + begin, first + begin + count, owner});
        });
  }
  std::ranges::sort(runs, {}, &Run::begin);
  constexpr std::size_t kBlock = device::cpu::kNormBlock;
  const std::size_t blocks = (gradient.size() + kBlock - 1) / kBlock;
  // The runs cut at the blocks' edges, in order: block b's pieces are pieces[start[b]] up to
  // pieces[start[b + 1]].
  std::vector<Run> pieces;
  std::vector<std::size_t> start(blocks + 1, 0);
  for (const Run& run : runs) {
    for (std::size_t begin = run.begin; begin < run.end;) {
      const std::size_t end = std::min(run.end, (begin / kBlock + 1) * kBlock);
      pieces.push_back({begin, end, run.owner});
      ++start[begin / kBlock + 1];
      begin = end;
    }
  }
  std::size_t turns = 0;
  for (std::size_t block = 0; block < blocks; ++block) {
    turns = std::max(turns, start[block + 1]);
    start[block + 1] += start[block];
  }
  const int me = communicator.rank();
  std::vector<double> sums(blocks, 0.0);
  std::vector<double> turn(blocks);
  for (std::size_t k = 0; k < turns; ++k) {
    for (std::size_t block = 0; block < blocks; ++block) {
      const std::size_t at = start[block] + k;
      const bool mine = at < start[block + 1] && pieces[at].owner == me;
      turn[block] = mine ? device::cpu::add_squares(
                               sums[block], gradient.subspan(pieces[at].begin,
                                                             pieces[at].end - pieces[at].begin))
                         : 0.0;
    }
    communicator.all_reduce(std::span<double>(turn), ReduceOp::kSum);
    for (std::size_t block = 0; block < blocks; ++block) {
      if (start[block] + k < start[block + 1]) sums[block] = turn[block];
    }
  }
  return device::cpu::combine_block_sums(blocks, [&](std::size_t block) { return sums[block]; });
}

}  // namespace cohort::strategy::detail
