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
#include <type_traits>
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
    all_reduce(std::span<const E>(buffer), buffer, op);
  }

  template <class E>
  void all_reduce(std::span<const std::type_identity_t<E>> input, std::span<E> output,
                  ReduceOp op) {
    const Call call = this->begin_all_reduce(input, output, op);
    if (this->size() == 1 || output.empty()) {
      copy_unless_same(input, output);
      return;
    }
    const std::size_t segment = this->template segment_length<E>(detail::kSegmentMessageBytes);
    go_around(call, input, output, segment, 2 * (static_cast<std::size_t>(this->size()) - 1), op);
  }

  template <class E>
  void reduce_scatter(std::span<const E> input, std::span<E> output, ReduceOp op) {
    const Call call = this->begin_reduce_scatter(input, output, op);
    const std::size_t ranks = static_cast<std::size_t>(this->size());
    if (ranks == 1 || output.empty()) {
      copy_unless_same(input, output);
      return;
    }
    std::vector<E> work(input.size());
    go_around(call, input, std::span<E>(work), work.size(), ranks - 1, op);
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

  // The first `steps` steps of the ring on each segment of `input`, pipelined
  // (detail::OverTransport::pipeline), into `output` (which may be `input`). Steps 0 to n-2
  // reduce: each sends one chunk to the right neighbour and adds the one received from the left,
  // so that after them this rank's chunk holds the reduction over all ranks. The first step sends
  // a chunk of the input; every later one a chunk of the output, made by the step before. Steps
  // n-1 to 2n-3 gather: the reduced chunks travel around the ring until every rank holds all of
  // them.
  template <class E>
  void go_around(const Call& call, std::span<const E> input, std::span<E> output,
                 std::size_t segment, std::size_t steps, ReduceOp op) {
    const std::size_t ranks = static_cast<std::size_t>(this->size());
    const std::size_t staging_length = segment / ranks + 1;
    const std::span<E> staging = this->template scratch<E>(2 * staging_length);
    std::array<std::span<const E>, 2> addends;   // each lane's own contribution
    std::array<std::span<const E>, 2> received;  // what it adds to it
    std::array<std::span<E>, 2> sums;            // and where the sum goes
    const auto exchange_of = [&](std::size_t index, std::size_t lane, std::size_t step,
                                 detail::Exchange& exchange) {
      const std::size_t offset = index * segment;
      const std::size_t length = std::min(segment, output.size() - offset);
      const auto at = [&](auto whole, std::size_t chunk) {
        const auto range = detail::chunk(length, ranks, chunk);
        return whole.subspan(offset + range.begin, range.size());
      };
      const bool reducing = step + 1 < ranks;
      const std::size_t shift = reducing ? step + 1 : step - (ranks - 1);
      const std::span<E> incoming = at(output, behind(shift + 1));
      const std::span<E> into =
          reducing ? staging.subspan(lane * staging_length, incoming.size()) : incoming;
      const std::span<const E> outgoing =
          step == 0 ? at(input, behind(shift)) : at(std::span<const E>(output), behind(shift));
      exchange = {{right(), call.header, detail::bytes_of(outgoing)},
                  {left(), call.header, detail::writable_bytes_of(into)}};
      addends[lane] = at(input, behind(shift + 1));
      received[lane] = into;
      sums[lane] = incoming;
      return reducing ? incoming.size() : 0;
    };
    const auto add = [&](std::size_t lane, std::size_t begin, std::size_t length) {
      device::cpu::combine_into<E>(op, addends[lane].subspan(begin, length),
                                   received[lane].subspan(begin, length),
                                   sums[lane].subspan(begin, length));
    };
    this->pipeline(call, (output.size() + segment - 1) / segment, steps, exchange_of, add);
  }
};

// Checked over the in-process transport; any transport::Transport gives a Communicator the same way.
static_assert(Communicator<Ring<transport::Loopback::Endpoint>>);

}  // namespace cohort::collective
