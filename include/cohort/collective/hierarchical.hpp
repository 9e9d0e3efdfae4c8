// Hierarchical: one communicator over workers x local replicas, made of a local communicator
// among this process's replica threads and a cross communicator among processes (one per
// process, driven by a communication thread).
//
// Global rank = worker * local_size + local rank. An all-reduce is, for each bucket of the buffer:
// the local all-reduce (canonical tree over the local replicas), then the cross-worker all-reduce
// of that bucket (canonical tree over workers) on the communication thread, which runs while the
// local replicas already reduce the next bucket; finally a local broadcast of the result. The
// local replicas of a worker fold one node of the canonical tree together (sharding::Deal), which
// the local communicator folds from theirs and the cross communicator takes whole, so the result
// has the bits of the canonical tree over all micro-batches.
//
// Required: local_size is a power of two; the cross communicator's abort (closing its
// transport) may be called from any thread.
#pragma once

#include <algorithm>
#include <cstddef>
#include <exception>
#include <functional>
#include <optional>
#include <span>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "cohort/collective/collective.hpp"
#include "cohort/collective/communication_thread.hpp"
#include "cohort/core/error.hpp"
#include "cohort/core/trace.hpp"

namespace cohort::collective {

template <Communicator Local, Communicator Cross>
class Hierarchical {
 public:
  // bucket_bytes: the unit of overlap; big enough to keep the network busy, small enough that
  // the local reduce of the next bucket hides behind the cross-worker reduce of this one.
  Hierarchical(Local local, Cross& cross, CommunicationThread& thread, std::size_t bucket_bytes)
      : local_(std::move(local)), cross_(&cross), thread_(&thread), bucket_bytes_(bucket_bytes) {}

  int rank() const { return cross_->rank() * local_.size() + local_.rank(); }
  int size() const { return cross_->size() * local_.size(); }

  template <class E>
  void all_reduce(std::span<E> buffer, ReduceOp op) {
    all_reduce(std::span<const E>(buffer), buffer, op);
  }

  // Out of place: the local all-reduce reads the input and writes the output; everything after
  // it works on the output.
  template <class E>
  void all_reduce(std::span<const std::type_identity_t<E>> input, std::span<E> output,
                  ReduceOp op) {
    if (cross_->size() == 1 || !out_of_place_problem(input, std::span<const E>(output)).empty()) {
      local_.all_reduce(input, output, op);  // which refuses unfit buffers, naming the problem
      return;
    }
    if (output.empty()) return;  // the same on every rank: nothing to agree on
    const std::size_t bucket = std::max<std::size_t>(1, bucket_bytes_ / sizeof(E));
    std::size_t last = 0;
    for (std::size_t offset = 0; offset < output.size(); offset += bucket) {
      const std::size_t length = std::min(bucket, output.size() - offset);
      const auto part = output.subspan(offset, length);
      local_.all_reduce(input.subspan(offset, length), part, op);
      last = on_leader([this, part, op] { cross_->all_reduce(part, op); });
    }
    finish_on_leader(last);
    local_.broadcast(output, 0);
  }

  // The asynchronous all_reduce (collective.hpp): the local all-reduce now, the cross-worker one
  // on the communication thread while the caller goes on, the local broadcast of the result in
  // wait(). Across processes the buffer is one piece: callers cut their buckets themselves.
  template <class E>
  Pending start_all_reduce(std::span<E> buffer, ReduceOp op) {
    if (cross_->size() == 1) {
      return Pending([this, buffer, op] { local_.all_reduce(buffer, op); });
    }
    if (buffer.empty()) return Pending();
    local_.all_reduce(buffer, op);
    const std::size_t ticket = on_leader([this, buffer, op] { cross_->all_reduce(buffer, op); });
    return Pending([this, buffer, ticket] {
      {
        const trace::Span waited(trace::current(), trace::Phase::kBucketWait, {.index = ticket});
        finish_on_leader(ticket);
      }
      local_.broadcast(buffer, 0);
    });
  }

  template <class E>
  void broadcast(std::span<E> buffer, int root) {
    const int local_size = local_.size();
    const int root_worker = root / local_size;
    if (cross_->rank() == root_worker) local_.broadcast(buffer, root % local_size);
    finish_on_leader(
        on_leader([this, buffer, root_worker] { cross_->broadcast(buffer, root_worker); }));
    local_.broadcast(buffer, 0);
  }

  template <class E>
  void all_gather(std::span<const E> input, std::span<E> output) {
    const std::size_t block = input.size() * static_cast<std::size_t>(local_.size());
    const auto worker_block =
        output.subspan(static_cast<std::size_t>(cross_->rank()) * block, block);
    local_.all_gather(input, worker_block);
    finish_on_leader(on_leader([this, worker_block, output] {
      const std::vector<E> mine(worker_block.begin(), worker_block.end());
      cross_->all_gather(std::span<const E>(mine), output);
    }));
    local_.broadcast(output, 0);
  }

  // The reduction of the whole input on every replica, of which each keeps its chunk: simple,
  // and never on a training step's path.
  template <class E>
  void reduce_scatter(std::span<const E> input, std::span<E> output, ReduceOp op) {
    std::vector<E> whole(input.begin(), input.end());
    all_reduce(std::span<E>(whole), op);
    std::copy_n(whole.begin() +
                    static_cast<std::ptrdiff_t>(static_cast<std::size_t>(rank()) * output.size()),
                output.size(), output.begin());
  }

  // The cross communicator's shared buffer (Deterministic::share_buffer) for the local leader,
  // whose buffer is the one that crosses processes; nothing for the other local replicas. A
  // collective over the local leaders.
  template <class E>
  auto share_buffer(std::size_t count)
      -> decltype(std::declval<Cross&>().template share_buffer<E>(count)) {
    decltype(cross_->template share_buffer<E>(count)) shared;
    finish_on_leader(
        on_leader([this, count, &shared] { shared = cross_->template share_buffer<E>(count); }));
    return shared;
  }

  // The cross communicator's gather of a part of the shared buffers (Deterministic::
  // gather_shared_stripes), where each process has one replica: a collective over the processes.
  template <class E>
  requires requires(Cross& cross, std::span<const E> part, std::span<E> into) {
    cross.gather_shared_stripes(part, into, std::size_t{1});
  }
  void gather_shared_stripes(std::span<const E> part, std::span<E> into, std::size_t stripe) {
    COHORT_ASSERT(local_.size() == 1);
    finish_on_leader(on_leader(
        [this, part, into, stripe] { cross_->gather_shared_stripes(part, into, stripe); }));
  }

  // Whether gather_shared_stripes reaches every rank: where each process has one replica and the
  // processes' shared buffers are one segment's (not each host's: Deterministic by host).
  bool stripes_reach_every_rank() const {
    if constexpr (requires { cross_->stripes_reach_every_rank(); }) {
      if (!cross_->stripes_reach_every_rank()) return false;
    }
    return local_.size() == 1;
  }

  // The cross communicator's stripe group (collective.hpp), where each process has one replica;
  // none with several local replicas, where gather_shared_stripes cannot serve.
  std::optional<StripeGroup> stripe_group() const requires requires(const Cross& cross) {
    cross.stripe_group();
  }
  {
    if (local_.size() != 1) return std::nullopt;
    return cross_->stripe_group();
  }

  // The all-reduce in two halves (ReducesToOwners), where each process has one replica: the cross
  // communicator's, on the communication thread, the first started and finished by wait() as
  // start_all_reduce's.
  bool reduces_to_owners() const requires requires(const Cross& cross) {
    cross.reduces_to_owners();
  }
  { return local_.size() == 1 && cross_->reduces_to_owners(); }

  template <class E, class Body>
  requires ReducesToOwners<Cross, E>
  void for_each_owned(std::size_t length, Body&& body) const {
    cross_->template for_each_owned<E>(length, std::forward<Body>(body));
  }

  template <class E, class Body>
  requires ReducesToOwners<Cross, E>
  void for_each_owner(std::size_t length, Body&& body) const {
    cross_->template for_each_owner<E>(length, std::forward<Body>(body));
  }

  template <class E>
  requires ReducesToOwners<Cross, E>
  void reduce_to_owners(std::span<E> buffer, ReduceOp op) {
    start_reduce_to_owners(buffer, op).wait();
  }

  template <class E>
  requires ReducesToOwners<Cross, E> Pending start_reduce_to_owners(std::span<E> buffer,
                                                                    ReduceOp op) {
    COHORT_ASSERT(local_.size() == 1);
    const std::size_t ticket =
        on_leader([this, buffer, op] { cross_->reduce_to_owners(buffer, op); });
    return Pending([this, ticket] {
      const trace::Span waited(trace::current(), trace::Phase::kBucketWait, {.index = ticket});
      finish_on_leader(ticket);
    });
  }

  template <class E>
  requires ReducesToOwners<Cross, E>
  void gather_from_owners(std::span<E> buffer) { start_gather_from_owners(buffer).wait(); }

  template <class E>
  requires ReducesToOwners<Cross, E> Pending start_gather_from_owners(std::span<E> buffer) {
    COHORT_ASSERT(local_.size() == 1);
    const std::size_t ticket = on_leader([this, buffer] { cross_->gather_from_owners(buffer); });
    return Pending([this, ticket] { finish_on_leader(ticket); });
  }

  void barrier() {
    local_.barrier();
    finish_on_leader(on_leader([this] { cross_->barrier(); }));
    local_.barrier();
  }

  void abort(std::string_view reason) {
    local_.abort(reason);
    cross_->abort(reason);
  }

 private:
  // Cross-worker work, submitted by the local leader only: its ticket there, 0 elsewhere.
  std::size_t on_leader(std::function<void()> work) {
    return local_.rank() == 0 ? thread_->submit(std::move(work)) : 0;
  }

  // The local leader waits for the cross-worker work up to `ticket`; if it failed, the local group
  // is released before the error goes up, so no local replica waits for a leader that left.
  void finish_on_leader(std::size_t ticket) {
    if (local_.rank() != 0) return;
    try {
      thread_->wait(ticket);
    } catch (const std::exception& error) {
      local_.abort(error.what());
      throw;
    }
  }

  Local local_;
  Cross* cross_;
  CommunicationThread* thread_;
  std::size_t bucket_bytes_;
};

}  // namespace cohort::collective
