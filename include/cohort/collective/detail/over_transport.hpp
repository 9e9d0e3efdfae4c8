// What every collective over a transport shares: sequence numbers and fingerprints on every
// frame, the translation of transport failures into errors that name the collective, the
// poisoning that makes every call after a failure fail too, the operations that involve no
// reduction (broadcast, all_gather, barrier), done directly between every pair of ranks, and the
// pipeline of the reductions: a large buffer is cut into segments, two of which are in flight at
// a time, so that one segment's reduction is done while the other's frames travel.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "cohort/collective/collective.hpp"
#include "cohort/collective/fingerprint.hpp"
#include "cohort/core/error.hpp"
#include "cohort/transport/transport.hpp"

namespace cohort::collective::detail {

template <class E>
std::span<const std::byte> bytes_of(std::span<const E> values) {
  return std::as_bytes(values);
}

template <class E>
std::span<std::byte> writable_bytes_of(std::span<E> values) {
  return std::as_writable_bytes(values);
}

// Element range [begin, end) of chunk `index` when `length` elements are cut into `chunks` chunks
// whose sizes differ by at most one.
struct Chunk {
  std::size_t begin;
  std::size_t end;
  std::size_t size() const { return end - begin; }
};

inline Chunk chunk(std::size_t length, std::size_t chunks, std::size_t index) {
  return {index * length / chunks, (index + 1) * length / chunks};
}

// Bytes of the largest message of a pipelined segment (OverTransport::pipeline): a segment's
// buffer, staging and socket traffic then stay in cache. Between 2 processes, chunks of 512 KiB
// took a 4 MiB all-reduce 1.2 ms where 4 MiB took 1.7, and 64 MiB 24 ms instead of 35; 256 KiB
// was no faster, and every segment is more round trips (docs/benchmarks.md, "Socket tuning and
// segments"): cutting a 1 MiB buffer into 4 segments took it from 0.74 to 1.33 ms between 2
// hosts at 16 Gbit/s.
inline constexpr std::size_t kSegmentMessageBytes = 512 * 1024;

// One step of a pipelined collective (OverTransport::pipeline): a send to one peer and a receive
// from one.
struct Exchange {
  transport::Send send;
  transport::Receive receive;
};

template <transport::Transport T>
class OverTransport {
 public:
  int rank() const { return transport_.rank(); }
  int size() const { return transport_.size(); }
  T& transport() { return transport_; }
  // How errors name `rank`: its rank in the job, where the transport is some ranks of it
  // (transport::Subgroup).
  int job_rank(int rank) const {
    if constexpr (requires { transport_.job_rank(rank); }) {
      return rank < 0 ? rank : transport_.job_rank(rank);
    } else {
      return rank;
    }
  }

  template <class E>
  void broadcast(std::span<E> buffer, int root) {
    const Call call = begin({Operation::kBroadcast, data_type_of<E>(),
                             static_cast<std::uint16_t>(root), buffer.size()});
    if (root < 0 || root >= size()) fail(call, "root " + std::to_string(root) + " is not a rank");
    std::vector<transport::Send> sends;
    std::vector<transport::Receive> receives;
    if (rank() == root) {
      for (int peer = 0; peer < size(); ++peer) {
        if (peer != root) sends.push_back({peer, call.header, bytes_of<E>(buffer)});
      }
    } else {
      receives.push_back({root, call.header, writable_bytes_of(buffer)});
    }
    transfer(call, sends, receives);
  }

  template <class E>
  void all_gather(std::span<const E> input, std::span<E> output) {
    const Call call = begin({Operation::kAllGather, data_type_of<E>(), 0, input.size()});
    if (output.size() != input.size() * static_cast<std::size_t>(size())) {
      fail(call, "output has " + std::to_string(output.size()) + " elements, needs size() x " +
                     std::to_string(input.size()));
    }
    std::vector<transport::Send> sends;
    std::vector<transport::Receive> receives;
    for (int peer = 0; peer < size(); ++peer) {
      if (peer == rank()) continue;
      sends.push_back({peer, call.header, bytes_of(input)});
      receives.push_back(
          {peer, call.header,
           writable_bytes_of(output.subspan(slot(peer, input.size()), input.size()))});
    }
    E* const own = output.data() + slot(rank(), input.size());
    if (input.data() != own) std::copy(input.begin(), input.end(), own);  // else in place
    transfer(call, sends, receives);
  }

  void barrier() {
    const Call call = begin({Operation::kBarrier, DataType::kInt32, 0, 0});
    std::vector<transport::Send> sends;
    std::vector<transport::Receive> receives;
    for (int peer = 0; peer < size(); ++peer) {
      if (peer == rank()) continue;
      sends.push_back({peer, call.header, {}});
      receives.push_back({peer, call.header, {}});
    }
    transfer(call, sends, receives);
  }

  // Aborts the transport (transport.hpp): a transfer in progress on another thread fails at once,
  // and every peer's collective fails naming this rank and quoting `reason`. Safe from any thread.
  void abort(std::string_view reason) { transport_.abort(reason); }

 protected:
  explicit OverTransport(T transport) : transport_(std::move(transport)) {}

  // One collective in progress: its fingerprint and the header of all its frames.
  struct Call {
    Fingerprint fingerprint;
    transport::Header header;
  };

  // The openings of the reductions, whose algorithms differ by collective.
  template <class E>
  Call begin_all_reduce(std::span<const E> input, std::span<E> output, ReduceOp op) {
    const Call call = begin(
        {Operation::kAllReduce, data_type_of<E>(), static_cast<std::uint16_t>(op), output.size()});
    for (const std::string& problem :
         {out_of_place_problem(input, std::span<const E>(output)), reduction_problem<E>(op)}) {
      if (!problem.empty()) fail(call, problem);
    }
    return call;
  }

  template <class E>
  Call begin_reduce_scatter(std::span<const E> input, std::span<E> output, ReduceOp op) {
    const Call call = begin({Operation::kReduceScatter, data_type_of<E>(),
                             static_cast<std::uint16_t>(op), output.size()});
    if (input.size() != static_cast<std::size_t>(size()) * output.size()) {
      fail(call, "input has " + std::to_string(input.size()) + " elements, needs size() x " +
                     std::to_string(output.size()));
    }
    if (const std::string problem = reduction_problem<E>(op); !problem.empty()) fail(call, problem);
    return call;
  }

  Call begin(Fingerprint fingerprint) {
    if (failure_) {
      throw CommError(
          {.rank = job_rank(rank()),
           .peer = failure_->peer(),
           .operation = std::string(name(fingerprint.operation)),
           .sequence = sequence_ + 1,
           .detail = "refused: the group failed earlier: " + std::string(failure_->what())});
    }
    ++sequence_;
    return {fingerprint, {transport::message_type::kCollective, sequence_, fingerprint.tag()}};
  }

  // Runs one transfer of `call`; any failure poisons the group and names the collective.
  void transfer(const Call& call, std::span<const transport::Send> sends,
                std::span<const transport::Receive> receives) {
    guarded(call, [&] { transport_.transfer(sends, receives); });
  }

  // The same, doing pieces of `work` while it waits where the transport can
  // (transport::Overlapping); the caller finishes the work.
  template <class Work>
  void transfer(const Call& call, std::span<const transport::Send> sends,
                std::span<const transport::Receive> receives, Work& work) {
    if constexpr (transport::Overlapping<T>) {
      guarded(call, [&] { transport_.transfer(sends, receives, transport::Meanwhile(work)); });
    } else {
      transfer(call, sends, receives);
    }
  }

  // Runs `move` (a transfer of `call`); any failure poisons the group and names the collective.
  template <class Move>
  void guarded(const Call& call, Move&& move) {
    try {
      move();
    } catch (const transport::HeaderMismatch& mismatch) {
      mismatched(call, mismatch.peer(), mismatch.received);
    } catch (const CommError& error) {
      poison_and_throw(call, error.peer(), std::string(error.detail()));
    }
  }

  [[noreturn]] void fail(const Call& call, const std::string& why) {
    poison_and_throw(call, -1, why);
  }

  // `peer` was found in another call than `call`, the one its header `theirs` names.
  [[noreturn]] void mismatched(const Call& call, int peer, const transport::Header& theirs) {
    const std::string called =
        theirs.type == transport::message_type::kCollective
            ? Fingerprint::from_tag(theirs.tag).describe() + " #" + std::to_string(theirs.sequence)
            : "a message of type " + std::to_string(theirs.type);
    poison_and_throw(call, peer,
                     "called " + call.fingerprint.describe() + " but rank " +
                         std::to_string(job_rank(peer)) + " called " + called);
  }

  // A failure of `call`, `peer` the rank to blame if one is (named in the job: job_rank). The first
  // failure leaves the transport with its message, so that ranks waiting elsewhere learn the cause
  // and not only that this rank is gone.
  [[noreturn]] void poison_and_throw(const Call& call, int peer, std::string detail) {
    const CommError error({.rank = job_rank(rank()),
                           .peer = job_rank(peer),
                           .operation = std::string(name(call.fingerprint.operation)),
                           .sequence = call.header.sequence,
                           .detail = std::move(detail)});
    if (!failure_) {
      failure_ = error;
      transport_.leave(error.what());
    }
    throw error;
  }

  // `error`, thrown by another group over this transport (transport::Subgroup), is this group's
  // failure too: later calls are refused naming it. That group has told the peers already.
  void failed_with(const CommError& error) {
    if (!failure_) failure_ = error;
  }

  // Elements per block of the work done while a transfer waits: short enough that the sockets
  // are looked at often, long enough to run at full speed.
  static constexpr std::size_t kWorkBlock = 16 * 1024;

  // Elements per segment of a pipelined buffer (pipeline): size() chunks of `chunk_bytes`.
  template <class E>
  std::size_t segment_length(std::size_t chunk_bytes) const {
    return static_cast<std::size_t>(size()) * std::max<std::size_t>(1, chunk_bytes / sizeof(E));
  }

  // Runs `steps` steps on each of `segments` segments, two segments at a time, so that the
  // reduction of one overlaps the transfer of the other. step(segment, lane, index, exchange)
  // fills the exchange of the index-th step of a segment (lane 0 or 1: the segment's parity, so
  // that the segments in flight have staging memory of their own) and returns how many elements
  // of work on what it receives follow it (0: none); work(lane, begin, length) does a block of
  // it. That work is done while the other lane's next transfer waits for its peers, and always
  // finished before this lane's next transfer. Every rank runs the same sequence of transfers,
  // so that each pair of ranks sends and receives its frames in the same order.
  template <class Step, class Work>
  void pipeline(const Call& call, std::size_t segments, std::size_t steps, Step&& step,
                Work&& work) {
    struct Pending {
      std::size_t lane = 0;
      std::size_t next = 0;
      std::size_t count = 0;
    } pending;
    auto piece = [&] {  // one block of the pending work: whether more is left
      if (pending.next < pending.count) {
        const std::size_t length = std::min(kWorkBlock, pending.count - pending.next);
        work(pending.lane, pending.next, length);
        pending.next += length;
      }
      return pending.next < pending.count;
    };
    const auto finish = [&] {
      while (piece()) {
      }
    };
    std::array<std::size_t, 2> segment{0, 1};  // each lane's segment
    std::array<std::size_t, 2> done{0, 0};     // steps done on it
    for (std::size_t lane = 0; segment[0] < segments || segment[1] < segments; lane ^= 1) {
      if (segment[lane] >= segments) continue;
      if (pending.lane == lane) finish();  // the other lane has ended
      Exchange exchange;
      const std::size_t count = step(segment[lane], lane, done[lane], exchange);
      transfer(call, {&exchange.send, 1}, {&exchange.receive, 1}, piece);
      finish();
      pending = {lane, 0, count};
      if (++done[lane] == steps) {
        done[lane] = 0;
        segment[lane] += 2;
      }
    }
    finish();
  }

  // Byte scratch reused across calls, so a steady training loop allocates nothing.
  template <class E>
  std::span<E> scratch(std::size_t elements) {
    const std::size_t bytes = elements * sizeof(E);
    if (scratch_.size() < bytes) scratch_.resize(bytes);
    return {reinterpret_cast<E*>(scratch_.data()), elements};
  }

  std::size_t slot(int rank, std::size_t length) const {
    return static_cast<std::size_t>(rank) * length;
  }

 private:
  T transport_;
  std::uint64_t sequence_ = 0;
  std::optional<CommError> failure_;
  std::vector<std::byte> scratch_;  // max_align_t-aligned by operator new
};

}  // namespace cohort::collective::detail
