// Exactness checks for any communicator, shared by the thread tests and the process tests: inputs
// are small integers, so every sum is exact in any order and results are compared with ==.
// Each check throws std::runtime_error naming what was wrong.
#pragma once

#include <algorithm>
#include <cmath>
#include <cohort/core/narrow_float.hpp>
#include <cohort/core/reduce_op.hpp>
#include <cohort/core/reduction_tree.hpp>
#include <cohort/device/cpu.hpp>
#include <cstddef>
#include <random>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

namespace cohort::testing {

template <class E>
E small_integer(int rank, std::size_t index) {
  return static_cast<E>(static_cast<int>((index * 7 + static_cast<std::size_t>(rank) * 13) % 29) -
                        14);
}

template <class E, class Communicator>
void check_collectives(Communicator& c, std::size_t length) {
  const int ranks = c.size();
  const auto fail = [&](const std::string& what) {
    throw std::runtime_error("rank " + std::to_string(c.rank()) + ", length " +
                             std::to_string(length) + ": " + what);
  };

  std::vector<E> buffer(length);
  for (std::size_t i = 0; i < length; ++i) buffer[i] = small_integer<E>(c.rank(), i);
  c.all_reduce(std::span<E>(buffer), ReduceOp::kSum);
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < length; ++i) {
    E expected = 0;
    for (int r = 0; r < ranks; ++r) expected += small_integer<E>(r, i);
    wrong += buffer[i] != expected;
  }
  if (wrong != 0) fail("all_reduce has " + std::to_string(wrong) + " wrong sums");

  std::vector<E> input_kept(length);
  for (std::size_t i = 0; i < length; ++i) input_kept[i] = small_integer<E>(c.rank(), i);
  std::vector<E> reduced(length, static_cast<E>(99));
  c.all_reduce(std::span<const E>(input_kept), std::span<E>(reduced), ReduceOp::kSum);
  if (reduced != buffer) fail("the out-of-place all_reduce differs from the in-place one");
  for (std::size_t i = 0; i < length; ++i) {
    if (input_kept[i] != small_integer<E>(c.rank(), i)) {
      fail("the out-of-place all_reduce changed its input at " + std::to_string(i));
    }
  }

  const std::size_t per_rank = length / static_cast<std::size_t>(ranks) + 1;
  std::vector<E> input(per_rank * static_cast<std::size_t>(ranks));
  for (std::size_t i = 0; i < input.size(); ++i) input[i] = small_integer<E>(c.rank(), i);
  std::vector<E> output(per_rank);
  c.reduce_scatter(std::span<const E>(input), std::span<E>(output), ReduceOp::kSum);
  for (std::size_t i = 0; i < per_rank; ++i) {
    E expected = 0;
    const std::size_t index = static_cast<std::size_t>(c.rank()) * per_rank + i;
    for (int r = 0; r < ranks; ++r) expected += small_integer<E>(r, index);
    if (output[i] != expected) fail("reduce_scatter is wrong at " + std::to_string(i));
  }

  std::vector<E> gathered(length * static_cast<std::size_t>(ranks));
  const std::vector<E> mine(length, static_cast<E>(c.rank() + 1));
  c.all_gather(std::span<const E>(mine), std::span<E>(gathered));
  for (std::size_t i = 0; i < gathered.size(); ++i) {
    if (gathered[i] != static_cast<E>(i / std::max<std::size_t>(length, 1) + 1)) {
      fail("all_gather is wrong at " + std::to_string(i));
    }
  }

  std::vector<E> broadcast(length, static_cast<E>(c.rank()));
  c.broadcast(std::span<E>(broadcast), ranks - 1);
  if (std::any_of(broadcast.begin(), broadcast.end(),
                  [&](E value) { return value != static_cast<E>(ranks - 1); })) {
    fail("broadcast is wrong");
  }
  c.barrier();
}

// Buffers whose sums cancel (1e8 + 3 - 1e8 ...), so that any order of additions other than the
// canonical tree changes bits: rank r's buffer is the r-th.
inline std::vector<std::vector<float>> cancelling_inputs(int ranks, std::size_t length,
                                                         unsigned seed) {
  const float values[] = {1e8f, 3.0f, -1e8f, 3.0f, 0.5f, 7e7f, -2.0f, 1.25f, -7e7f};
  std::vector<std::vector<float>> inputs(static_cast<std::size_t>(ranks),
                                         std::vector<float>(length));
  std::mt19937 engine(seed);
  for (auto& input : inputs) {
    for (float& value : input) value = values[engine() % 9];
  }
  return inputs;
}

// Their elementwise sum in the canonical tree over ranks (core/reduction_tree.hpp).
inline std::vector<float> canonical_sum(const std::vector<std::vector<float>>& inputs) {
  std::vector<const float*> pointers;
  for (const auto& input : inputs) pointers.push_back(input.data());
  std::vector<float> sum(inputs.front().size());
  device::cpu::reduce_tree<float>(ReduceOp::kSum, pointers, sum);
  return sum;
}

// Values of every magnitude and sign, each a value of the format whose tree `op` is
// (kSumBfloat16, kSumFloat16: core/reduce_op.hpp), so that sums of them round at every node of that
// tree; within float16's range, up to 8 leaves summed.
inline std::vector<std::vector<float>> narrow_inputs(ReduceOp op, int ranks, std::size_t length,
                                                     unsigned seed) {
  std::mt19937 engine(seed);
  std::uniform_real_distribution<float> mantissa(-1.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(-12, 12);
  std::vector<std::vector<float>> inputs(static_cast<std::size_t>(ranks),
                                         std::vector<float>(length));
  for (auto& input : inputs) {
    for (float& value : input) {
      value = combine(op, std::ldexp(mantissa(engine), exponent(engine)), 0.0f);
    }
  }
  return inputs;
}

// Their elementwise sum in the canonical tree whose every node is rounded as `op` rounds
// (kSumBfloat16, kSumFloat16), computed one element at a time by tree::fold: a reference that
// shares no code with the communicators' blocked folds.
inline std::vector<float> narrow_tree_sum(ReduceOp op,
                                          const std::vector<std::vector<float>>& inputs) {
  std::vector<float> sum(inputs.front().size());
  for (std::size_t i = 0; i < sum.size(); ++i) {
    sum[i] = tree::fold(
        inputs.size(), [&](std::size_t leaf) { return inputs[leaf][i]; },
        [op](float a, float b) { return combine(op, a, b); });
  }
  return sum;
}

// Each rank's input where `leaves` are dealt to ranks by `counts` (tree::deal): its node of the
// tree, sum(its leaves), as a replica folds them (sum: canonical_sum, or narrow_tree_sum's).
template <class Sum>
std::vector<std::vector<float>> dealt_nodes(const std::vector<std::vector<float>>& leaves,
                                            const std::vector<std::size_t>& counts, Sum sum) {
  std::vector<std::vector<float>> nodes;
  for (std::size_t rank = 0, first = 0; rank < counts.size(); first += counts[rank++]) {
    nodes.push_back(sum(std::vector<std::vector<float>>(
        leaves.begin() + static_cast<std::ptrdiff_t>(first),
        leaves.begin() + static_cast<std::ptrdiff_t>(first + counts[rank]))));
  }
  return nodes;
}

}  // namespace cohort::testing
