// KeptStripes: the sharded update of an elastic job (mirrored_replica.hpp), where each worker
// process updates only its part of the parameters and optimizer state. A worker lost mid-step
// would take the only current copy of its part of the optimizer state with it, and the survivors
// may have updated their own parts of the step they retry. So, every kEvery steps (own copies:
// as keep_schedule.hpp says) and at a segment's start, each worker also keeps the state of that
// step, alternating between two copies:
// - workers of one host (their stripes shared through memory) each write their stripes of the
//   parameters and optimizer state into their shared buffer, the one of the gradient sum
//   (collective::Deterministic::share_buffer):
//
//   | gradient sum | parameters, copy 0 | copy 1 | optimizer state, copy 0 | copy 1 |
//
// - workers whose stripes do not reach every worker (the sharded update over TCP, and by host,
//   where each host's workers share their stripes) each make the optimizer state whole, as they
//   do before a checkpoint, and copy it and the parameters into memory of their own
//   (KeptStripes::own): the stripes of a group of one, laid out as above without the gradient
//   sum.
// A worker keeps a copy before the meeting that follows it (the gather of that step's
// parameters through shared memory, else the next step's all-reduce; at a segment's start, its
// first all-reduce), so a process that passed that meeting knows every worker's copy complete. A
// copy is overwritten two copies later, which no worker begins before every worker has passed the
// meeting of the copy between. So the newest copy any survivor knows complete is whole and intact:
// after a loss, each survivor rebuilds the state of that step from every worker's stripes, the
// lost one's included (the shared memory outlives the lost process), or from its own copy, none of
// it travels, and the job computes the steps since again, with the same micro-batches, to the same
// bits (trainer/elastic.hpp).
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "cohort/core/error.hpp"

namespace cohort::strategy::detail {

// Calls body(begin, count) for each stripe of `rank` in `length` elements cut in stripes of
// `stripe`: stripe k belongs to rank k mod ranks.
template <class Body>
void for_each_stripe_of(std::size_t rank, std::size_t ranks, std::size_t stripe,
                        std::size_t length, Body&& body) {
  const std::size_t stride = stripe * ranks;
  for (std::size_t begin = rank * stripe; begin < length; begin += stride) {
    body(begin, std::min(stripe, length - begin));
  }
}

// Where each worker keeps its stripes in its shared buffer, or its own copies, in elements (top of
// this file).
struct StripeLayout {
  std::size_t parameters = 0;  // 0: nothing kept
  std::size_t state = 0;       // elements of the optimizer state
  std::size_t stripe = 1;
  int ranks = 0;  // of the membership; 1 where each keeps its own copies
  std::size_t element_bytes = 0;
  std::size_t first = 0;  // where copy 0 of the parameters begins: after a shared gradient sum

  std::size_t shared_count() const { return first + 2 * parameters + 2 * state; }
  // The offsets of the parameters and of the optimizer state in copy 0 or 1.
  std::size_t parameters_in(std::size_t copy) const { return first + parameters * copy; }
  std::size_t state_in(std::size_t copy) const { return first + 2 * parameters + state * copy; }
};

// What a process keeps of its membership's stripes, which its replica writes and the strategy
// keeps past a regroup. Every worker keeps at the same steps into the same copy, so each knows what
// every worker's copies hold.
struct KeptStripes {
  // A worker keeps its stripes after every kEvery-th step (and at a segment's start): the copies
  // into cold memory took 1.9 ms of a 25 ms step of the examples' MLP, kept after every step
  // (docs/benchmarks.md, "Elastic jobs"), and after a loss the
  // job goes on from the kept step, computing again at most kEvery steps, to the same bits.
  static constexpr std::uint64_t kEvery = 16;

  StripeLayout layout{};
  std::array<std::uint64_t, 2> steps{};  // the step each copy holds, once written
  std::size_t keeps = 0;                 // copies written in this membership: the next is keeps % 2
  // The newest step whose copy this process knows every worker has written (it passed the meeting
  // that follows the writes), if any.
  std::optional<std::uint64_t> complete{};
  // An update has begun since the state was last whole: this process's parameters or optimizer
  // state may be current only on its own stripes.
  bool spread = false;
  // Where the workers share no memory, this process's copies of the whole state (top of this
  // file), kept from segment to segment of a membership.
  std::vector<std::byte> own{};

  // The copy that the state after `steps` steps goes into, now counted as holding it.
  std::size_t begin_copy(std::uint64_t steps) {
    const std::size_t copy = keeps++ % 2;
    this->steps[copy] = steps;
    return copy;
  }

  // The meeting after the newest copy (the next step's all-reduce, which every worker joins after
  // its copy): every worker has kept it.
  void met() {
    if (keeps > 0) complete = steps[(keeps - 1) % 2];
  }

  // Nothing kept yet in a segment; the memory of the own copies stays.
  void restart() { *this = {.own = std::move(own)}; }

  // Keeps the whole state after `steps` steps in this process's own copies (workers that share
  // no memory).
  template <class T>
  void keep_own(std::span<const T> parameters, std::span<const T> state, std::uint64_t steps) {
    layout = {.parameters = parameters.size(),
              .state = state.size(),
              .stripe = parameters.size(),
              .ranks = 1,
              .element_bytes = sizeof(T)};
    own.resize(layout.shared_count() * sizeof(T));
    T* const kept = reinterpret_cast<T*>(own.data());
    const std::size_t copy = begin_copy(steps);
    std::ranges::copy(parameters, kept + layout.parameters_in(copy));
    std::ranges::copy(state, kept + layout.state_in(copy));
  }
};

// A process's own copies (KeptStripes::own) as the shared buffers of a group of one, for
// rebuild_from_kept_state.
struct OwnCopies {
  std::span<const std::byte> memory;

  int ranks() const { return 1; }
  template <class E>
  std::span<const E> of(int /*rank*/, std::size_t count) const {
    COHORT_ASSERT(count * sizeof(E) <= memory.size());
    return {reinterpret_cast<const E*>(memory.data()), count};
  }
};

// The parameters and optimizer state after `steps` steps, rebuilt from every worker's stripes of
// the copy that holds them in `buffers` (the shared buffers of the membership: collective::
// SharedBuffers).
template <class T, class Buffers>
void rebuild_from_kept_state(const KeptStripes& kept, const Buffers& buffers,
                             std::span<T> parameters, std::span<T> state, std::uint64_t steps) {
  const StripeLayout& layout = kept.layout;
  const std::size_t copy = kept.keeps >= 2 && kept.steps[1] == steps ? 1 : 0;
  COHORT_ASSERT(layout.element_bytes == sizeof(T) && layout.parameters == parameters.size() &&
                layout.state == state.size() && buffers.ranks() == layout.ranks &&
                kept.keeps > copy && kept.steps[copy] == steps);
  const auto ranks = static_cast<std::size_t>(layout.ranks);
  for (std::size_t rank = 0; rank < ranks; ++rank) {
    const std::span<const T> shared =
        buffers.template of<T>(static_cast<int>(rank), layout.shared_count());
    const std::span<const T> kept_parameters =
        shared.subspan(layout.parameters_in(copy), layout.parameters);
    const std::span<const T> kept_state = shared.subspan(layout.state_in(copy), layout.state);
    for_each_stripe_of(rank, ranks, layout.stripe, layout.parameters,
                       [&](std::size_t begin, std::size_t count) {
                         std::copy_n(kept_parameters.data() + begin, count,
                                     parameters.data() + begin);
                         for (std::size_t at = begin; at < layout.state; at += layout.parameters) {
                           std::copy_n(kept_state.data() + at, count, state.data() + at);
                         }
                       });
  }
}

}  // namespace cohort::strategy::detail
