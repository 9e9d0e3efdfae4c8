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
//     2 (n-1)/n x B sent and received in 2 (n-1) steps, as in a ring. Two segments are in flight
//     at a time, so that one's fold is done while the other's chunks travel.
//   large, n a power of two from 4 (of equal leaf counts): the same bytes in 2 log2(n) steps
//     (halve_and_double). log2(n) steps halve each segment: at step k each rank sends half of
//     what it holds to the rank 2^k away and folds the other half with what that one sends, so
//     that each fold is a node of the canonical tree over ranks, level by level, the lower ranks'
//     node on the left; then log2(n) steps double it back. 8 ranks take 6 steps instead of 14.
// reduce_scatter is the first half alone. broadcast, all_gather and barrier are direct.
// A kSumBfloat16 (kSumFloat16) all-reduce of float (core/reduce_op.hpp) runs the same algorithm on
// the buffer packed into Bfloat16 (Float16): every value that travels is a node of that tree, so
// half the bytes carry the same bits.
//
// Processes of one host (share_host_memory, which MultiWorkerMirrored calls): the all-reduce goes
// through a shared segment (detail/shared_segment.hpp) instead of the transport, by the same
// algorithm, so with the same bits. Each piece of the buffer (up to a slot, 1 MiB) is written
// into this rank's slot; once every rank has arrived, the owner of chunk j folds it in tree order
// straight from every rank's slot and writes it back into its own; once every rank has arrived
// again, each copies the other owners' chunks out. A small piece (n x B <= kDirectBytes) is
// folded whole by every rank after one meeting. A buffer that a rank keeps in the segment itself
// (share_buffer: MultiWorkerMirrored's gradient sum) needs no slot: the owner of chunk j folds it
// from every rank's buffer and writes it into every rank's, between two meetings, so that the
// all-reduce is one pass over the memory, as between threads. The other collectives keep the
// transport, and the transport stays the watch on the peers: while a rank waits in the segment it
// looks at its peers' connections, so a peer that died, left or called another collective is
// named as over the transport, and a peer that does not arrive within the transport's
// operation_timeout is too.
//
// Processes of several hosts, as many on each and each host's consecutive in rank order
// (share_host_memory again): the all-reduce goes by host. The ranks of each host fold their host's
// node of the tree through a shared segment, each a chunk of every piece; the chunks of rank k of
// every host are all-reduced between the hosts over the transport, by the algorithm above among
// those ranks alone (one of each host, as nodes of the hosts' counts); each rank copies them back
// through the segment. Where the buffer lies in the host's segment (share_buffer), the folds and
// the copies back go a part at a time, while other parts travel between the hosts. Each host sends
// a gradient over the network once, not once per process, and every value is a node of the same
// tree, so the bits are those of every other path. Where a host's ranks are not one node of the
// tree (leaf counts that cut a host), the all-reduce stays flat.
//
// Requirements: as for every communicator (collective.hpp); not moved once it shares memory
// across hosts (its groups refer to its transport). Not thread-safe: one thread per
// communicator.
#pragma once

#include <algorithm>
#include <array>
#include <bit>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "cohort/collective/collective.hpp"
#include "cohort/collective/detail/over_transport.hpp"
#include "cohort/collective/detail/shared_segment.hpp"
#include "cohort/core/error.hpp"
#include "cohort/core/options.hpp"
#include "cohort/core/reduction_tree.hpp"
#include "cohort/core/trace.hpp"
#include "cohort/device/cpu.hpp"
#include "cohort/transport/loopback.hpp"
#include "cohort/transport/subgroup.hpp"
#include "cohort/transport/transport.hpp"

namespace cohort::collective {

// Every rank's shared buffer (Deterministic::share_buffer) as one rank maps them, kept past the
// communicator that made them (Deterministic::keep_shared_buffers): the memory stays readable while
// this object lives, a peer's part included after its process ended.
class SharedBuffers {
 public:
  SharedBuffers(detail::SharedSegment segment, int ranks)
      : segment_(std::move(segment)), ranks_(ranks) {}

  int ranks() const { return ranks_; }

  // The first `count` elements of `rank`'s shared buffer.
  template <class E>
  std::span<const E> of(int rank, std::size_t count) const {
    COHORT_ASSERT(rank >= 0 && rank < ranks_ && count * sizeof(E) <= segment_.region_bytes());
    return {reinterpret_cast<const E*>(segment_.region(rank)), count};
  }

 private:
  detail::SharedSegment segment_;
  int ranks_;
};

template <transport::Transport T>
class Deterministic : public detail::OverTransport<T> {
  using Base = detail::OverTransport<T>;
  using Call = typename Base::Call;
  // The groups of an all-reduce by host run among some ranks of this one, and split no further.
  static constexpr bool kSplitsByHost = !transport::is_subgroup_v<T>;
  template <transport::Transport>
  friend class Deterministic;

 public:
  // Whole buffers go to every rank up to this many bytes over all ranks.
  static constexpr std::size_t kDirectBytes = 64 * 1024;

  // Bytes of a rank's chunk in a segment of the all-reduce over `ranks` ranks (segment_length).
  // Every message of the ring-like schedule is one chunk, so its chunk is the largest message
  // (detail::kSegmentMessageBytes). The halving's first message is half a segment, so its segment
  // is two of those messages, whatever the ranks: with segments of 8 chunks of 512 KiB a 4 MiB
  // all-reduce between 8 hosts at 1 Gbit/s was one segment, its first fold overlapped by nothing,
  // and took 73-75 ms against the ring's 63-65; with 1 MiB segments, 63-64 ms (docs/benchmarks.md,
  // "Socket tuning and segments"). Its chunks, its last messages, stay at least 64 KiB, since
  // every segment costs 2 log2(n) messages.
  static constexpr std::size_t segment_chunk_bytes(std::size_t ranks, bool halving) {
    if (!halving) return detail::kSegmentMessageBytes;
    return std::max<std::size_t>(64 * 1024, 2 * detail::kSegmentMessageBytes / ranks);
  }
  // A shared buffer (share_buffer) holds at most this many bytes per rank, so that the segment's
  // size cannot overflow: far beyond any host's memory.
  static constexpr std::size_t kMostSharedBufferBytes = std::size_t{1} << 48;

  explicit Deterministic(T transport) : Base(std::move(transport)) {}

  // How many leaves of the canonical tree each rank's buffer stands for, in rank order (the
  // micro-batches a worker's replicas fold: sharding::Deal): every reduction folds the ranks as
  // nodes of those sizes (collective::FoldsNodes). Empty, the default: one each, the tree over
  // ranks. Every rank sets the same counts before its next reduction.
  void set_leaf_counts(std::vector<std::size_t> leaf_counts) {
    require_leaf_counts(leaf_counts, this->size());
    leaf_counts_ = std::move(leaf_counts);
    if constexpr (kSplitsByHost) {
      if (by_host_) group_by_host();
    }
  }

  // Whether all_reduce goes by host now (top of this file).
  bool reduces_by_host() const {
    if constexpr (kSplitsByHost) {
      return by_host_ && by_host_->engaged;
    } else {
      return false;
    }
  }

  template <class E>
  void all_reduce(std::span<E> buffer, ReduceOp op) {
    all_reduce(std::span<const E>(buffer), buffer, op);
  }

  template <class E>
  void all_reduce(std::span<const std::type_identity_t<E>> input, std::span<E> output,
                  ReduceOp op) {
    const Call call = this->begin_all_reduce(input, output, op);
    const std::size_t ranks = static_cast<std::size_t>(this->size());
    if (ranks == 1 || output.empty()) {
      copy_unless_same(input, output);
      return;
    }
    if constexpr (kSplitsByHost) {
      if (reduces_by_host()) return all_reduce_by_host(call, input, output, op);
    }
    if (segment_) {
      const auto where = input.data() == output.data() ? region_offset(output) : std::nullopt;
      if (where) {
        all_reduce_in_region(call, output, *where, op);
      } else {
        all_reduce_in_segment(call, input, output, op);
      }
      return;
    }
    reduce_over_transport(call, input, output, op);
  }

  template <class E>
  void reduce_scatter(std::span<const E> input, std::span<E> output, ReduceOp op) {
    const Call call = this->begin_reduce_scatter(input, output, op);
    if (this->size() == 1 || output.empty()) {
      copy_unless_same(input, output);
      return;
    }
    fold_and_gather<E>(call, 1, {.count = static_cast<std::size_t>(this->size()) - 1}, op,
                       [&](std::size_t) {
                         return Segment<E>{input, output, {}};
                       });
  }

  // What share_host_memory found.
  struct HostSharing {
    bool shared = false;
    // The hosts the ranks are on: 1 where all share this one.
    int hosts = 1;
    // Why not, where some ranks share a host but not its memory: this rank's reason, or the
    // first rank that could not, or why the ranks cannot go by host. Empty where shared, or
    // where no two ranks share a host.
    std::string why_not{};
    // Where the ranks of some host are not consecutive but every host has as many: this rank's
    // place in the order that makes them so, in which they could go by host (the hosts in the
    // order of their first rank, each one's ranks in theirs; rank 0 keeps its place). -1
    // otherwise.
    int rank_by_host = -1;
  };

  // Where every rank of the group is on this host (detail::host_identity) and wants it,
  // all_reduce goes through a shared segment from now on; where the ranks are on several hosts,
  // as many on each and each host's consecutive, it goes by host (top of this file). A
  // collective: every rank calls it at the same point, also a rank that does not want it. A rank
  // waiting in the segment spins for `spin` before it sleeps (zero for a thread at real-time
  // priority, whose spinning would keep its core from the other threads); the transport's
  // operation_timeout and stall_warning (tcp::Options) govern those waits as they govern
  // transfers. `identity` says which host this rank is on: this one's, unless a test has ranks of
  // one process stand for several hosts.
  HostSharing share_host_memory(bool wanted, std::chrono::microseconds spin,
                                const detail::HostIdentity& identity =
                                    detail::host_identity()) requires transport::Serving<T> &&
      requires(const T& t) {
    t.options().operation_timeout;
    t.options().stall_warning;
  }
  {
    const auto& options = this->transport().options();
    waiting_ = {options.operation_timeout, spin, options.stall_warning};
    std::array<std::int64_t, std::tuple_size_v<detail::HostIdentity> + 1> mine{wanted};
    std::copy(identity.begin(), identity.end(), mine.begin() + 1);
    std::vector<std::int64_t> all(mine.size() * static_cast<std::size_t>(this->size()));
    this->all_gather(std::span<const std::int64_t>(mine), std::span<std::int64_t>(all));
    if constexpr (kSplitsByHost) by_host_.reset();
    const std::size_t words = mine.size();
    bool one_host = true;
    for (std::size_t rank = 0; rank < static_cast<std::size_t>(this->size()); ++rank) {
      const auto theirs = std::span<const std::int64_t>(all).subspan(rank * words, words);
      if (theirs[0] == 0) return {};  // a rank that does not want it
      one_host = one_host && std::ranges::equal(theirs, mine);
    }
    if (!one_host) {
      if constexpr (kSplitsByHost) {
        return share_by_host(all, words, spin);
      } else {
        return {};
      }
    }
    HostSharing sharing;
    std::optional<detail::SharedSegment> segment = agree_on_segment(0, sharing.why_not);
    if (!segment) return sharing;
    adopt(std::move(*segment));
    return {.shared = true};
  }

  // Where all_reduce goes through shared memory (share_host_memory), `count` elements of this
  // rank in the segment, where its peers read and write them: an all-reduce of any part of them
  // (at the same offset on every rank) needs no copy in or out, as between threads. A rank that
  // computes its contribution there (a training step's gradient sum: MultiWorkerMirrored) saves
  // a pass over it each way: for the examples' MLP on 2 cores, the gradient's all-reduce went
  // from 1.06 to 0.40 ms (docs/benchmarks.md, "Processes of one host"). A collective, with the
  // same count on every rank; the buffer lives until the next call of a larger count, or the
  // communicator's end. By host, it lies in the segment of this rank's host, whose ranks fold
  // their chunks of it there.
  template <class E>
  SharedBuffer<E> share_buffer(std::size_t count) {
    if constexpr (kSplitsByHost) {
      if (by_host_) return by_host_->host.template share_buffer<E>(count);
    }
    if (!segment_ || this->size() == 1) return {};
    if (count > kMostSharedBufferBytes / sizeof(E)) {
      return {.why_not = std::to_string(count) + " elements are more than a shared buffer holds (" +
                         std::to_string(kMostSharedBufferBytes) + " bytes per rank)"};
    }
    const std::size_t bytes = count * sizeof(E);
    if (segment_->region_bytes() < bytes) {
      SharedBuffer<E> refused;
      std::optional<detail::SharedSegment> segment = agree_on_segment(bytes, refused.why_not);
      if (!segment) return refused;
      adopt(std::move(*segment));
    }
    return {.values = std::span<E>(reinterpret_cast<E*>(segment_->region(this->rank())), count)};
  }

  // Whether gather_shared_stripes reaches every rank: where the shared buffers are one segment's,
  // not each host's (by host).
  bool stripes_reach_every_rank() const {
    if constexpr (kSplitsByHost) return by_host_ == nullptr;
    return true;
  }

  // The ranks gather_shared_stripes shares a striped buffer out among (collective.hpp): by host,
  // this rank's host's, so that every host holds the whole buffer once gathered.
  std::optional<StripeGroup> stripe_group() const {
    if constexpr (kSplitsByHost) {
      if (by_host_) return by_host_->host.stripe_group();
    }
    return StripeGroup{.place = static_cast<std::size_t>(this->rank()),
                       .size = static_cast<std::size_t>(this->size())};
  }

  // The shared buffers of every rank (share_buffer), taken from this communicator, which
  // all-reduces over its transport from then on; nothing where it shares no memory. An elastic
  // job keeps them past a lost worker (strategy/detail/kept_stripes.hpp). Not a collective.
  std::optional<SharedBuffers> keep_shared_buffers() {
    if (!segment_) return std::nullopt;
    SharedBuffers kept(std::move(*segment_), this->size());
    segment_.reset();
    return kept;
  }

  // The all-gather of a buffer striped over the ranks of the stripe group (stripe_group): `part`
  // lies in this rank's shared buffer (share_buffer) at the same place on every rank, and each
  // rank has written its own stripes of it there (stripe k, elements [k x stripe, (k + 1) x
  // stripe), belongs to the rank at place k mod the group's size); every other rank's stripes are
  // copied from where they lie into `into` (part.size() elements), whose own stripes this rank
  // fills itself. A collective, over shared memory only: one meeting before the copies, one
  // after, so that no rank writes its buffer again while a peer reads it; by host, among the
  // host's ranks. A sharded update (strategy/detail/mirrored_replica.hpp) gathers its parameters
  // this way.
  template <class E>
  void gather_shared_stripes(std::span<const E> part, std::span<E> into, std::size_t stripe) {
    if constexpr (kSplitsByHost) {
      if (by_host_) {
        by_host_->host.gather_shared_stripes(part, into, stripe);
        return;
      }
    }
    const Call call = this->begin({Operation::kAllGather, data_type_of<E>(), 0, part.size()});
    const std::optional<std::uint64_t> where =
        segment_ ? region_offset(part) : std::optional<std::uint64_t>();
    if (!where || into.size() != part.size() || stripe == 0) {
      this->fail(call,
                 "gather_shared_stripes needs a part of the shared buffer, a buffer of its "
                 "length and stripes of at least one element");
    }
    const std::size_t ranks = static_cast<std::size_t>(this->size());
    const std::size_t me = static_cast<std::size_t>(this->rank());
    meet(call, *where);
    for (std::size_t k = 0; k * stripe < part.size(); ++k) {
      const std::size_t rank = k % ranks;
      if (rank == me) continue;
      const std::size_t begin = k * stripe;
      const E* const from =
          reinterpret_cast<const E*>(segment_->region(static_cast<int>(rank)) + *where) + begin;
      std::copy_n(from, std::min(stripe, part.size() - begin),
                  into.begin() + static_cast<std::ptrdiff_t>(begin));
    }
    meet(call, *where);
  }

  // The all-reduce over the transport in its two halves, for a caller that works on the reduced
  // values between them (collective.hpp, ReducesToOwners: the sharded update over TCP,
  // strategy/detail/owned_update.hpp). reduce_to_owners(buffer, op) leaves in the elements of
  // `buffer` that this rank owns (for_each_owned) the bits all_reduce gives them, and the other
  // elements undefined; gather_from_owners(buffer) sends each rank's owned elements of `buffer`,
  // whatever it wrote there since, to every rank. Who owns an element depends only on the
  // buffer's length and the group, so a buffer of the same length gathers by the same owners: the
  // parameters that an update of the owned gradient wrote. Each half moves half the all-reduce's
  // bytes in half its steps. Where reduces_to_owners(): over the transport, flat, more than one
  // rank; not through shared memory, which shares its stripes instead (gather_shared_stripes).
  bool reduces_to_owners() const { return this->size() > 1 && !segment_ && !reduces_by_host(); }

  // Calls body(begin, count) for each run of the elements of a buffer of `length` E that this
  // rank owns, in order: its chunk of each segment of the all-reduce (segment_layout).
  template <class E, class Body>
  void for_each_owned(std::size_t length, Body&& body) const {
    for_each_owner<E>(length, [&](std::size_t begin, std::size_t count, int rank) {
      if (rank == this->rank()) body(begin, count);
    });
  }

  // Calls body(begin, count, rank) for each run of a buffer of `length` E and the rank that owns
  // it, segment by segment (within a segment, by rank, not by place).
  template <class E, class Body>
  void for_each_owner(std::size_t length, Body&& body) const {
    const SegmentLayout layout = segment_layout<E>(length);
    for (std::size_t begin = 0; begin < length; begin += layout.segment) {
      const std::size_t count = std::min(layout.segment, length - begin);
      for (int rank = 0; rank < this->size(); ++rank) {
        const detail::Chunk owned = owned_of_segment(count, layout.halving, rank);
        if (owned.size() > 0) body(begin + owned.begin, owned.size(), rank);
      }
    }
  }

  template <class E>
  void reduce_to_owners(std::span<E> buffer, ReduceOp op) {
    const Call call = this->begin({Operation::kReduceScatter, data_type_of<E>(),
                                   static_cast<std::uint16_t>(op), buffer.size()});
    if (const std::string problem = owners_problem<E>(op); !problem.empty())
      this->fail(call, problem);
    if (buffer.empty()) return;
    const SegmentLayout layout = segment_layout<E>(buffer.size());
    if (layout.direct) return fold_whole_buffers<E>(call, buffer, buffer, op);
    walk_segments<E>(call, buffer, buffer, layout, {.count = half_steps(layout)}, op);
  }

  template <class E>
  void gather_from_owners(std::span<E> buffer) {
    const Call call = this->begin({Operation::kAllGather, data_type_of<E>(), 0, buffer.size()});
    if (!reduces_to_owners()) this->fail(call, owners_problem<E>(ReduceOp::kSum));
    if (buffer.empty()) return;
    const SegmentLayout layout = segment_layout<E>(buffer.size());
    const std::size_t half = half_steps(layout);
    walk_segments<E>(call, buffer, buffer, layout, {.first = half, .count = half}, ReduceOp::kSum);
  }

 private:
  // Which steps of an algorithm a call runs: all of an all-reduce's, or one half.
  struct Steps {
    std::size_t first = 0;
    std::size_t count = 0;
  };

  // How reduce_over_transport cuts a buffer: whole buffers to every rank (`direct`: then one
  // segment, owned as fold_and_gather owns one), or segments of `segment` elements that halve and
  // double or fold and gather.
  struct SegmentLayout {
    std::size_t segment;
    bool direct = false;
    bool halving = false;
    std::size_t segments(std::size_t length) const { return (length + segment - 1) / segment; }
    static std::size_t levels(std::size_t ranks) {
      return static_cast<std::size_t>(std::countr_zero(ranks));
    }
  };
  template <class E>
  SegmentLayout segment_layout(std::size_t length) const {
    const std::size_t ranks = static_cast<std::size_t>(this->size());
    if (length * sizeof(E) * ranks <= kDirectBytes) {
      return {.segment = std::max<std::size_t>(1, length), .direct = true};
    }
    const bool halving = halves_and_doubles();
    return {.segment = this->template segment_length<E>(segment_chunk_bytes(ranks, halving)),
            .halving = halving};
  }

  // The steps of each half of the all-reduce under `layout`: log2(n) halvings, or n-1 exchanges.
  std::size_t half_steps(const SegmentLayout& layout) const {
    const auto ranks = static_cast<std::size_t>(this->size());
    return layout.halving ? SegmentLayout::levels(ranks) : ranks - 1;
  }

  // The part of a segment of `length` elements that `rank` (this rank, by default) holds once the
  // reduction's first half is done: its chunk, or what the halvings leave it.
  detail::Chunk owned_of_segment(std::size_t length, bool halving, int rank = -1) const {
    const auto ranks = static_cast<std::size_t>(this->size());
    const auto owner = static_cast<std::size_t>(rank < 0 ? this->rank() : rank);
    return halving ? halved_part(owner, length, SegmentLayout::levels(ranks))
                   : detail::chunk(length, ranks, owner);
  }

  // What keeps reduce_to_owners from `op` here, in words for the error, or empty.
  template <class E>
  std::string owners_problem(ReduceOp op) const {
    if (!reduces_to_owners()) {
      return "reduce_to_owners and gather_from_owners run over the transport of a flat group of "
             "more than one rank";
    }
    if (op == ReduceOp::kSumBfloat16 || op == ReduceOp::kSumFloat16) {
      return std::string(name(op)) + " travels packed, which reduce_to_owners does not do";
    }
    return reduction_problem<E>(op);
  }

  // The part of a segment of `length` elements that `rank` holds after `halvings` halvings
  // (halve_and_double).
  static detail::Chunk halved_part(std::size_t rank, std::size_t length, std::size_t halvings) {
    detail::Chunk part{0, length};
    for (std::size_t k = 0; k < halvings; ++k) {
      const std::size_t middle = part.begin + part.size() / 2;
      part = (rank >> k) & 1 ? detail::Chunk{middle, part.end} : detail::Chunk{part.begin, middle};
    }
    return part;
  }

  // What an all-reduce over the transport does with the parts of its buffer around their travel:
  // enters(begin, length) before a part first travels, leaves(begin, length) once it has arrived
  // whole (reduce_packed rounds and widens there); nothing, by default.
  struct Unstaged {
    void enters(std::size_t, std::size_t) const {}
    void leaves(std::size_t, std::size_t) const {}
  };

  // The all-reduce of `call` over the transport (top of this file), its buffer entering and
  // leaving `staged` a segment at a time (fold_and_gather); a rounded sum's in 2 bytes an element
  // (reduce_packed).
  template <class E, class Staged = Unstaged>
  void reduce_over_transport(const Call& call, std::span<const E> input, std::span<E> output,
                             ReduceOp op, const Staged& staged = {}) {
    if constexpr (std::is_same_v<E, float>) {
      if (op == ReduceOp::kSumBfloat16)
        return reduce_packed(call, input, output, op, packed_bfloat16_, staged);
      if (op == ReduceOp::kSumFloat16)
        return reduce_packed(call, input, output, op, packed_float16_, staged);
    }
    const SegmentLayout layout = segment_layout<E>(output.size());
    if (layout.direct) {
      staged.enters(0, output.size());
      fold_whole_buffers(call, input, output, op);
      staged.leaves(0, output.size());
      return;
    }
    walk_segments(call, input, output, layout, {.count = 2 * half_steps(layout)}, op,
                  BySegment<Staged>{&staged, layout.segment});
  }

  // Whether the all-reduce over the transport halves and doubles (top of this file): the ranks a
  // power of two from 4, each the same number of leaves, so that the pairs at distance 1, 2, 4,
  // ... are the canonical tree's nodes over ranks. (With 2 ranks both algorithms are one step
  // each way.)
  bool halves_and_doubles() const {
    const auto ranks = static_cast<std::size_t>(this->size());
    return ranks >= 4 && std::has_single_bit(ranks) &&
           std::ranges::adjacent_find(leaf_counts_, std::not_equal_to<>{}) == leaf_counts_.end();
  }

  // `staged` in a segment's terms: element `begin` of segment `index` is element index x segment
  // + begin of the buffer.
  template <class Staged>
  struct BySegment {
    static constexpr bool kStages = !std::is_same_v<Staged, Unstaged>;
    const Staged* staged = nullptr;
    std::size_t segment = 0;
    void enters(std::size_t index, std::size_t begin, std::size_t length) const {
      staged->enters(index * segment + begin, length);
    }
    void leaves(std::size_t index, std::size_t begin, std::size_t length) const {
      staged->leaves(index * segment + begin, length);
    }
  };

  // `steps` of the all-reduce's algorithm on the segments of `layout` (not direct), from `input`
  // into `output`, each segment owned as owned_of_segment says: all of them, or the first half,
  // which reduces to the owners, or the second, which gathers from them.
  template <class E, class Staged = Unstaged>
  void walk_segments(const Call& call, std::span<const E> input, std::span<E> output,
                     const SegmentLayout& layout, Steps steps, ReduceOp op,
                     const BySegment<Staged>& by_segment = {}) {
    const auto segment_of = [&](std::size_t index) {
      const std::size_t begin = index * layout.segment;
      const std::size_t length = std::min(layout.segment, output.size() - begin);
      const std::span<E> part = output.subspan(begin, length);
      const detail::Chunk mine = owned_of_segment(length, layout.halving);
      return Segment<E>{input.subspan(begin, length), part.subspan(mine.begin, mine.size()), part};
    };
    const std::size_t segments = layout.segments(output.size());
    if (layout.halving) {
      halve_and_double<E>(call, segments, steps, op, segment_of, by_segment);
    } else {
      fold_and_gather<E>(call, segments, steps, op, segment_of, by_segment);
    }
  }

  // The groups of an all-reduce by host: this rank's host, and this rank's rail (the ranks of
  // every host with this one's place in its host).
  struct ByHost {
    Deterministic<transport::Subgroup<T>> host;
    Deterministic<transport::Subgroup<T>> rail;
    bool engaged = false;  // the hosts are nodes of the tree under the leaf counts
  };

  // share_host_memory where the ranks are on several hosts: `all` holds every rank's words
  // (`words` each: wanted, then its host's identity).
  HostSharing share_by_host(std::span<const std::int64_t> all, std::size_t words,
                            std::chrono::microseconds spin) requires kSplitsByHost {
    const std::size_t ranks = static_cast<std::size_t>(this->size());
    const std::size_t me = static_cast<std::size_t>(this->rank());
    const auto identity = [&](std::size_t rank) { return all.subspan(rank * words, words); };
    // Each rank's host, the hosts numbered in the order of their first rank.
    std::vector<std::size_t> host_of(ranks);
    std::vector<std::size_t> firsts;
    std::vector<std::size_t> counts;
    for (std::size_t rank = 0; rank < ranks; ++rank) {
      const auto same = std::ranges::find_if(firsts, [&](std::size_t first) {
        return std::ranges::equal(identity(first), identity(rank));
      });
      host_of[rank] = static_cast<std::size_t>(same - firsts.begin());
      if (same == firsts.end()) {
        firsts.push_back(rank);
        counts.push_back(0);
      }
      ++counts[host_of[rank]];
    }
    const std::size_t hosts = firsts.size();
    const std::size_t per_host = counts.front();
    const bool as_many = std::ranges::count(counts, per_host) == std::ssize(counts);
    for (std::size_t rank = 1; rank < ranks; ++rank) {
      if (host_of[rank] >= host_of[rank - 1]) continue;
      HostSharing apart{
          .hosts = static_cast<int>(hosts),
          .why_not = "ranks " + std::to_string(firsts[host_of[rank]]) + " and " +
                     std::to_string(rank) +
                     " share a host but the ranks between them do not: the ranks of each host "
                     "must be consecutive"};
      if (as_many) {
        const auto before_me = std::ranges::count(std::span(host_of).first(me), host_of[me]);
        apart.rank_by_host = static_cast<int>(host_of[me] * per_host) + static_cast<int>(before_me);
      }
      return apart;
    }
    for (std::size_t host = 1; host < hosts; ++host) {
      const std::size_t count = counts[host];
      if (count == per_host) continue;
      return {.hosts = static_cast<int>(hosts),
              .why_not = "host " + std::to_string(host) + " (from rank " +
                         std::to_string(firsts[host]) + ") has " + std::to_string(count) +
                         (count == 1 ? " rank" : " ranks") + ", host 0 has " +
                         std::to_string(per_host) + ": every host must have as many"};
    }
    if (per_host == 1) return {.hosts = static_cast<int>(hosts)};
    const std::size_t my_host = me / per_host;
    std::vector<int> host_members;
    std::vector<int> rail_members;
    for (std::size_t k = 0; k < per_host; ++k) {
      host_members.push_back(static_cast<int>(my_host * per_host + k));
    }
    for (std::size_t host = 0; host < hosts; ++host) {
      rail_members.push_back(static_cast<int>(host * per_host + me % per_host));
    }
    auto split = std::make_unique<ByHost>(
        ByHost{Deterministic<transport::Subgroup<T>>(
                   transport::Subgroup<T>(this->transport(), std::move(host_members))),
               Deterministic<transport::Subgroup<T>>(
                   transport::Subgroup<T>(this->transport(), std::move(rail_members)))});
    detail::HostIdentity own{};
    std::copy_n(identity(me).begin() + 1, own.size(), own.begin());
    const auto local = split->host.share_host_memory(true, spin, own);
    // Every rank learns whether every host shares its memory.
    if (const int refused = first_refusal(local.shared); refused != this->size()) {
      return {.hosts = static_cast<int>(hosts),
              .why_not = !local.why_not.empty() ? local.why_not
                                                : "rank " + std::to_string(refused) +
                                                      " could not share memory on its host"};
    }
    by_host_ = std::move(split);
    group_by_host();
    return {.shared = true, .hosts = static_cast<int>(hosts)};
  }

  // Whether each host's ranks make one node of the tree under the leaf counts, and if so, the
  // counts of its groups: its host's ranks', and the hosts'.
  void group_by_host() requires kSplitsByHost {
    ByHost& split = *by_host_;
    const std::size_t per_host = static_cast<std::size_t>(split.host.size());
    const std::size_t hosts = static_cast<std::size_t>(split.rail.size());
    std::vector<std::size_t> counts = leaf_counts_;
    if (counts.empty()) counts.assign(per_host * hosts, 1);
    std::vector<std::size_t> host_counts(hosts, 0);
    for (std::size_t rank = 0; rank < counts.size(); ++rank) {
      host_counts[rank / per_host] += counts[rank];
    }
    split.engaged = tree::are_nodes(host_counts);
    if (!split.engaged) return;
    const std::size_t first = static_cast<std::size_t>(this->rank()) / per_host * per_host;
    split.host.set_leaf_counts({counts.begin() + static_cast<std::ptrdiff_t>(first),
                                counts.begin() + static_cast<std::ptrdiff_t>(first + per_host)});
    split.rail.set_leaf_counts(std::move(host_counts));
  }

  // The all-reduce by host (top of this file). The pieces and their slots are the host
  // segment's, as in all_reduce_in_segment; each rank keeps its chunk of every piece, folded over
  // its host, in order in the scratch, which is all it sends between the hosts.
  template <class E>
  void all_reduce_by_host(const Call& call, std::span<const E> input, std::span<E> output,
                          ReduceOp op) requires kSplitsByHost {
    Deterministic<transport::Subgroup<T>>& host = by_host_->host;
    try {
      const auto host_call = host.begin_all_reduce(input, output, op);
      const auto where = input.data() == output.data() ? host.region_offset(output) : std::nullopt;
      if (where) {
        reduce_in_host_regions(host, host_call, output, *where, op);
        return;
      }
      const detail::SharedSegment& segment = *host.segment_;
      const std::size_t ranks = static_cast<std::size_t>(host.size());
      const int me = host.rank();
      const std::size_t piece_length = segment.slot_bytes() / sizeof(E);
      const auto slot = [&](int set, int rank) {
        return std::span<E>(reinterpret_cast<E*>(segment.slot(set, rank)), piece_length);
      };
      const auto at = [](auto span, std::size_t index) {
        return span.begin() + static_cast<std::ptrdiff_t>(index);
      };
      // each(offset, length, this rank's chunk of the piece) for every piece, in order.
      const auto pieces = [&](auto&& each) {
        for (std::size_t offset = 0; offset < output.size(); offset += piece_length) {
          const std::size_t length = std::min(piece_length, output.size() - offset);
          each(offset, length, detail::chunk(length, ranks, static_cast<std::size_t>(me)));
        }
      };
      std::size_t owned = 0;
      pieces([&](std::size_t, std::size_t, detail::Chunk mine) { owned += mine.size(); });
      const std::span<E> folded = this->template scratch<E>(owned);
      std::vector<const E*> inputs(ranks);
      std::size_t next = 0;
      pieces([&](std::size_t offset, std::size_t length, detail::Chunk mine) {
        const std::span<const E> piece = input.subspan(offset, length);
        const int set = static_cast<int>(host.pieces_++ % 2);
        const std::span<E> own = slot(set, me);
        std::copy(piece.begin(), at(piece, mine.begin), own.begin());
        std::copy(at(piece, mine.end), piece.end(), at(own, mine.end));
        host.meet(host_call);
        for (int rank = 0; rank < host.size(); ++rank) {
          inputs[static_cast<std::size_t>(rank)] =
              (rank == me ? piece.data() : slot(set, rank).data()) + mine.begin;
        }
        E* const into[] = {folded.data() + next};
        host.template fold_into<E>(op, inputs, std::span<E* const>(into), mine.size());
        next += mine.size();
      });
      by_host_->rail.all_reduce(folded, op);
      next = 0;
      pieces([&](std::size_t offset, std::size_t length, detail::Chunk mine) {
        const int set = static_cast<int>(host.pieces_++ % 2);
        const auto part = folded.subspan(next, mine.size());
        next += mine.size();
        std::copy(part.begin(), part.end(), at(slot(set, me), mine.begin));
        std::copy(part.begin(), part.end(), at(output, offset + mine.begin));
        host.meet(host_call);
        for (int rank = 0; rank < host.size(); ++rank) {
          if (rank == me) continue;
          const auto theirs = detail::chunk(length, ranks, static_cast<std::size_t>(rank));
          const std::span<E> from = slot(set, rank).subspan(theirs.begin, theirs.size());
          std::copy(from.begin(), from.end(), at(output, offset + theirs.begin));
        }
      });
    } catch (const CommError& error) {
      // Named as this group's all-reduce, whose sequence every rank of the job shares.
      const CommError failure({.rank = error.rank(),
                               .peer = error.peer(),
                               .operation = std::string(name(call.fingerprint.operation)),
                               .sequence = call.header.sequence,
                               .detail = std::string(error.detail())});
      this->failed_with(failure);
      throw failure;
    }
  }

  // The all-reduce by host of a part of the host's shared buffers (share_buffer: a gradient sum
  // computed there), as all_reduce_in_region does it on one host: this rank folds its chunk
  // straight from every host rank's buffer, all-reduces it between the hosts, and writes the
  // result into every host rank's buffer, with no copy in or out. The three stages overlap: the
  // rail's all-reduce takes its buffer in a segment at a time (reduce_over_transport's `staged`),
  // so a segment is folded from the host and a finished one written back while another's frames
  // travel between the hosts. The ranks of a host meet only before and after, since each writes
  // only its own chunk of every buffer.
  template <class E, class Host, class HostCall>
  void reduce_in_host_regions(Host& host, const HostCall& host_call, std::span<E> buffer,
                              std::uint64_t where, ReduceOp op) requires kSplitsByHost {
    const detail::SharedSegment& segment = *host.segment_;
    const std::size_t ranks = static_cast<std::size_t>(host.size());
    host.meet(host_call, where);
    const auto mine = detail::chunk(buffer.size(), ranks, static_cast<std::size_t>(host.rank()));
    const auto chunk_of = [&](std::size_t rank) {
      return reinterpret_cast<E*>(segment.region(static_cast<int>(rank)) + where) + mine.begin;
    };
    struct ThroughHost {
      Host* host;
      ReduceOp op;
      std::span<E> folded;
      std::vector<E*> chunks;                // every host rank's chunk in its buffer
      mutable std::vector<const E*> inputs;  // the parts of those chunks being folded
      void enters(std::size_t begin, std::size_t length) const {
        for (std::size_t rank = 0; rank < chunks.size(); ++rank) {
          inputs[rank] = chunks[rank] + begin;
        }
        E* const into[] = {folded.data() + begin};
        host->template fold_into<E>(op, inputs, std::span<E* const>(into), length);
      }
      void leaves(std::size_t begin, std::size_t length) const {
        for (E* const chunk : chunks) std::copy_n(folded.data() + begin, length, chunk + begin);
      }
    };
    std::vector<E*> chunks(ranks);
    for (std::size_t rank = 0; rank < ranks; ++rank) chunks[rank] = chunk_of(rank);
    const ThroughHost through_host{&host, op, this->template scratch<E>(mine.size()),
                                   std::move(chunks), std::vector<const E*>(ranks)};
    by_host_->rail.all_reduce_staged(through_host.folded, op, through_host);
    host.meet(host_call, where);
  }

  // all_reduce in place over the transport, the buffer entering and leaving `staged` a segment at
  // a time (reduce_over_transport): a rail's part of an all-reduce by host.
  template <class E, class Staged>
  void all_reduce_staged(std::span<E> buffer, ReduceOp op, const Staged& staged) {
    const Call call = this->begin_all_reduce(std::span<const E>(buffer), buffer, op);
    COHORT_ASSERT(this->size() > 1 && !segment_);
    if (!buffer.empty()) {
      reduce_over_transport(call, std::span<const E>(buffer), buffer, op, staged);
    }
  }

  // How a rank waits for its peers in the segment.
  struct Waiting {
    std::chrono::milliseconds timeout{};
    std::chrono::microseconds spin{};
    double stall_warning = 0;
  };

  // Rank 0 creates a segment with regions of `region_bytes` and sends its ticket (a leading 0
  // where it could not); the others map it; every rank learns whether all did before rank 0
  // removes the name. Returns the segment where every rank mapped it, else sets why_not.
  std::optional<detail::SharedSegment> agree_on_segment(std::size_t region_bytes,
                                                        std::string& why_not) {
    std::optional<detail::SharedSegment> segment;
    std::array<std::int64_t, 1 + std::tuple_size_v<detail::SharedSegment::Ticket>> words{};
    try {
      if (this->rank() == 0) {
        segment.emplace(detail::SharedSegment::create(0, this->size(), region_bytes));
        words[0] = 1;
        std::copy(segment->ticket().begin(), segment->ticket().end(), words.begin() + 1);
      }
    } catch (const std::exception& error) {
      why_not = error.what();
    }
    this->broadcast(std::span<std::int64_t>(words), 0);
    if (this->rank() != 0 && words[0] == 1) {
      detail::SharedSegment::Ticket ticket;
      std::copy(words.begin() + 1, words.end(), ticket.begin());
      try {
        segment.emplace(
            detail::SharedSegment::open(ticket, this->rank(), this->size(), region_bytes));
      } catch (const std::exception& error) {
        why_not = error.what();
      }
    }
    const int refused = first_refusal(segment.has_value());
    if (segment) segment->unlink();
    if (refused == this->size()) return segment;
    if (why_not.empty()) {
      why_not = "rank " + std::to_string(this->job_rank(refused)) +
                " could not create or map the segment";
    }
    return std::nullopt;
  }

  // The first rank where `done` is false, or size() where it is true on every rank. A collective.
  int first_refusal(bool done) {
    std::array<std::int32_t, 1> first{done ? this->size() : this->rank()};
    this->all_reduce(std::span<std::int32_t>(first), ReduceOp::kMin);
    return first[0];
  }

  // From now on all_reduce goes through `segment`, whose arrivals start at zero on every rank.
  void adopt(detail::SharedSegment segment) {
    segment_.reset();
    segment_.emplace(std::move(segment));
    phase_ = 0;
    pieces_ = 0;
    peers_.clear();
    for (int peer = 0; peer < this->size(); ++peer) {
      if (peer != this->rank()) peers_.push_back(peer);
    }
  }

  // The offset in bytes of `buffer` in this rank's region, where it lies there.
  template <class E>
  std::optional<std::uint64_t> region_offset(std::span<E> buffer) const {
    const std::byte* const region = segment_->region(this->rank());
    const auto* const begin = reinterpret_cast<const std::byte*>(buffer.data());
    const std::less_equal<const std::byte*> at_most;
    if (!at_most(region, begin) ||
        !at_most(begin + buffer.size_bytes(), region + segment_->region_bytes())) {
      return std::nullopt;
    }
    return static_cast<std::uint64_t>(begin - region);
  }

  // The all-reduce of a part of the regions (share_buffer): once every rank has arrived, the
  // owner of chunk j folds it in tree order from every rank's region and writes it into every
  // rank's region, a block at a time while hot; once every rank has arrived again, each holds
  // the whole result, and no peer touches its region any more.
  template <class E>
  void all_reduce_in_region(const Call& call, std::span<E> buffer, std::uint64_t where,
                            ReduceOp op) {
    const detail::SharedSegment& segment = *segment_;
    const std::size_t ranks = static_cast<std::size_t>(this->size());
    meet(call, where);
    const auto mine = detail::chunk(buffer.size(), ranks, static_cast<std::size_t>(this->rank()));
    std::vector<const E*> inputs(ranks);
    std::vector<E*> outputs(ranks);
    for (std::size_t rank = 0; rank < ranks; ++rank) {
      E* const chunk =
          reinterpret_cast<E*>(segment.region(static_cast<int>(rank)) + where) + mine.begin;
      inputs[rank] = chunk;
      outputs[rank] = chunk;
    }
    fold_into<E>(op, inputs, std::span<E* const>(outputs), mine.size());
    meet(call, where);
  }

  // The all-reduce through the segment (top of this file), piece by piece. The pieces alternate
  // between the two slots of each rank, so that one meeting per piece is enough to know that no
  // rank still reads a slot about to be written.
  template <class E>
  void all_reduce_in_segment(const Call& call, std::span<const E> input, std::span<E> output,
                             ReduceOp op) {
    const detail::SharedSegment& segment = *segment_;
    const std::size_t ranks = static_cast<std::size_t>(this->size());
    const int me = this->rank();
    const std::size_t piece_length = segment.slot_bytes() / sizeof(E);
    const auto slot = [&](int set, int rank) {
      return std::span<E>(reinterpret_cast<E*>(segment.slot(set, rank)), piece_length);
    };
    std::vector<const E*> inputs(ranks);
    for (std::size_t offset = 0; offset < output.size(); offset += piece_length) {
      const std::size_t length = std::min(piece_length, output.size() - offset);
      const std::span<const E> piece = input.subspan(offset, length);
      const std::span<E> result = output.subspan(offset, length);
      const int set = static_cast<int>(pieces_++ % 2);
      const std::span<E> own = slot(set, me);
      if (piece.size_bytes() * ranks <= kDirectBytes) {
        std::copy(piece.begin(), piece.end(), own.begin());
        meet(call);
        for (int rank = 0; rank < this->size(); ++rank) {
          inputs[static_cast<std::size_t>(rank)] = slot(set, rank).data();
        }
        device::cpu::reduce_tree<E>(op, inputs, result, leaf_counts_);
        continue;
      }
      // Every chunk but this rank's own goes into its slot; its own it folds from its input.
      const auto mine = detail::chunk(length, ranks, static_cast<std::size_t>(me));
      const auto at = [](auto span, std::size_t index) {
        return span.begin() + static_cast<std::ptrdiff_t>(index);
      };
      std::copy(piece.begin(), at(piece, mine.begin), own.begin());
      std::copy(at(piece, mine.end), piece.end(), at(own, mine.end));
      meet(call);
      for (int rank = 0; rank < this->size(); ++rank) {
        inputs[static_cast<std::size_t>(rank)] =
            (rank == me ? piece.data() : slot(set, rank).data()) + mine.begin;
      }
      E* const folded[] = {result.data() + mine.begin, own.data() + mine.begin};
      fold_into<E>(op, inputs, std::span<E* const>(folded), mine.size());
      meet(call);
      for (int rank = 0; rank < this->size(); ++rank) {
        if (rank == me) continue;
        const auto theirs = detail::chunk(length, ranks, static_cast<std::size_t>(rank));
        const std::span<E> from = slot(set, rank).subspan(theirs.begin, theirs.size());
        std::copy(from.begin(), from.end(), at(result, theirs.begin));
      }
    }
  }

  // Arrives in the segment and waits until every peer has, in the same call, with its buffer at
  // the same place: `where` in its region, or outside it (Stamp::kOutsideRegion).
  void meet(const Call& call, std::uint64_t where = detail::SharedSegment::Stamp::kOutsideRegion) {
    detail::SharedSegment& segment = *segment_;
    const std::uint32_t phase = ++phase_;
    const detail::SharedSegment::Stamp stamp{call.header.sequence, call.header.tag, where};
    segment.arrive(phase, stamp);
    for (const int peer : peers_) {
      if (!segment.spin_for(peer, phase, waiting_.spin)) wait_asleep(call, peer, phase);
      const detail::SharedSegment::Stamp theirs = segment.stamp(peer, phase);
      if (theirs.sequence != stamp.sequence || theirs.tag != stamp.tag) {
        this->mismatched(call, peer,
                         {transport::message_type::kCollective, theirs.sequence, theirs.tag});
      }
      if (theirs.where != where) {
        const auto describe = [](std::uint64_t at) {
          return at == detail::SharedSegment::Stamp::kOutsideRegion
                     ? std::string("a buffer outside its shared buffer")
                     : "byte " + std::to_string(at) + " of its shared buffer";
        };
        this->poison_and_throw(call, peer,
                               "this rank reduces " + describe(where) + " but rank " +
                                   std::to_string(this->job_rank(peer)) + " reduces " +
                                   describe(theirs.where));
      }
    }
  }

  // Sleeps in the segment until `peer` arrives. Between sleeps it fails where the transport says
  // that the peer died, left or called another collective, or where the deadline has passed.
  // Under a timeline the wait is a span of its own (trace::Phase::kPeerWait).
  void wait_asleep(const Call& call, int peer, std::uint32_t phase) {
    detail::SharedSegment& segment = *segment_;
    const auto start = std::chrono::steady_clock::now();
    bool warned = waiting_.stall_warning <= 0;
    while (true) {
      segment.sleep_for(peer, phase);
      if (segment.arrived(peer, phase)) {
        if (trace::Recorder* recorder = trace::current()) {
          trace::record_peer_wait(recorder, start, std::chrono::steady_clock::now(), peer);
        }
        return;
      }
      watch_peers(call);
      const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(
          std::chrono::steady_clock::now() - start);
      const auto waiting_for = [&] {
        return "rank " + std::to_string(this->job_rank(peer)) + " in shared memory, " +
               call.fingerprint.describe();
      };
      if (!warned && static_cast<double>(waited.count()) >=
                         static_cast<double>(waiting_.timeout.count()) * waiting_.stall_warning) {
        warned = true;
        std::fprintf(stderr,
                     "cohort: rank %d: no progress for %lld ms during sequence %llu, waiting for: "
                     "%s; the %s fails at operation_timeout = %lld ms\n",
                     this->job_rank(this->rank()), static_cast<long long>(waited.count()),
                     static_cast<unsigned long long>(call.header.sequence), waiting_for().c_str(),
                     std::string(name(call.fingerprint.operation)).c_str(),
                     static_cast<long long>(waiting_.timeout.count()));
      }
      if (waited >= waiting_.timeout) {
        this->poison_and_throw(call, peer,
                               "no progress within " + std::to_string(waiting_.timeout.count()) +
                                   " ms during sequence " + std::to_string(call.header.sequence) +
                                   ", waiting for: " + waiting_for());
      }
    }
  }

  // Nothing travels over the transport during an all-reduce in the segment, so a frame, or the
  // end of a connection, says why a peer is not coming: it left (and why), it died, or it called
  // another collective. (Only share_host_memory, which requires a Serving transport, engages the
  // segment; this is compiled for every transport.)
  void watch_peers(const Call& call) {
    if constexpr (transport::Serving<T>) {
      int peer = -1;
      try {
        peer = this->transport().wait_any(peers_, std::chrono::milliseconds(0));
      } catch (const CommError& error) {
        this->poison_and_throw(call, error.peer(), std::string(error.detail()));
      }
      if (peer < 0) return;
      const transport::Receive receive{peer, call.header, {}};
      this->transfer(call, {}, {&receive, 1});
      this->fail(call, "rank " + std::to_string(this->job_rank(peer)) +
                           " sent a message during an all-reduce in shared memory");
    }
  }

  // Every rank gets every input and folds them all.
  template <class E>
  void fold_whole_buffers(const Call& call, std::span<const E> input, std::span<E> output,
                          ReduceOp op) {
    const int ranks = this->size();
    const std::size_t length = output.size();
    std::span<E> staging = this->template scratch<E>(static_cast<std::size_t>(ranks) * length);
    std::vector<transport::Send> sends;
    std::vector<transport::Receive> receives;
    std::vector<const E*> inputs(static_cast<std::size_t>(ranks));
    for (int peer = 0; peer < ranks; ++peer) {
      const auto slot = staging.subspan(this->slot(peer, length), length);
      inputs[static_cast<std::size_t>(peer)] = peer == this->rank() ? input.data() : slot.data();
      if (peer == this->rank()) continue;
      sends.push_back({peer, call.header, detail::bytes_of(input)});
      receives.push_back({peer, call.header, detail::writable_bytes_of(slot)});
    }
    this->transfer(call, sends, receives);
    E* const folded[] = {output.data()};
    fold_into<E>(op, inputs, std::span<E* const>(folded), length);
  }

  // One segment of a reduction (fold_and_gather): chunk j of `input` belongs to rank j; this
  // rank folds its own into `owned` (which may alias its chunk of input) and, in an all-reduce,
  // receives every other rank's folded chunk into `gathered` (the segment itself).
  template <class E>
  struct Segment {
    std::span<const E> input;
    std::span<E> owned;
    std::span<E> gathered;
  };

  // Steps `steps` of the algorithm (top of this file) on each of `segments` segments
  // (segment_of(index)), pipelined (staged_pipeline). Steps 0 to n-2 send chunk j of the input to
  // rank j and receive this rank's chunk from every other, one peer each way at a time: at step s
  // to rank + s + 1 and from rank - s - 1. Each rank's link then carries one flow each way, as in
  // a ring, where all at once n-1 senders meet at every receiver: with 4 processes on 2 cores a
  // 16 MiB all-reduce took 27-28 ms that way and 15 ms this way, and on shaped links all at once
  // lost packets (docs/benchmarks.md, "Socket tuning and segments"). The last of them is followed
  // by the fold of this rank's chunk in tree order. Steps n-1 to 2n-3 send the folded chunk to
  // every rank the same way.
  template <class E, class SegmentOf, class Staged = Unstaged>
  void fold_and_gather(const Call& call, std::size_t segments, Steps steps, ReduceOp op,
                       SegmentOf&& segment_of, const BySegment<Staged>& by_segment = {}) {
    const std::size_t ranks = static_cast<std::size_t>(this->size());
    const std::size_t me = static_cast<std::size_t>(this->rank());
    const std::size_t longest = segment_of(0).owned.size() + 1;  // chunks differ by one at most
    const std::span<E> staging = this->template scratch<E>(2 * ranks * longest);
    std::array<std::vector<const E*>, 2> inputs;  // each lane's fold
    std::array<std::array<E*, 1>, 2> outputs{};
    const auto exchange_of = [&](const Segment<E>& segment, std::size_t lane, std::size_t walked,
                                 detail::Exchange& exchange) {
      const std::size_t step = steps.first + walked;
      const auto slot = [&](std::size_t peer) {
        return staging.subspan((lane * ranks + peer) * longest, segment.owned.size());
      };
      const bool folding = step + 1 < ranks;
      const std::size_t shift = (folding ? step : step - (ranks - 1)) + 1;
      const std::size_t to = (me + shift) % ranks;
      const std::size_t from = (me + ranks - shift) % ranks;
      if (folding) {
        const auto theirs = detail::chunk(segment.input.size(), ranks, to);
        exchange = {{static_cast<int>(to), call.header,
                     detail::bytes_of(segment.input.subspan(theirs.begin, theirs.size()))},
                    {static_cast<int>(from), call.header, detail::writable_bytes_of(slot(from))}};
      } else {
        const auto theirs = detail::chunk(segment.gathered.size(), ranks, from);
        exchange = {
            {static_cast<int>(to), call.header,
             detail::bytes_of(std::span<const E>(segment.owned))},
            {static_cast<int>(from), call.header,
             detail::writable_bytes_of(segment.gathered.subspan(theirs.begin, theirs.size()))}};
      }
      if (step + 2 != ranks) return std::size_t{0};  // the fold follows the last folding step
      inputs[lane].resize(ranks);
      for (std::size_t peer = 0; peer < ranks; ++peer) inputs[lane][peer] = slot(peer).data();
      inputs[lane][me] =
          segment.input.data() + detail::chunk(segment.input.size(), ranks, me).begin;
      outputs[lane] = {segment.owned.data()};
      return segment.owned.size();
    };
    const auto fold = [&](std::size_t lane, std::size_t begin, std::size_t length) {
      fold_block<E>(op, inputs[lane], outputs[lane], begin, length, leaf_counts_);
    };
    staged_pipeline(call, segments, steps.count, segment_of, exchange_of, fold, by_segment);
  }

  // The all-reduce over the transport of ranks a power of two (halves_and_doubles; top of this
  // file), on each of `segments` segments (segment_of(index): its input and, as `gathered`, its
  // output), pipelined (staged_pipeline). Steps 0 to log2(n)-1 halve: at step k this rank and the
  // rank 2^k away hold the same part of the segment (held), each keeps one half of it and sends
  // the other, and each folds the half it keeps with the one it receives, the lower rank's
  // on the left: a node of the canonical tree over ranks, of 2^(k+1) of them. Steps log2(n) to
  // 2 log2(n)-1 double, the other way: this rank sends the part it holds to the rank 2^k away
  // and receives that one's, so that both hold the part both held before step k. `steps` says
  // which of them run.
  template <class E, class SegmentOf, class Staged = Unstaged>
  void halve_and_double(const Call& call, std::size_t segments, Steps steps, ReduceOp op,
                        SegmentOf&& segment_of, const BySegment<Staged>& by_segment = {}) {
    const std::size_t me = static_cast<std::size_t>(this->rank());
    const std::size_t levels = SegmentLayout::levels(static_cast<std::size_t>(this->size()));
    const auto held = &Deterministic::halved_part;
    const std::size_t longest = held(1, segment_of(0).input.size(), 1).size();  // the larger half
    const std::span<E> staging = this->template scratch<E>(2 * longest);
    struct Fold {
      std::array<const E*, 2> pair;  // left, right
      std::array<E*, 1> output;
    };
    std::array<Fold, 2> folds{};  // each lane's
    const auto exchange_of = [&](const Segment<E>& segment, std::size_t lane, std::size_t walked,
                                 detail::Exchange& exchange) {
      const std::size_t step = steps.first + walked;
      const std::size_t length = segment.input.size();
      const bool halving = step < levels;
      const std::size_t k = halving ? step : 2 * levels - 1 - step;
      const std::size_t peer = me ^ (std::size_t{1} << k);
      const detail::Chunk mine = held(me, length, k + 1);
      const detail::Chunk theirs = held(peer, length, k + 1);
      if (!halving) {
        exchange = {
            {static_cast<int>(peer), call.header,
             detail::bytes_of(
                 std::span<const E>(segment.gathered.subspan(mine.begin, mine.size())))},
            {static_cast<int>(peer), call.header,
             detail::writable_bytes_of(segment.gathered.subspan(theirs.begin, theirs.size()))}};
        return std::size_t{0};
      }
      // The first halving sends from the input; the later ones what the earlier folded.
      const std::span<const E> source = step == 0 ? segment.input : segment.gathered;
      const std::span<E> received = staging.subspan(lane * longest, mine.size());
      exchange = {{static_cast<int>(peer), call.header,
                   detail::bytes_of(source.subspan(theirs.begin, theirs.size()))},
                  {static_cast<int>(peer), call.header, detail::writable_bytes_of(received)}};
      const E* const kept = source.data() + mine.begin;
      folds[lane] = {.pair = me < peer ? std::array<const E*, 2>{kept, received.data()}
                                       : std::array<const E*, 2>{received.data(), kept},
                     .output = {segment.gathered.data() + mine.begin}};
      return mine.size();
    };
    const auto fold = [&](std::size_t lane, std::size_t begin, std::size_t length) {
      fold_block<E>(op, folds[lane].pair, folds[lane].output, begin, length, {});
    };
    staged_pipeline(call, segments, steps.count, segment_of, exchange_of, fold, by_segment);
  }

  // `steps` steps of an algorithm on each of `segments` segments (segment_of(index)), pipelined
  // (detail::OverTransport::pipeline): exchange_of(segment, lane, step, exchange) fills a step's
  // exchange and returns how many elements of work on what it receives follow it, work(lane,
  // begin, length) does a block of that work.
  // A segment of an all-reduce enters `by_segment` before its first step and leaves it after
  // its last: the first two before the pipeline starts; after that, as the work that
  // follows a segment's last step (where the algorithm has none), which leaves that segment and
  // enters the one two after it (its lane's next), while the other lane's frames travel.
  template <class SegmentOf, class ExchangeOf, class Work, class Staged>
  void staged_pipeline(const Call& call, std::size_t segments, std::size_t steps,
                       SegmentOf& segment_of, ExchangeOf& exchange_of, Work& work,
                       const BySegment<Staged>& by_segment) {
    const auto length_of = [&](std::size_t index) {
      return index < segments ? segment_of(index).input.size() : std::size_t{0};
    };
    if constexpr (BySegment<Staged>::kStages) {
      for (std::size_t index = 0; index < std::min<std::size_t>(2, segments); ++index) {
        by_segment.enters(index, 0, length_of(index));
      }
    }
    std::array<std::size_t, 2> ended{};  // each lane's segment whose last step ended
    std::array<bool, 2> stage_work{};    // whether its work enters and leaves, not the algorithm's
    const auto exchange = [&](std::size_t index, std::size_t lane, std::size_t step,
                              detail::Exchange& into) {
      const std::size_t count = exchange_of(segment_of(index), lane, step, into);
      stage_work[lane] = false;
      if constexpr (BySegment<Staged>::kStages) {
        if (step + 1 == steps) {
          stage_work[lane] = true;
          ended[lane] = index;
          return length_of(index) + length_of(index + 2);
        }
      }
      return count;
    };
    const auto staged_work = [&](std::size_t lane, std::size_t begin, std::size_t length) {
      if (!stage_work[lane]) {
        work(lane, begin, length);
        return;
      }
      const std::size_t leaving = length_of(ended[lane]);
      if (begin < leaving) {
        const std::size_t part = std::min(length, leaving - begin);
        by_segment.leaves(ended[lane], begin, part);
        begin += part;
        length -= part;
      }
      if (length > 0) by_segment.enters(ended[lane] + 2, begin - leaving, length);
    };
    this->pipeline(call, segments, steps, exchange, staged_work);
  }

  // Each of `outputs` = the canonical-tree fold of `count` elements of inputs, where an output
  // may alias an input, a block at a time (fold_block).
  template <class E>
  void fold_into(ReduceOp op, std::span<const E* const> inputs, std::span<E* const> outputs,
                 std::size_t count) const {
    for (std::size_t begin = 0; begin < count; begin += Base::kWorkBlock) {
      fold_block<E>(op, inputs, outputs, begin, std::min(Base::kWorkBlock, count - begin),
                    leaf_counts_);
    }
  }

  // Elements [begin, begin + length) of fold_into, length at most a work block, the inputs as
  // nodes of `leaf_counts` leaves (empty: one each): folded straight into the first output where
  // no output overlaps an input (an out-of-place all-reduce), else into a small buffer, copied
  // out while hot, so the fold costs no extra pass over memory.
  template <class E>
  void fold_block(ReduceOp op, std::span<const E* const> inputs, std::span<E* const> outputs,
                  std::size_t begin, std::size_t length,
                  std::span<const std::size_t> leaf_counts) const {
    thread_local std::vector<E> block(Base::kWorkBlock);
    thread_local std::vector<const E*> offset;
    offset.resize(inputs.size());
    for (std::size_t i = 0; i < inputs.size(); ++i) offset[i] = inputs[i] + begin;
    const auto overlaps_an_input = [&](const E* output) {
      return std::any_of(offset.begin(), offset.end(), [&](const E* input) {
        return std::less<>{}(input, output + length) && std::less<>{}(output, input + length);
      });
    };
    const bool direct =
        !outputs.empty() && std::none_of(outputs.begin(), outputs.end(), [&](const E* output) {
          return overlaps_an_input(output + begin);
        });
    E* const folded = direct ? outputs.front() + begin : block.data();
    device::cpu::reduce_tree<E>(op, offset, std::span<E>(folded, length), leaf_counts);
    for (E* const output : outputs) {
      if (output + begin != folded) std::copy_n(folded, length, output + begin);
    }
  }

  // A rounded sum's all-reduce over the transport (core/reduce_op.hpp): every node of its tree is
  // a value of the format, so it travels in 2 bytes an element, through `packed`.
  // The float buffer is rounded into `packed` and widened back a segment at a time, each while
  // the other segment's frames travel (fold_and_gather). Between 4 hosts at 1 Gbit/s, where half
  // the bytes make 0.5x float's time, that took the bfloat16 all-reduce of 16 and 64 MiB from
  // 0.57-0.59x to 0.52-0.56x, against one pass before the first transfer and one after the last
  // (docs/benchmarks.md, "Gradients in bfloat16 between hosts").
  // A part enters `staged` before it is rounded and leaves it once widened.
  template <class Narrow, class Staged>
  void reduce_packed(const Call& call, std::span<const float> input, std::span<float> output,
                     ReduceOp op, std::vector<Narrow>& packed, const Staged& staged) {
    if (packed.size() < output.size()) packed.resize(output.size());
    const std::span<Narrow> wire(packed.data(), output.size());
    struct Packing {
      std::span<const float> input;
      std::span<Narrow> wire;
      std::span<float> output;
      const Staged* staged;
      void enters(std::size_t begin, std::size_t length) const {
        staged->enters(begin, length);
        std::ranges::transform(input.subspan(begin, length), wire.subspan(begin, length).begin(),
                               &Narrow::round);
      }
      void leaves(std::size_t begin, std::size_t length) const {
        std::ranges::transform(wire.subspan(begin, length), output.subspan(begin, length).begin(),
                               [](Narrow value) { return value.widen(); });
        staged->leaves(begin, length);
      }
    };
    reduce_over_transport<Narrow>(call, wire, wire, op, Packing{input, wire, output, &staged});
  }

  std::vector<std::size_t> leaf_counts_;  // set_leaf_counts; empty: one each
  std::vector<Bfloat16> packed_bfloat16_;  // a kSumBfloat16 all-reduce's buffer on the wire
  std::vector<Float16> packed_float16_;    // a kSumFloat16 one's
  std::optional<detail::SharedSegment> segment_;
  Waiting waiting_{};
  std::vector<int> peers_;    // every rank but this one
  std::uint32_t phase_ = 0;   // arrivals in the segment so far
  std::uint64_t pieces_ = 0;  // pieces reduced in the segment so far: their parity picks the slot
  // share_host_memory's groups where the ranks are on several hosts.
  std::conditional_t<kSplitsByHost, std::unique_ptr<ByHost>, std::nullptr_t> by_host_{};
};

// Checked over the in-process transport; any transport::Transport gives a Communicator the same
// way.
static_assert(Communicator<Deterministic<transport::Loopback::Endpoint>>);
static_assert(FoldsNodes<Deterministic<transport::Loopback::Endpoint>>);

}  // namespace cohort::collective
