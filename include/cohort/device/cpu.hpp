// Per-device math on the host: the reference implementation, and device::Cpu.
//
// Every function here is elementwise or reduces in the canonical tree order
// (core/reduction_tree.hpp), so its result does not depend on how the work is split. Loops are
// plain so that the compiler may vectorize them; it never reorders a floating-point reduction
// without -ffast-math, which cohort must not be built with.
//
// device::Cpu (at the end) is the device of host replicas (device/device.hpp says what a device
// provides): its place is nothing, its buffers are host vectors, and its functions are the loops
// below and the optimizer's own step().
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <span>
#include <string_view>
#include <type_traits>
#include <vector>

#include "cohort/core/error.hpp"
#include "cohort/core/reduce_op.hpp"
#include "cohort/core/reduction_tree.hpp"
#include "cohort/device/device.hpp"
#include "cohort/optimizer/optimizer.hpp"

namespace cohort::device {

namespace cpu {

// Elements per block of a blocked reduction: small enough that a block of every input stays in L1.
inline constexpr std::size_t kReduceBlock = 1024;

// Elements per leaf of sum_of_squares: part of the result's definition, so never tuned.
inline constexpr std::size_t kNormBlock = 4096;

template <class T>
void scale(std::span<T> x, T alpha) {
  for (T& value : x) value *= alpha;
}

// y = alpha * x + y
template <class T>
void axpy(T alpha, std::span<const T> x, std::span<T> y) {
  COHORT_ASSERT(x.size() == y.size());
  for (std::size_t i = 0; i < x.size(); ++i) y[i] = alpha * x[i] + y[i];
}

namespace detail {

// A sum whose nodes are rounded to Narrow (Bfloat16, Float16): floats added and rounded, or the
// packed values added (their own addition rounds); whether T is either.
template <class Narrow, class T>
bool sum_rounded(const T* left, const T* right, T* out, std::size_t count) {
  if constexpr (std::is_same_v<T, float>) {
    for (std::size_t i = 0; i < count; ++i) out[i] = Narrow::round(left[i] + right[i]).widen();
    return true;
  } else if constexpr (std::is_same_v<T, Narrow>) {
    for (std::size_t i = 0; i < count; ++i) out[i] = left[i] + right[i];
    return true;
  }
  return false;
}

template <class T>
void combine_block(ReduceOp op, const T* left, const T* right, T* out, std::size_t count) {
  switch (op) {
    case ReduceOp::kSum:
      for (std::size_t i = 0; i < count; ++i) out[i] = left[i] + right[i];
      return;
    case ReduceOp::kSumBfloat16:
      if (sum_rounded<Bfloat16>(left, right, out, count)) return;
      break;
    case ReduceOp::kSumFloat16:
      if (sum_rounded<Float16>(left, right, out, count)) return;
      break;
    default:
      break;
  }
  for (std::size_t i = 0; i < count; ++i) out[i] = combine(op, left[i], right[i]);
}

}  // namespace detail

// out = left (op) right, elementwise; out may be either operand.
template <class T>
void combine_into(ReduceOp op, std::span<const T> left, std::span<const T> right,
                  std::span<T> out) {
  COHORT_ASSERT(left.size() == out.size() && right.size() == out.size());
  detail::combine_block(op, left.data(), right.data(), out.data(), out.size());
}

// `values` made leaves of a tree that `op` reduces: under kSumBfloat16 (kSumFloat16;
// core/reduce_op.hpp) each is rounded to bfloat16 (float16); every other op takes them as they are.
template <class T>
void round_to_leaves(ReduceOp op, std::span<T> values) {
  if constexpr (std::is_same_v<T, float>) {
    if (op == ReduceOp::kSumBfloat16) {
      for (float& value : values) value = round_to_bfloat16(value);
    } else if (op == ReduceOp::kSumFloat16) {
      for (float& value : values) value = round_to_float16(value);
    }
  }
}

// inout = inout (op) in, elementwise.
template <class T>
void combine_into(ReduceOp op, std::span<T> inout, std::span<const T> in) {
  combine_into<T>(op, inout, in, inout);
}

namespace detail {

// Computes the node of `leaves` leaves whose first is input `next`'s (which it advances past the
// node's inputs), for elements [offset, offset + count). Input i stands for leaf_counts[i] leaves
// (one where leaf_counts is empty): a node that is one input is returned as a pointer into it,
// without a copy. An inner node writes into dst; its left child may use dst too (finished before
// the right child starts), its right child uses the next scratch block, so the scratch is one block
// per tree level.
template <class T>
const T* reduce_node(ReduceOp op, std::span<const T* const> inputs,
                     std::span<const std::size_t> leaf_counts, std::size_t& next,
                     std::size_t leaves, std::size_t offset, std::size_t count, T* dst,
                     T* scratch) {
  if ((leaf_counts.empty() ? 1 : leaf_counts[next]) == leaves) return inputs[next++] + offset;
  const std::size_t left_leaves = tree::split(leaves);
  const T* left =
      reduce_node(op, inputs, leaf_counts, next, left_leaves, offset, count, dst, scratch);
  const T* right = reduce_node(op, inputs, leaf_counts, next, leaves - left_leaves, offset, count,
                               scratch, scratch + kReduceBlock);
  combine_block(op, left, right, dst, count);
  return dst;
}

}  // namespace detail

// out[i] = the canonical-tree reduction of inputs[0][i], ..., inputs[n-1][i]. out may alias no
// input. Works block by block so every input is read once and out written once.
//
// With `leaf_counts`, input i is the fold of leaf_counts[i] leaves, a node of the canonical tree
// over all of them (tree::are_nodes), and out is that tree's root: tree::fold_parts, element by
// element.
template <class T>
void reduce_tree(ReduceOp op, std::span<const T* const> inputs, std::span<T> out,
                 std::span<const std::size_t> leaf_counts = {}) {
  COHORT_ASSERT(!inputs.empty());
  COHORT_ASSERT(leaf_counts.empty() || leaf_counts.size() == inputs.size());
  if (inputs.size() == 1) {
    std::copy_n(inputs[0], out.size(), out.data());
    return;
  }
  const std::size_t total =
      leaf_counts.empty() ? inputs.size()
                          : std::accumulate(leaf_counts.begin(), leaf_counts.end(), std::size_t{0});
  thread_local std::vector<T> scratch;
  const std::size_t levels = std::bit_width(total);
  if (scratch.size() < levels * kReduceBlock) scratch.resize(levels * kReduceBlock);
  for (std::size_t offset = 0; offset < out.size(); offset += kReduceBlock) {
    const std::size_t count = std::min(kReduceBlock, out.size() - offset);
    std::size_t next = 0;
    const T* root = detail::reduce_node(op, inputs, leaf_counts, next, total, offset, count,
                                        out.data() + offset, scratch.data());
    COHORT_ASSERT(root == out.data() + offset && next == inputs.size());
  }
}

// `start` plus the squares of x, added in order in double: a norm block's sum from 0, or, from the
// sum of its first elements, the rest of it, with the same bits as the whole block's (a block whose
// elements several processes own: strategy/detail/owned_norm.hpp).
template <class T>
double add_squares(double start, std::span<const T> x) {
  double sum = start;
  for (const T element : x) {
    const double value = static_cast<double>(element);
    sum += value * value;
  }
  return sum;
}

// The sum of squares of block `block` (elements [block x kNormBlock, (block + 1) x kNormBlock)
// of x), summed sequentially in double: the leaf of sum_of_squares.
template <class T>
double block_sum_of_squares(std::span<const T> x, std::size_t block) {
  const std::size_t begin = block * kNormBlock;
  return add_squares(0.0, x.subspan(begin, std::min(x.size(), begin + kNormBlock) - begin));
}

// The canonical-tree sum of the block sums of x, given as `blocks(i)` for i < count: how
// sum_of_squares combines its leaves, and how block sums computed in several places (the shards
// of a parameter server) combine into the same result.
template <class Blocks>
double combine_block_sums(std::size_t count, Blocks&& blocks) {
  if (count == 0) return 0.0;
  return tree::fold(count, blocks, [](double a, double b) { return a + b; });
}

// Sum of x[i]^2 in double: each kNormBlock block sequentially, blocks in the canonical tree, so the
// result is the same wherever it is computed and partial results of aligned block ranges compose.
template <class T>
double sum_of_squares(std::span<const T> x) {
  return combine_block_sums((x.size() + kNormBlock - 1) / kNormBlock,
                            [&](std::size_t block) { return block_sum_of_squares(x, block); });
}

template <class T>
bool all_finite(std::span<const T> x) {
  return std::all_of(x.begin(), x.end(), [](T value) { return std::isfinite(value); });
}

// An unsigned integer as wide as T whose top bit is set exactly when value is an infinity or NaN:
// the exponent bits plus one in their lowest place carry into the top bit only when they are all
// ones. OR-ed over a loop it is a test that compilers vectorize beside the loop's arithmetic, in
// lanes as wide as T's (a bool reduction, or std::isfinite, kept GCC 12's loops scalar).
template <class T>
inline auto nonfinite_mark(T value) {
  if constexpr (std::is_same_v<T, float>) {
    return (std::bit_cast<std::uint32_t>(value) & 0x7f80'0000u) + 0x0080'0000u;
  } else if constexpr (std::is_same_v<T, double>) {
    return (std::bit_cast<std::uint64_t>(value) & 0x7ff0'0000'0000'0000u) +
           0x0010'0000'0000'0000u;
  } else {
    return std::isfinite(static_cast<double>(value)) ? std::uint32_t{0} : std::uint32_t{1} << 31;
  }
}

// The bit of nonfinite_mark<T> that says "infinity or NaN".
template <class T>
inline constexpr auto kNonfiniteBit = decltype(nonfinite_mark(T{})){1}
                                      << (8 * sizeof(decltype(nonfinite_mark(T{}))) - 1);

template <class T>
inline bool non_finite(T value) {
  return (nonfinite_mark(value) & kNonfiniteBit<T>) != 0;
}

// The index of the first infinity or NaN in x, or x.size() when every element is finite. Reads x
// block by block (one vectorized test per block) and looks into a block only when it holds one.
template <class T>
std::size_t first_nonfinite(std::span<const T> x) {
  for (std::size_t begin = 0; begin < x.size(); begin += kReduceBlock) {
    const std::size_t end = std::min(x.size(), begin + kReduceBlock);
    decltype(nonfinite_mark(T{})) marks = 0;
    for (std::size_t i = begin; i < end; ++i) marks |= nonfinite_mark(x[i]);
    if ((marks & kNonfiniteBit<T>) == 0) continue;
    for (std::size_t i = begin; i < end; ++i) {
      if (non_finite(x[i])) return i;
    }
  }
  return x.size();
}

// Whether device::cpu can apply o's update itself, element by element: o has a per-element rule
// (o.rule<T>(context), the rule its step() calls) and at most 2 slots of state.
template <class O, class T>
concept HasElementRule = O::kStateSlots <= 2 && requires(const O& o, optimizer::StepContext c) {
  o.template rule<T>(c);
};

// o's rule over n elements, the parameters read from `in` and written to `out` (the same array, or
// another of n), the state slots s0 and s1 that o has in place; the OR of the gradients'
// non-finite marks. One loop serves the update in place (step_part) and into another buffer
// (step_into): a compiler that cannot prove `in` and `out` apart checks them at run time, and
// equal arrays pass that check, since each element is read before it is written.
template <class O, class T>
requires HasElementRule<O, T>
auto apply_rule(const O& o, optimizer::StepContext context, const T* in, T* out, const T* g, T* s0,
                T* s1, std::size_t n) {
  const auto rule = o.template rule<T>(context);
  decltype(nonfinite_mark(T{})) marks = 0;
  for (std::size_t i = 0; i < n; ++i) {
    marks |= nonfinite_mark(g[i]);
    T value = in[i];
    if constexpr (O::kStateSlots == 0) {
      rule(value, g[i]);
    } else if constexpr (O::kStateSlots == 1) {
      rule(value, g[i], s0[i]);
    } else {
      rule(value, g[i], s0[i], s1[i]);
    }
    out[i] = value;
  }
  return marks;
}

// o's update of a part of the parameters, elements [first, first + parameters.size()) of the
// whole whose state, `state`, is slot-major as optimizer/optimizer.hpp lays it out (kStateSlots x
// the whole's size), and whether every gradient of the part was finite, tested in the update's own
// loop (the gradient is read once). The update is applied either way, with the bits of o.step on
// the whole: every update is elementwise.
template <class O, class T>
requires HasElementRule<O, T>
bool step_part(const O& o, std::span<T> parameters, std::span<const T> gradients,
               std::span<T> state, std::size_t first, optimizer::StepContext context) {
  COHORT_ASSERT(gradients.size() == parameters.size());
  const std::size_t whole = O::kStateSlots == 0 ? 0 : state.size() / O::kStateSlots;
  COHORT_ASSERT(O::kStateSlots == 0 || first + parameters.size() <= whole);
  T* const s0 = O::kStateSlots >= 1 ? state.data() + first : nullptr;
  T* const s1 = O::kStateSlots == 2 ? state.data() + whole + first : nullptr;
  const auto marks = apply_rule(o, context, parameters.data(), parameters.data(), gradients.data(),
                                s0, s1, parameters.size());
  return (marks & kNonfiniteBit<T>) == 0;
}

// o.step on the parameters `before`, written to `after` (the same size, another buffer), the state
// in place: the bits of o.step, for a caller that keeps the parameters from before the update
// (a synchronous parameter server whose job regroups) without a pass to copy them.
template <class O, class T>
void step_into(const O& o, std::span<const T> before, std::span<T> after,
               std::span<const T> gradients, std::span<T> state, optimizer::StepContext context) {
  COHORT_ASSERT(after.size() == before.size() && gradients.size() == before.size());
  if constexpr (HasElementRule<O, T>) {
    const std::size_t n = before.size();
    COHORT_ASSERT(state.size() == O::kStateSlots * n);
    apply_rule(o, context, before.data(), after.data(), gradients.data(),
               O::kStateSlots >= 1 ? state.data() : nullptr,
               O::kStateSlots == 2 ? state.data() + n : nullptr, n);
  } else {
    std::copy(before.begin(), before.end(), after.begin());
    o.step(after, gradients, state, context);
  }
}

// o.step(parameters, gradients, state, context), and whether every gradient was finite: step_part
// on the whole where device::cpu can apply the update itself; an optimizer without rule<T> gets
// its own step() and then a pass of first_nonfinite.
template <class O, class T>
bool step_finite(const O& o, std::span<T> parameters, std::span<const T> gradients,
                 std::span<T> state, optimizer::StepContext context) {
  if constexpr (HasElementRule<O, T>) {
    COHORT_ASSERT(state.size() == O::kStateSlots * parameters.size());
    return step_part(o, parameters, gradients, state, 0, context);
  } else {
    o.step(parameters, gradients, state, context);
    return first_nonfinite(gradients) == gradients.size();
  }
}

// A host replica's place: the host has one memory and runs each call to completion.
struct Place {};

// n values of T in host memory, zero-initialized.
template <class T>
class Buffer {
 public:
  Buffer() = default;
  Buffer(std::size_t n, Place /*place*/) : values_(n) {}
  Buffer(Buffer&&) noexcept = default;
  Buffer& operator=(Buffer&&) noexcept = default;
  Buffer(const Buffer&) = delete;  // as on every device: a second copy is always explicit
  Buffer& operator=(const Buffer&) = delete;

  std::span<T> span() { return values_; }
  std::span<const T> span() const { return values_; }
  std::size_t size() const { return values_.size(); }

 private:
  std::vector<T> values_;
};

}  // namespace cpu

struct Cpu {
  static constexpr std::string_view kName = "cpu";
  using Place = cpu::Place;
  template <class T>
  using Buffer = cpu::Buffer<T>;

  // T is deduced from the destination; the source converts from std::span<T> as well.
  template <class T>
  static void copy(const Place& /*place*/, std::span<const std::type_identity_t<T>> from,
                   std::span<T> to) {
    COHORT_ASSERT(from.size() == to.size());
    std::copy(from.begin(), from.end(), to.begin());
  }

  template <class T>
  static void add_into(const Place& /*place*/, std::span<T> inout,
                       std::span<const std::type_identity_t<T>> in) {
    cpu::combine_into<T>(ReduceOp::kSum, inout, in);
  }

  template <class T>
  static double sum_of_squares(const Place& /*place*/, std::span<const T> x) {
    return cpu::sum_of_squares<T>(x);
  }

  template <class O, class T>
  static void step(const Place& /*place*/, const O& o, std::span<T> parameters,
                   std::span<const std::type_identity_t<T>> gradients, std::span<T> state,
                   optimizer::StepContext context) {
    o.step(parameters, gradients, state, context);
  }

  // o.step, and whether every gradient was finite (cpu::step_finite: one pass over the gradient).
  template <class O, class T>
  static bool step_finite(const Place& /*place*/, const O& o, std::span<T> parameters,
                          std::span<const std::type_identity_t<T>> gradients, std::span<T> state,
                          optimizer::StepContext context) {
    return cpu::step_finite<O, T>(o, parameters, gradients, state, context);
  }

  template <class T>
  static std::size_t first_nonfinite(const Place& /*place*/, std::span<const T> x) {
    return cpu::first_nonfinite<T>(x);
  }

  template <class T>
  static void to_host(const Place& place, std::span<const std::type_identity_t<T>> from,
                      std::span<T> host) {
    copy<T>(place, from, host);
  }

  template <class T>
  static void from_host(const Place& place, std::span<const std::type_identity_t<T>> host,
                        std::span<T> to) {
    copy<T>(place, host, to);
  }

  static void synchronize(const Place& /*place*/) {}
};
static_assert(Device<Cpu>);

}  // namespace cohort::device
