// collective::Local: the collectives of a group whose ranks are threads of one process.
//
// What it is
//   Local is the collective policy for replicas that share an address space, one thread per rank.
//   A collective moves data directly between the ranks' own buffers: every rank publishes its
//   buffer pointers, then works on its own slice of the element range, reading that slice from
//   every rank's buffer and writing the result into every rank's buffer. Each buffer is read once
//   and written once, so an all-reduce moves 2 x ranks x bytes, the least an in-place all-reduce
//   can move. Reductions combine ranks in the canonical tree of core/reduction_tree.hpp through
//   device::cpu::reduce_tree: every rank gets the same bits, equal to that tree computed anywhere
//   else.
//
//     collective::Local local({.ranks = 4, .timeout = std::chrono::seconds(30)});
//     // in the thread that runs rank r:
//     collective::LocalCommunicator comm = local.communicator(r);
//     comm.all_reduce(std::span(gradients), ReduceOp::kSum);
//
//   Operations and their semantics are those of collective/collective.hpp, for float, double,
//   std::int32_t and std::int64_t elements.
//
// Required of the caller
//   - Every rank calls the same collectives in the same order, with the same element type, length,
//     operation and root. Checked on every call: a mismatch is a CommError on every rank naming
//     two ranks and what each called, e.g. "rank 1 called all_reduce(float, 7, sum) #3 but
//     rank 0 called broadcast(float, 7, root 0) #3".
//   - Shapes: all_gather needs output.size() == size() * input.size(), reduce_scatter needs
//     input.size() == size() * output.size(), broadcast needs 0 <= root < size(). Checked: the
//     caller gets a CommError and the group is poisoned, so no other rank waits for it.
//   - Buffers stay alive, and are touched by nobody else, until the call returns or throws: other
//     ranks read and write them during the call. Buffers of different ranks do not overlap. Within
//     a rank, all_gather's input may be this rank's own chunk of its output, and reduce_scatter's
//     output may be this rank's own chunk of its input (the in-place forms); no other overlap.
//
// Thread-safety
//   Local::communicator may be called from any thread, any number of times. A communicator is
//   used by one thread at a time, except abort(), which any thread may call at any time, also
//   while the rank's own thread waits in a collective. Local and its communicators share the group
//   state, so they may be destroyed in any order.
//
// Timeout and failure
//   A rank that waits longer than Options::timeout for the others throws CommError naming itself,
//   the operation, its sequence number (that rank's count of collective calls, from 1) and the
//   ranks that have not arrived. Any CommError and any abort() poison the group: every call of
//   every rank that is waiting or comes later throws CommError naming the first cause; no call
//   hangs and none returns wrong data. Once every rank has arrived, a collective finishes moving
//   its data before any rank returns or throws, so no rank ever reads a buffer that its owner has
//   already been told it may free.
//
// Waiting
//   Ranks meet at a generation-counting barrier (two per data collective: publish, then finish;
//   one per barrier()). A waiting rank spins with a pause instruction for a few microseconds
//   (only when there are no more ranks than hardware threads), then yields for up to 100 us, then
//   sleeps on a condition variable until the deadline.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "cohort/collective/collective.hpp"
#include "cohort/collective/fingerprint.hpp"
#include "cohort/core/error.hpp"
#include "cohort/core/options.hpp"
#include "cohort/core/reduce_op.hpp"
#include "cohort/core/reduction_tree.hpp"
#include "cohort/core/spin.hpp"
#include "cohort/device/cpu.hpp"

namespace cohort::collective {

namespace detail::local {

// Elements per block that a rank reduces into its scratch before writing the block to every
// rank's buffer: the scratch and one block of every input stay in L1/L2.
inline constexpr std::size_t kBlock = 4 * device::cpu::kReduceBlock;

// Slices start at multiples of this many elements (a multiple of a cache line for every element
// type), so two ranks never write into the same cache line of a buffer that starts on one.
inline constexpr std::size_t kSliceGrain = 64;

// How long a waiting rank spins (spin.hpp) before it sleeps on the condition variable.
inline constexpr std::chrono::microseconds kSpin{100};

// What one rank asked for in one call, and which of its calls it is.
struct Fingerprint {
  collective::Fingerprint call;
  std::uint64_t sequence = 0;

  friend bool operator==(const Fingerprint&, const Fingerprint&) = default;
};

// "all_reduce(float, 7, sum) #3", "broadcast(float, 7, root 0) #3", "barrier() #3"
inline std::string describe(const Fingerprint& f) {
  return f.call.describe() + " #" + std::to_string(f.sequence);
}

// Where a rank is, for error messages.
struct Site {
  int rank = 0;
  Operation operation = Operation::kBarrier;
  std::uint64_t sequence = 0;
};

// What one rank published for one call: its fingerprint and its buffers.
struct Call {
  Fingerprint fingerprint;
  const void* input = nullptr;
  void* output = nullptr;
};

// The part [first, last) of [0, length) that `rank` of `ranks` works on: contiguous, balanced to
// within one grain, starting on a grain boundary.
inline std::pair<std::size_t, std::size_t> slice(std::size_t length, int ranks, int rank) {
  const std::size_t grains = (length + kSliceGrain - 1) / kSliceGrain;
  const auto bound = [&](int r) {
    return std::min(length, grains * static_cast<std::size_t>(r) / static_cast<std::size_t>(ranks) *
                                kSliceGrain);
  };
  return {bound(rank), bound(rank + 1)};
}

inline bool overlaps(const void* a, std::size_t a_bytes, const void* b, std::size_t b_bytes) {
  const auto a0 = reinterpret_cast<std::uintptr_t>(a);
  const auto b0 = reinterpret_cast<std::uintptr_t>(b);
  return a_bytes > 0 && b_bytes > 0 && a0 < b0 + b_bytes && b0 < a0 + a_bytes;
}

// The state every rank of one Local group shares: published calls, the barrier and the poison.
class Group {
 public:
  // Whether a rank that waits at a barrier may leave it when the group is poisoned. Before a
  // collective's data phase it may (nobody reads its buffers yet); after, it must stay until every
  // rank has finished reading and writing.
  enum class Exit : std::uint8_t { kOnPoison, kWhenAllArrive };

  Group(int ranks, std::chrono::milliseconds timeout, std::vector<std::size_t> leaf_counts)
      : ranks_(ranks),
        timeout_(timeout),
        rank_(std::make_unique<Rank[]>(static_cast<std::size_t>(ranks))),
        leaf_counts_(std::move(leaf_counts)) {
    const bool own_cpus = static_cast<unsigned>(ranks) <= std::thread::hardware_concurrency();
    for (int r = 0; r < ranks; ++r) rank_[r].spin = waiting::Spinner(own_cpus);
  }

  int size() const { return ranks_; }
  std::span<const std::size_t> leaf_counts() const { return leaf_counts_; }

  // Counts one more call of `rank` and returns where it is; throws if the group is poisoned.
  Site begin(int rank, Operation operation) {
    const Site site{rank, operation, ++rank_[rank].sequence};
    if (poisoned_.load(std::memory_order_acquire)) throw abandoned(site);
    return site;
  }

  // Publishes `call` for the others, waits for every rank to publish, and checks that they all
  // publish the same fingerprint. Returns with every rank's call readable through published().
  void publish(const Site& site, const Call& call) {
    rank_[site.rank].calls[parity(site.sequence)] = call;
    arrive_and_wait(site, Exit::kOnPoison);
    const Fingerprint& first = rank_[0].calls[parity(site.sequence)].fingerprint;
    for (int r = 1; r < ranks_; ++r) {
      const Fingerprint& other = rank_[r].calls[parity(site.sequence)].fingerprint;
      if (other == first) continue;
      std::string detail = "rank " + std::to_string(r) + " called " + describe(other) +
                           " but rank 0 called " + describe(first);
      poison(detail, r);
      throw failure(site, site.rank == r ? 0 : r, std::move(detail));
    }
  }

  // Rank `rank`'s call with this sequence number; valid between publish() and finish().
  const Call& published(int rank, std::uint64_t sequence) const {
    return rank_[rank].calls[parity(sequence)];
  }

  // Closes a call whose data phase ran: waits until every rank has finished reading and writing,
  // then throws if the group was poisoned meanwhile (an abort, or a rank whose data phase failed).
  void finish(const Site& site) {
    arrive_and_wait(site, Exit::kWhenAllArrive);
    if (poisoned_.load(std::memory_order_acquire)) throw abandoned(site);
  }

  // Makes every waiting and later call of every rank throw, naming `cause` and the rank to blame
  // (`culprit`, -1 when none is); the first cause wins.
  void poison(std::string cause, int culprit) {
    {
      const std::lock_guard lock(mutex_);
      if (!poisoned_.load(std::memory_order_relaxed)) {
        cause_ = std::move(cause);
        culprit_ = culprit;
        poisoned_.store(true);
      }
    }
    wake_.notify_all();
  }

  // A failure of the call at `site`; `peer` is the other rank to blame, -1 when none is.
  static CommError failure(const Site& site, int peer, std::string detail) {
    return CommError({.rank = site.rank,
                      .peer = peer,
                      .operation = std::string(name(site.operation)),
                      .sequence = site.sequence,
                      .detail = std::move(detail)});
  }

 private:
  struct alignas(waiting::kCacheLine) Rank {
    // Indexed by the parity of the sequence number: a rank that has left a barrier may publish its
    // next call while a slower rank still reads this one.
    Call calls[2];
    std::uint64_t sequence = 0;              // written and read by the rank's own thread only
    std::atomic<std::uint64_t> barriers{0};  // barriers it has arrived at; names missing ranks
    waiting::Spinner spin{false};            // the rank's own thread's
  };

  static std::size_t parity(std::uint64_t sequence) { return sequence & 1; }

  // The barrier word: generation in the high 32 bits, ranks arrived in this generation in the low.
  static std::uint32_t generation(std::uint64_t word) {
    return static_cast<std::uint32_t>(word >> 32);
  }
  static std::uint64_t arrived(std::uint64_t word) { return word & 0xffffffffu; }

  CommError abandoned(const Site& site) {
    const std::lock_guard lock(mutex_);
    return failure(site, culprit_ == site.rank ? -1 : culprit_, "abandoned because " + cause_);
  }

  CommError timed_out(const Site& site, std::uint64_t barrier) const {
    std::vector<int> missing;
    for (int r = 0; r < ranks_; ++r) {
      if (rank_[r].barriers.load(std::memory_order_relaxed) < barrier) missing.push_back(r);
    }
    std::ostringstream out;
    out << "timed out after " << timeout_.count() << " ms waiting for ";
    if (missing.empty()) out << "the other ranks";
    if (missing.size() == 1) out << "rank " << missing[0];
    if (missing.size() > 1) {
      out << "ranks ";
      for (std::size_t i = 0; i < missing.size(); ++i) out << (i ? ", " : "") << missing[i];
    }
    return failure(site, missing.size() == 1 ? missing[0] : -1, out.str());
  }

  // Takes this rank's arrival back if the barrier of generation `gen` has not completed. Returns
  // false when it has: then every rank is committed to the call and this one must carry on.
  bool withdraw(std::uint32_t gen) {
    std::uint64_t word = barrier_.load();
    while (generation(word) == gen) {
      if (barrier_.compare_exchange_weak(word, word - 1)) return true;
    }
    return false;
  }

  void arrive_and_wait(const Site& site, Exit exit) {
    Rank& me = rank_[site.rank];
    const std::uint64_t barrier = me.barriers.load(std::memory_order_relaxed) + 1;
    me.barriers.store(barrier, std::memory_order_relaxed);

    // Arrive. The read-modify-writes on barrier_ chain every rank's published call to whoever
    // sees the generation change.
    std::uint64_t word = barrier_.load(std::memory_order_relaxed);
    std::uint64_t next = 0;
    do {
      next = arrived(word) + 1 == static_cast<std::uint64_t>(ranks_)
                 ? (static_cast<std::uint64_t>(generation(word)) + 1) << 32
                 : word + 1;
    } while (!barrier_.compare_exchange_weak(word, next));
    if (arrived(next) == 0) {
      // Last to arrive. A sleeper registers before it re-checks the barrier under the mutex, so
      // either it sees the new generation or we see it and notify after taking the mutex.
      if (sleepers_.load() > 0) {
        { const std::lock_guard lock(mutex_); }
        wake_.notify_all();
      }
      return;
    }

    const std::uint32_t gen = generation(word);
    const auto passed = [&] { return generation(barrier_.load()) != gen; };
    const auto may_leave = [&] { return exit == Exit::kOnPoison && poisoned_.load(); };
    const auto start = std::chrono::steady_clock::now();
    enum class Outcome : std::uint8_t { kPassed, kPoisoned, kTimedOut } outcome = Outcome::kPassed;
    if (me.spin.until([&] { return passed() || may_leave(); }, kSpin) && passed()) {
      return;
    }
    {
      const auto deadline = start + timeout_;
      sleepers_.fetch_add(1);
      std::unique_lock lock(mutex_);
      for (;;) {
        if (passed()) {
          outcome = Outcome::kPassed;
          break;
        }
        if (may_leave()) {
          outcome = Outcome::kPoisoned;
          break;
        }
        if (std::chrono::steady_clock::now() >= deadline) {
          outcome = Outcome::kTimedOut;
          break;
        }
        wake_.wait_until(lock, deadline);
      }
      sleepers_.fetch_sub(1);
    }
    if (outcome == Outcome::kPassed || !withdraw(gen)) return;
    if (outcome == Outcome::kPoisoned) throw abandoned(site);
    const CommError error = timed_out(site, barrier);
    poison(error.what(), error.peer());
    throw error;
  }

  const int ranks_;
  const std::chrono::milliseconds timeout_;
  std::unique_ptr<Rank[]> rank_;
  const std::vector<std::size_t> leaf_counts_;

  alignas(waiting::kCacheLine) std::atomic<std::uint64_t> barrier_{0};
  alignas(waiting::kCacheLine) std::atomic<int> sleepers_{0};
  std::atomic<bool> poisoned_{false};
  std::mutex mutex_;
  std::condition_variable wake_;
  std::string cause_;  // guarded by mutex_
  int culprit_ = -1;   // guarded by mutex_
};

// Per-communicator buffers for one element type, sized before a call commits so that the data
// phase allocates nothing.
template <class T>
struct Workspace {
  std::vector<const T*> inputs;  // every rank's published input
  std::vector<T*> outputs;       // every rank's published output
  std::vector<const T*> leaves;  // the inputs at the current block, for reduce_tree
  std::vector<T> scratch;        // one reduced block

  void prepare(int ranks) {
    const auto n = static_cast<std::size_t>(ranks);
    if (inputs.size() == n) return;
    inputs.resize(n);
    outputs.resize(n);
    leaves.resize(n);
    scratch.resize(kBlock);
  }
};

}  // namespace detail::local

class Local;

// One rank's handle on a Local group; satisfies collective::Communicator. Obtained from
// Local::communicator(rank). Movable, not copyable.
class LocalCommunicator {
 public:
  LocalCommunicator(LocalCommunicator&&) noexcept = default;
  LocalCommunicator& operator=(LocalCommunicator&&) noexcept = default;

  int rank() const { return rank_; }
  int size() const { return group_->size(); }

  // In place: every rank ends with the canonical-tree reduction of every rank's buffer.
  template <class T>
  void all_reduce(std::span<T> buffer, ReduceOp op) {
    all_reduce(std::span<const T>(buffer), buffer, op);
  }

  // Out of place (collective.hpp): every rank reads every input and writes its own output.
  template <class T>
  void all_reduce(std::span<const std::type_identity_t<T>> input, std::span<T> output,
                  ReduceOp op) {
    check_element<T>();
    auto& w = workspace<T>();  // allocates (first use) before the call is counted
    w.prepare(size());
    const detail::local::Site site = group_->begin(rank_, Operation::kAllReduce);
    for (const std::string& problem :
         {out_of_place_problem(input, std::span<const T>(output)), reduction_problem<T>(op)}) {
      if (!problem.empty()) fail(site, problem);
    }
    group_->publish(
        site,
        {{{Operation::kAllReduce, data_type_of<T>(), static_cast<std::uint16_t>(op), output.size()},
          site.sequence},
         input.data(),
         output.data()});
    if (size() == 1 || output.empty()) {
      copy_unless_same(input, output);
      return;
    }
    run_data_phase(site, [&] {
      gather_pointers(w, site);
      const auto [first, last] = detail::local::slice(output.size(), size(), rank_);
      for (std::size_t offset = first; offset < last; offset += detail::local::kBlock) {
        const std::size_t count = std::min(detail::local::kBlock, last - offset);
        for (int r = 0; r < size(); ++r) w.leaves[r] = w.inputs[r] + offset;
        device::cpu::reduce_tree<T>(op, w.leaves, std::span<T>(w.scratch.data(), count),
                                    group_->leaf_counts());
        for (T* destination : w.outputs) {
          std::copy_n(w.scratch.data(), count, destination + offset);
        }
      }
    });
  }

  // Every rank ends with root's buffer.
  template <class T>
  void broadcast(std::span<T> buffer, int root) {
    check_element<T>();
    auto& w = workspace<T>();  // allocates (first use) before the call is counted
    w.prepare(size());
    const detail::local::Site site = group_->begin(rank_, Operation::kBroadcast);
    if (root < 0 || root >= size()) {
      fail(site, "called broadcast with root " + std::to_string(root) + " in a group of " +
                     std::to_string(size()) + " ranks");
    }
    group_->publish(site, {{{Operation::kBroadcast, data_type_of<T>(),
                             static_cast<std::uint16_t>(root), buffer.size()},
                            site.sequence},
                           buffer.data(),
                           buffer.data()});
    if (size() == 1 || buffer.empty()) return;
    run_data_phase(site, [&] {
      gather_pointers(w, site);
      const auto [first, last] = detail::local::slice(buffer.size(), size(), rank_);
      for (std::size_t offset = first; offset < last; offset += detail::local::kBlock) {
        const std::size_t count = std::min(detail::local::kBlock, last - offset);
        for (int r = 0; r < size(); ++r) {
          if (r != root) std::copy_n(w.inputs[root] + offset, count, w.outputs[r] + offset);
        }
      }
    });
  }

  // output.size() == size() * input.size(); output holds rank 0's input, then rank 1's, ...
  template <class T>
  void all_gather(std::span<const std::type_identity_t<T>> input, std::span<T> output) {
    check_element<T>();
    auto& w = workspace<T>();  // allocates (first use) before the call is counted
    w.prepare(size());
    const detail::local::Site site = group_->begin(rank_, Operation::kAllGather);
    const std::size_t chunk = input.size();
    if (output.size() != static_cast<std::size_t>(size()) * chunk) {
      fail(site, "called all_gather with " + std::to_string(chunk) + " input and " +
                     std::to_string(output.size()) + " output elements; the output needs " +
                     std::to_string(size()) + " x " + std::to_string(chunk));
    }
    group_->publish(site, {{{Operation::kAllGather, data_type_of<T>(), 0, chunk}, site.sequence},
                           input.data(),
                           output.data()});
    if (chunk == 0) return;
    run_data_phase(site, [&] {
      gather_pointers(w, site);
      // This rank's slice of the output index space, copied from whichever inputs it covers.
      const auto [first, last] = detail::local::slice(output.size(), size(), rank_);
      for (std::size_t i = first; i < last;) {
        const std::size_t source = i / chunk;
        const std::size_t count =
            std::min({last, (source + 1) * chunk, i + detail::local::kBlock}) - i;
        const T* from = w.inputs[source] + (i - source * chunk);
        for (T* to : w.outputs) {
          if (to + i != from) std::copy_n(from, count, to + i);  // in place: already there
        }
        i += count;
      }
    });
  }

  // input.size() == size() * output.size(); rank r receives the reduction of chunk r.
  template <class T>
  void reduce_scatter(std::span<const std::type_identity_t<T>> input, std::span<T> output,
                      ReduceOp op) {
    check_element<T>();
    auto& w = workspace<T>();  // allocates (first use) before the call is counted
    w.prepare(size());
    const detail::local::Site site = group_->begin(rank_, Operation::kReduceScatter);
    const std::size_t chunk = output.size();
    if (input.size() != static_cast<std::size_t>(size()) * chunk) {
      fail(site, "called reduce_scatter with " + std::to_string(input.size()) + " input and " +
                     std::to_string(chunk) + " output elements; the input needs " +
                     std::to_string(size()) + " x " + std::to_string(chunk));
    }
    if (const std::string problem = reduction_problem<T>(op); !problem.empty()) fail(site, problem);
    group_->publish(
        site,
        {{{Operation::kReduceScatter, data_type_of<T>(), static_cast<std::uint16_t>(op), chunk},
          site.sequence},
         input.data(),
         output.data()});
    if (chunk == 0) return;
    run_data_phase(site, [&] {
      gather_pointers(w, site);
      // Each rank reduces its own chunk straight from every input: inputs read once in all.
      const std::size_t offset = static_cast<std::size_t>(rank_) * chunk;
      bool aliased = false;
      for (int r = 0; r < size(); ++r) {
        w.leaves[r] = w.inputs[r] + offset;
        aliased = aliased || detail::local::overlaps(w.leaves[r], chunk * sizeof(T), output.data(),
                                                     chunk * sizeof(T));
      }
      if (!aliased) {
        device::cpu::reduce_tree<T>(op, w.leaves, output, group_->leaf_counts());
        return;
      }
      // In place: reduce_tree may not write over an input, so go block by block via scratch.
      for (std::size_t done = 0; done < chunk; done += detail::local::kBlock) {
        const std::size_t count = std::min(detail::local::kBlock, chunk - done);
        for (int r = 0; r < size(); ++r) w.leaves[r] = w.inputs[r] + offset + done;
        device::cpu::reduce_tree<T>(op, w.leaves, std::span<T>(w.scratch.data(), count),
                                    group_->leaf_counts());
        std::copy_n(w.scratch.data(), count, output.data() + done);
      }
    });
  }

  // `count` elements of this rank's own, for the sharded update (strategy/detail/
  // mirrored_replica.hpp) to keep the gradient sum in and gather parameters from
  // (gather_shared_stripes); nothing in a group of one, or for fewer than kShareMinimumBytes.
  // Lives until the next call or the communicator's end.
  template <class T>
  SharedBuffer<T> share_buffer(std::size_t count) {
    check_element<T>();
    if (size() == 1 || count * sizeof(T) < kShareMinimumBytes) return {};
    shared_ = std::make_unique<std::byte[]>(count * sizeof(T));
    return {.values = std::span<T>(reinterpret_cast<T*>(shared_.get()), count)};
  }

  // The all-gather of a buffer striped over the ranks: stripe k of `part` (elements
  // [k x stripe, (k + 1) x stripe)) belongs to rank k mod size(), which has written it there and
  // into its own `into`; each rank copies its stripes from its part into every other rank's
  // `into`, so that every `into` ends whole. A collective.
  template <class T>
  void gather_shared_stripes(std::span<const T> part, std::span<T> into, std::size_t stripe) {
    check_element<T>();
    auto& w = workspace<T>();  // allocates (first use) before the call is counted
    w.prepare(size());
    const detail::local::Site site = group_->begin(rank_, Operation::kAllGather);
    if (into.size() != part.size() || stripe == 0) {
      fail(site, "called gather_shared_stripes with " + std::to_string(part.size()) + " and " +
                     std::to_string(into.size()) + " elements in stripes of " +
                     std::to_string(stripe) +
                     ": it needs buffers of one length and stripes of at least one element");
    }
    group_->publish(site,
                    {{{Operation::kAllGather, data_type_of<T>(), 0, part.size()}, site.sequence},
                     part.data(),
                     into.data()});
    if (part.empty()) return;
    run_data_phase(site, [&] {
      gather_pointers(w, site);
      const std::size_t stride = stripe * static_cast<std::size_t>(size());
      for (std::size_t begin = static_cast<std::size_t>(rank_) * stripe; begin < part.size();
           begin += stride) {
        const std::size_t count = std::min(stripe, part.size() - begin);
        for (int r = 0; r < size(); ++r) {
          if (r != rank_) std::copy_n(part.data() + begin, count, w.outputs[r] + begin);
        }
      }
    });
  }

  // Below this many bytes of parameters an update shared out costs more than it saves: the gather
  // is one more meeting of the threads a step. On 2 replicas of 2 cores, Mirrored trained an MLP
  // of 9,226 parameters 5-6% slower that way, one of 36,874 15-20% faster, and the examples' MLP
  // 784-1024-1024-10 29% faster (docs/benchmarks.md, "Processes of one host").
  static constexpr std::size_t kShareMinimumBytes = std::size_t{64} << 10;

  // Every rank is this process's: gather_shared_stripes reaches all of them.
  bool stripes_reach_every_rank() const { return true; }
  std::optional<StripeGroup> stripe_group() const {
    return StripeGroup{.place = static_cast<std::size_t>(rank()),
                       .size = static_cast<std::size_t>(size())};
  }

  void barrier() {
    const detail::local::Site site = group_->begin(rank_, Operation::kBarrier);
    group_->publish(site, {{{Operation::kBarrier}, site.sequence}, nullptr, nullptr});
  }

  // Makes every collective of every rank, waiting now or called later, throw CommError
  // "... abandoned because rank R aborted: reason", whose peer() is R. Any thread may call it.
  void abort(std::string_view reason) {
    group_->poison("rank " + std::to_string(rank_) + " aborted: " + std::string(reason), rank_);
  }

 private:
  friend class Local;

  LocalCommunicator(std::shared_ptr<detail::local::Group> group, int rank)
      : group_(std::move(group)), rank_(rank) {}

  template <class T>
  static void check_element() {
    static_assert(
        is_element<T>,
        "collective::Local moves float, double, std::int32_t or std::int64_t elements; "
        "all_reduce in place and broadcast write their buffer, so pass a mutable std::span<T>");
  }

  template <class T>
  detail::local::Workspace<T>& workspace() {
    return std::get<detail::local::Workspace<T>>(workspaces_);
  }

  template <class T>
  void gather_pointers(detail::local::Workspace<T>& w, const detail::local::Site& site) const {
    for (int r = 0; r < size(); ++r) {
      const detail::local::Call& call = group_->published(r, site.sequence);
      w.inputs[r] = static_cast<const T*>(call.input);
      w.outputs[r] = static_cast<T*>(call.output);
    }
  }

  // A failure of this rank alone (a bad argument): poison the group so nobody waits for us.
  [[noreturn]] void fail(const detail::local::Site& site, std::string what) {
    const CommError error = detail::local::Group::failure(site, -1, std::move(what));
    group_->poison(error.what(), rank_);
    throw error;
  }

  // Runs this rank's share of the data movement, then waits until every rank has finished its
  // share. Every rank is committed once publish() returns: even a failure here must arrive at
  // the closing barrier, or another rank could still be reading buffers whose owner has returned.
  template <class Work>
  void run_data_phase(const detail::local::Site& site, Work&& work) {
    try {
      work();
    } catch (const std::exception& e) {
      group_->poison("rank " + std::to_string(rank_) + " failed in " +
                         std::string(name(site.operation)) + " #" + std::to_string(site.sequence) +
                         ": " + e.what(),
                     rank_);
    }
    group_->finish(site);
  }

  std::shared_ptr<detail::local::Group> group_;
  int rank_;
  std::unique_ptr<std::byte[]> shared_;  // share_buffer's
  std::tuple<detail::local::Workspace<float>, detail::local::Workspace<double>,
             detail::local::Workspace<std::int32_t>, detail::local::Workspace<std::int64_t>>
      workspaces_;
};

static_assert(Communicator<LocalCommunicator>);

// The policy: a group of `ranks` threads in this process.
class Local {
 public:
  struct Options {
    // Number of ranks (threads) in the group; >= 1.
    int ranks = 0;
    // How long a rank waits for the others in one collective before it throws CommError; > 0.
    std::chrono::milliseconds timeout{std::chrono::minutes(5)};
    // How many leaves of the canonical tree each rank's buffer stands for, in rank order
    // (core/reduction_tree.hpp: the micro-batches a replica folds, tree::deal): reductions fold
    // the ranks as nodes of those sizes. Empty: one each, the tree over ranks.
    std::vector<std::size_t> leaf_counts{};
  };

  explicit Local(Options options)
      : options_(validate(options)),
        group_(std::make_shared<detail::local::Group>(options_.ranks, options_.timeout,
                                                      options_.leaf_counts)) {}

  const Options& options() const { return options_; }
  int size() const { return options_.ranks; }

  // The communicator of `rank`, 0 <= rank < size(). Each rank's thread uses its own.
  LocalCommunicator communicator(int rank) const {
    options::require_in_range("rank", rank, 0, options_.ranks - 1);
    return LocalCommunicator(group_, rank);
  }

 private:
  static Options validate(const Options& options) {
    options::require_positive("ranks", options.ranks);
    if (options.timeout.count() <= 0) {
      options::reject("timeout", std::to_string(options.timeout.count()) + " ms",
                      "must be greater than 0");
    }
    require_leaf_counts(options.leaf_counts, options.ranks);
    return options;
  }

  Options options_;
  std::shared_ptr<detail::local::Group> group_;
};

}  // namespace cohort::collective
