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
//   large: the buffer is cut into segments; in each, chunk j belongs to rank j. Every rank sends
//     chunk j to its owner, the owner folds the n contributions in tree order (reduce_scatter),
//     then every owner sends its folded chunk to every rank (all_gather). Per rank that is
//     2 (n-1)/n x B sent and received, as in a ring, in two rounds instead of 2 (n-1).
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
  // Bytes of one rank's chunk per segment: bounds the staging memory to (n-1) x this.
  static constexpr std::size_t kSegmentChunkBytes = 4 * 1024 * 1024;

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
    this->for_each_segment(buffer, kSegmentChunkBytes, [&](std::span<E> part) {
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
    const int ranks = this->size();
    const std::size_t count = static_cast<std::size_t>(ranks);
    const std::size_t length = owned.size();
    std::span<E> staging = this->template scratch<E>(count * length);
    std::vector<transport::Send> sends;
    std::vector<transport::Receive> receives;
    std::vector<const E*> inputs(count);
    for (int peer = 0; peer < ranks; ++peer) {
      const auto theirs = detail::chunk(input.size(), count, static_cast<std::size_t>(peer));
      const auto slot = staging.subspan(this->slot(peer, length), length);
      if (peer == this->rank()) {
        inputs[static_cast<std::size_t>(peer)] = input.data() + theirs.begin;
        continue;
      }
      inputs[static_cast<std::size_t>(peer)] = slot.data();
      sends.push_back(
          {peer, call.header, detail::bytes_of(input.subspan(theirs.begin, theirs.size()))});
      receives.push_back({peer, call.header, detail::writable_bytes_of(slot)});
    }
    this->transfer(call, sends, receives);
    fold_into(op, inputs, owned);
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
    std::vector<transport::Send> sends;
    std::vector<transport::Receive> receives;
    for (int peer = 0; peer < this->size(); ++peer) {
      if (peer == this->rank()) continue;
      const auto theirs = detail::chunk(part.size(), count, static_cast<std::size_t>(peer));
      sends.push_back(
          {peer, call.header,
           detail::bytes_of(std::span<const E>(part.subspan(mine.begin, mine.size())))});
      receives.push_back({peer, call.header,
                          detail::writable_bytes_of(part.subspan(theirs.begin, theirs.size()))});
    }
    this->transfer(call, sends, receives);
  }
};

// Checked over the in-process transport; any transport::Transport gives a Communicator the same way.
static_assert(Communicator<Deterministic<transport::Loopback::Endpoint>>);

}  // namespace cohort::collective
