// Deterministic: the default collective between processes. Its all-reduce gives, on every rank,
// exactly the bits of the canonical tree over ranks (core/reduction_tree.hpp), the same as
// collective::Local and as the fold over micro-batches inside a replica, so a run across
// processes and hosts reproduces a run in one process. It moves as many bytes as a ring.
//
//   collective::Deterministic<transport::tcp::Tcp> communicator(std::move(tcp));
//
// Algorithm (all-reduce of B bytes over n ranks):
//   small (n x B <= kDirectBytes): every rank sends its whole buffer to every other and folds all
//     n locally in tree order: one round of messages, so latency is one hop.
//   large: the buffer is cut into segments (over_transport.hpp); in each, chunk j belongs to
//     rank j. Every rank sends chunk j to its owner, the owner folds the n contributions in tree
//     order (reduce_scatter), then every owner sends its folded chunk to every rank (all_gather).
//     Each half exchanges with one peer each way at a time, in n-1 steps. Per rank that is
//     2 (n-1)/n x B sent and received in 2 (n-1) steps, as in a ring.
// reduce_scatter is the first half alone. broadcast, all_gather and barrier are direct.
//
// Requirements: as for every communicator (collective.hpp). Not thread-safe: one thread per
// communicator.
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
class Deterministic : public detail::OverTransport<T> {
  using Base = detail::OverTransport<T>;
  using Call = typename Base::Call;

 public:
  // Whole buffers go to every rank up to this many bytes over all ranks.
  static constexpr std::size_t kDirectBytes = 64 * 1024;

  explicit Deterministic(T transport) : Base(std::move(transport)) {}

  template <class E>
  void all_reduce(std::span<E> buffer, ReduceOp op) {
    const Call call = this->begin_all_reduce(buffer, op);
    const std::size_t ranks = static_cast<std::size_t>(this->size());
    if (ranks == 1 || buffer.empty()) return;
    if (buffer.size_bytes() * ranks <= kDirectBytes) {
      fold_whole_buffers(call, buffer, op);
      return;
    }
    this->for_each_segment(buffer, [&](std::span<E> part) {
      const auto mine = detail::chunk(part.size(), ranks, static_cast<std::size_t>(this->rank()));
      fold_owned_chunk(call, std::span<const E>(part), part.subspan(mine.begin, mine.size()), op);
      gather_owned_chunks(call, part);
    });
  }

  template <class E>
  void reduce_scatter(std::span<const E> input, std::span<E> output, ReduceOp op) {
    fold_owned_chunk(this->begin_reduce_scatter(input, output, op), input, output, op);
  }

 private:
  // Every rank gets every buffer and folds them all.
  template <class E>
  void fold_whole_buffers(const Call& call, std::span<E> buffer, ReduceOp op) {
    const int ranks = this->size();
    const std::size_t length = buffer.size();
    std::span<E> staging = this->template scratch<E>(static_cast<std::size_t>(ranks) * length);
    std::vector<transport::Send> sends;
    std::vector<transport::Receive> receives;
    std::vector<const E*> inputs(static_cast<std::size_t>(ranks));
    for (int peer = 0; peer < ranks; ++peer) {
      const auto slot = staging.subspan(this->slot(peer, length), length);
      inputs[static_cast<std::size_t>(peer)] = peer == this->rank() ? buffer.data() : slot.data();
      if (peer == this->rank()) continue;
      sends.push_back({peer, call.header, detail::bytes_of(std::span<const E>(buffer))});
      receives.push_back({peer, call.header, detail::writable_bytes_of(slot)});
    }
    this->transfer(call, sends, receives);
    fold_into(op, inputs, buffer);
  }

  // Sends chunk j of `input` to rank j, receives every rank's chunk of this rank and folds them,
  // with this rank's own, into `owned` (which may alias this rank's chunk of input).
  template <class E>
  void fold_owned_chunk(const Call& call, std::span<const E> input, std::span<E> owned,
                        ReduceOp op) {
    const std::size_t count = static_cast<std::size_t>(this->size());
    const std::size_t length = owned.size();
    std::span<E> staging = this->template scratch<E>(count * length);
    const auto slot = [&](int peer) { return staging.subspan(this->slot(peer, length), length); };
    exchange_with_every_peer(
        call,
        [&](int peer) {
          const auto theirs = detail::chunk(input.size(), count, static_cast<std::size_t>(peer));
          return detail::bytes_of(input.subspan(theirs.begin, theirs.size()));
        },
        [&](int peer) { return detail::writable_bytes_of(slot(peer)); });
    std::vector<const E*> inputs(count);
    for (int peer = 0; peer < this->size(); ++peer) {
      inputs[static_cast<std::size_t>(peer)] = slot(peer).data();
    }
    const auto mine = detail::chunk(input.size(), count, static_cast<std::size_t>(this->rank()));
    inputs[static_cast<std::size_t>(this->rank())] = input.data() + mine.begin;
    fold_into(op, inputs, owned);
  }

  // Sends outgoing(peer) to and receives incoming(peer) from every other rank, one peer each way
  // at a time: at step s to rank + s and from rank - s. Each rank's link then carries one flow
  // each way, as in a ring, where all at once n-1 senders meet at every receiver: with 4
  // processes on 2 cores a 16 MiB all-reduce took 27-28 ms that way and 15 ms this way, and on
  // shaped links all at once lost packets (docs/benchmarks.md, "Socket tuning and segments").
  template <class Outgoing, class Incoming>
  void exchange_with_every_peer(const Call& call, Outgoing&& outgoing, Incoming&& incoming) {
    const int ranks = this->size();
    for (int shift = 1; shift < ranks; ++shift) {
      const int to = (this->rank() + shift) % ranks;
      const int from = (this->rank() + ranks - shift) % ranks;
      const transport::Send send{to, call.header, outgoing(to)};
      const transport::Receive receive{from, call.header, incoming(from)};
      this->transfer(call, {&send, 1}, {&receive, 1});
    }
  }

  // out = the canonical-tree fold of inputs, where out may alias one input: folded a cache-sized
  // block at a time into a small buffer and copied out while hot, so the fold costs no extra pass
  // over memory.
  template <class E>
  void fold_into(ReduceOp op, std::vector<const E*>& inputs, std::span<E> out) {
    constexpr std::size_t kBlock = 16 * device::cpu::kReduceBlock;
    thread_local std::vector<E> block(kBlock);
    std::vector<const E*> offset(inputs.size());
    for (std::size_t begin = 0; begin < out.size(); begin += kBlock) {
      const std::size_t count = std::min(kBlock, out.size() - begin);
      for (std::size_t i = 0; i < inputs.size(); ++i) offset[i] = inputs[i] + begin;
      device::cpu::reduce_tree<E>(op, offset, std::span<E>(block).first(count));
      std::copy_n(block.begin(), count, out.begin() + static_cast<std::ptrdiff_t>(begin));
    }
  }

  // Every rank sends its chunk of `part` to every other and receives theirs in place.
  template <class E>
  void gather_owned_chunks(const Call& call, std::span<E> part) {
    const std::size_t count = static_cast<std::size_t>(this->size());
    const auto mine = detail::chunk(part.size(), count, static_cast<std::size_t>(this->rank()));
    exchange_with_every_peer(
        call,
        [&](int) {
          return detail::bytes_of(std::span<const E>(part.subspan(mine.begin, mine.size())));
        },
        [&](int peer) {
          const auto theirs = detail::chunk(part.size(), count, static_cast<std::size_t>(peer));
          return detail::writable_bytes_of(part.subspan(theirs.begin, theirs.size()));
        });
  }
};

// Checked over the in-process transport; any transport::Transport gives a Communicator the same
// way.
static_assert(Communicator<Deterministic<transport::Loopback::Endpoint>>);

}  // namespace cohort::collective
