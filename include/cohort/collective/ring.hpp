// Ring: the classic bandwidth-optimal all-reduce, for users who want the textbook algorithm.
//
// The buffer is cut into segments and each segment into n chunks. Reduce-scatter: in n-1 steps
// every rank sends one chunk to its right neighbour and adds the chunk it receives from its left
// one, so that rank r ends with the full reduction of chunk r. All-gather: in n-1 more steps the
// reduced chunks travel around the ring. Per rank that is 2 (n-1)/n x B sent and received.
//
// The result is identical on every rank and repeatable for a given number of ranks, but chunk c
// is summed in ring order starting after rank c, not in the canonical tree: a ring run does NOT
// reproduce the bits of a run with another rank count or of collective::Deterministic. Use
// Deterministic (the default) when reproducibility matters.
#pragma once

#include <algorithm>
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
    this->for_each_segment(buffer, [&](std::span<E> part) {
      reduce_around(call, part, op);
      gather_around(call, part);
    });
  }

  template <class E>
  void reduce_scatter(std::span<const E> input, std::span<E> output, ReduceOp op) {
    const Call call = this->begin_reduce_scatter(input, output, op);
    const std::size_t ranks = static_cast<std::size_t>(this->size());
    std::vector<E> work(input.begin(), input.end());
    if (ranks > 1) reduce_around(call, std::span<E>(work), op);
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

  // After n-1 steps this rank's chunk of `part` holds the reduction over all ranks.
  template <class E>
  void reduce_around(const Call& call, std::span<E> part, ReduceOp op) {
    const std::size_t ranks = static_cast<std::size_t>(this->size());
    std::span<E> staging = this->template scratch<E>(part.size() / ranks + 1);
    for (std::size_t step = 0; step + 1 < ranks; ++step) {
      const auto outgoing = detail::chunk(part.size(), ranks, behind(step + 1));
      const auto incoming = detail::chunk(part.size(), ranks, behind(step + 2));
      const auto received = staging.first(incoming.size());
      const transport::Send send{
          right(), call.header,
          detail::bytes_of(std::span<const E>(part.subspan(outgoing.begin, outgoing.size())))};
      const transport::Receive receive{left(), call.header, detail::writable_bytes_of(received)};
      this->transfer(call, {&send, 1}, {&receive, 1});
      device::cpu::combine_into<E>(op, part.subspan(incoming.begin, incoming.size()),
                                   std::span<const E>(received));
    }
  }

  // Passes the reduced chunks around until every rank holds all of them.
  template <class E>
  void gather_around(const Call& call, std::span<E> part) {
    const std::size_t ranks = static_cast<std::size_t>(this->size());
    for (std::size_t step = 0; step + 1 < ranks; ++step) {
      const auto outgoing = detail::chunk(part.size(), ranks, behind(step));
      const auto incoming = detail::chunk(part.size(), ranks, behind(step + 1));
      const transport::Send send{
          right(), call.header,
          detail::bytes_of(std::span<const E>(part.subspan(outgoing.begin, outgoing.size())))};
      const transport::Receive receive{
          left(), call.header,
          detail::writable_bytes_of(part.subspan(incoming.begin, incoming.size()))};
      this->transfer(call, {&send, 1}, {&receive, 1});
    }
  }
};

// Checked over the in-process transport; any transport::Transport gives a Communicator the same way.
static_assert(Communicator<Ring<transport::Loopback::Endpoint>>);

}  // namespace cohort::collective
