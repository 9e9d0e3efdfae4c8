// Ring: the classic bandwidth-optimal all-reduce, for users who want the textbook algorithm.
//
// The buffer is cut into segments and each segment into n chunks. Reduce-scatter: in n-1 steps
// every rank sends one chunk to its right neighbour and adds the chunk it receives from its left
// one, so that rank r ends with the full reduction of chunk r. All-gather: in n-1 more steps the
// reduced chunks travel around the ring. Per rank that is 2 (n-1)/n x B sent and received. Two
// segments are in flight at a time, so that one's additions are done while the other's chunks
// travel (detail/over_transport.hpp).
//
// The result is identical on every rank and repeatable for a given number of ranks, but chunk c
// is summed in ring order starting after rank c, not in the canonical tree: a ring run does NOT
// reproduce the bits of a run with another rank count or of collective::Deterministic. Use
// Deterministic (the default) when reproducibility matters.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <span>
#include <vector>

#include "cohort/collective/collective.hpp"
#include "cohort/collective/detail/over_transport.hpp"
#include "cohort/device/cpu.hpp"
#include "cohort/transport/loopback.hpp"
#include "cohort/transport/transport.hpp"

namespace cohort::collective {

template <transport::Transport T>
class Ring : public detail::OverTransport<T> {
  using Base = detail::OverTransport<T>;
  using Call = typename Base::Call;

 public:
  explicit Ring(T transport) : Base(std::move(transport)) {}

  template <class E>
  void all_reduce(std::span<E> buffer, ReduceOp op) {
    const Call call = this->begin_all_reduce(buffer, op);
    if (this->size() == 1 || buffer.empty()) return;
    const std::size_t segment = this->template segment_length<E>();
    go_around(call, buffer, segment, 2 * (static_cast<std::size_t>(this->size()) - 1), op);
  }

  template <class E>
  void reduce_scatter(std::span<const E> input, std::span<E> output, ReduceOp op) {
    const Call call = this->begin_reduce_scatter(input, output, op);
    const std::size_t ranks = static_cast<std::size_t>(this->size());
    std::vector<E> work(input.begin(), input.end());
    if (ranks > 1 && !work.empty()) go_around(call, std::span<E>(work), work.size(), ranks - 1, op);
    const auto mine = detail::chunk(work.size(), ranks, static_cast<std::size_t>(this->rank()));
    std::copy_n(work.begin() + static_cast<std::ptrdiff_t>(mine.begin), mine.size(),
                output.begin());
  }

 private:
  int right() const { return (this->rank() + 1) % this->size(); }
  int left() const { return (this->rank() + this->size() - 1) % this->size(); }

  // Chunk index `steps` places before this rank's, around the ring.
  std::size_t behind(std::size_t steps) const {
    const std::size_t ranks = static_cast<std::size_t>(this->size());
    return (static_cast<std::size_t>(this->rank()) + ranks * 2 - steps) % ranks;
  }

  // The first `steps` steps of the ring on each segment of `buffer`, pipelined
  // (detail::OverTransport::pipeline). Steps 0 to n-2 reduce: each sends one chunk to the right
  // neighbour and adds the one received from the left, so that after them this rank's chunk holds
  // the reduction over all ranks. Steps n-1 to 2n-3 gather: the reduced chunks travel around
  // the ring until every rank holds all of them.
  template <class E>
  void go_around(const Call& call, std::span<E> buffer, std::size_t segment, std::size_t steps,
                 ReduceOp op) {
    const std::size_t ranks = static_cast<std::size_t>(this->size());
    const std::size_t staging_length = segment / ranks + 1;
    const std::span<E> staging = this->template scratch<E>(2 * staging_length);
    std::array<std::span<E>, 2> sums;            // each lane's chunk to add into
    std::array<std::span<const E>, 2> received;  // and what it adds
    const auto exchange_of = [&](std::size_t index, std::size_t lane, std::size_t step,
                                 detail::Exchange& exchange) {
      const std::span<E> part =
          buffer.subspan(index * segment, std::min(segment, buffer.size() - index * segment));
      const auto at = [&](std::size_t chunk) {
        const auto range = detail::chunk(part.size(), ranks, chunk);
        return part.subspan(range.begin, range.size());
      };
      const bool reducing = step + 1 < ranks;
      const std::size_t shift = reducing ? step + 1 : step - (ranks - 1);
      const std::span<E> incoming = at(behind(shift + 1));
      const std::span<E> into =
          reducing ? staging.subspan(lane * staging_length, incoming.size()) : incoming;
      exchange = {{right(), call.header, detail::bytes_of(std::span<const E>(at(behind(shift))))},
                  {left(), call.header, detail::writable_bytes_of(into)}};
      sums[lane] = incoming;
      received[lane] = into;
      return reducing ? incoming.size() : 0;
    };
    const auto add = [&](std::size_t lane, std::size_t begin, std::size_t length) {
      device::cpu::combine_into<E>(op, sums[lane].subspan(begin, length),
                                   received[lane].subspan(begin, length));
    };
    this->pipeline(call, (buffer.size() + segment - 1) / segment, steps, exchange_of, add);
  }
};

// Checked over the in-process transport; any transport::Transport gives a Communicator the same way.
static_assert(Communicator<Ring<transport::Loopback::Endpoint>>);

}  // namespace cohort::collective
