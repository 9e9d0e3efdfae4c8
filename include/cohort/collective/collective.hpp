// Collectives: the operations replicas use to combine and share buffers.
//
// A collective policy (collective::Local for threads of one process; ring, deterministic and nccl
// policies for processes and GPUs) creates a group, and each rank of the group holds a
// Communicator. Every communicator provides, for T in {float, double, std::int32_t, std::int64_t}:
//
//   rank(), size()
//   all_reduce(std::span<T> buffer, ReduceOp op)
//       in place; every rank ends with the reduction of every rank's buffer.
//   all_reduce(std::span<const T> input, std::span<T> output, ReduceOp op)
//       out of place: output ends with the reduction of every rank's input, which is left as it
//       was. The same length, and either the same memory (then it is the in-place call) or none
//       in common (out_of_place_problem). No copy of input comes first: the transports send
//       from it and fold it straight into output.
//   broadcast(std::span<T> buffer, int root)
//       every rank ends with root's buffer.
//   all_gather(std::span<const T> input, std::span<T> output)
//       output.size() == size() * input.size(); output holds rank 0's input, then rank 1's, ...
//   reduce_scatter(std::span<const T> input, std::span<T> output, ReduceOp op)
//       input.size() == size() * output.size(); rank r receives the reduction of chunk r.
//   barrier()
//   abort(std::string_view reason)
//       makes every collective of every rank in the group, waiting now or called later, throw
//       CommError naming this rank and the reason. Called by a replica that failed, so that the
//       others do not wait for it.
//
// The one asynchronous verb, for every communicator (below):
//   Pending pending = start_all_reduce(communicator, buffer, op);  ...  pending.wait();
//       the all_reduce of buffer, finished by wait(). A communicator that can overlap it with
//       the caller's work provides the member start_all_reduce(buffer, op) (Hierarchical: its
//       communication thread reduces across processes meanwhile; NcclCommunicator: enqueued on
//       the replica's stream at once); for every other, the all_reduce runs in wait(). Every rank
//       starts the same all-reduces in the same order and waits for them in that order; the buffer
//       is the communicator's until wait() returns.
//
// The summation order is fixed: ranks are combined in the canonical tree of
// core/reduction_tree.hpp, so the result is bit-identical on every rank and equals the same
// tree computed anywhere else (for example over micro-batches in one replica). A communicator
// whose ranks fold different numbers of micro-batches (sharding::Deal) is told each rank's count,
// and combines the ranks as nodes of those sizes: collective::Local by its Options::leaf_counts,
// a communicator between processes by set_leaf_counts (FoldsNodes, below).
//
// ReduceOp::kSumBfloat16 (kSumFloat16) reduces float buffers in the tree whose every node is
// rounded to bfloat16 (float16; core/reduce_op.hpp): every communicator merges that way, and its
// inputs are expected to be nodes of that tree, values of the format (the Trainer's fold rounds
// them). Any other element type is refused (reduction_problem).
//
// Required of the caller, and checked where it is cheap: every rank calls the same collectives in
// the same order, with the same length, element type, operation and root. A mismatch is a
// CommError naming both ranks and what each called; a rank that does not arrive within the
// group's timeout is a CommError naming the waiting rank, the operation and its sequence number.
#pragma once

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "cohort/core/options.hpp"
#include "cohort/core/reduce_op.hpp"
#include "cohort/core/reduction_tree.hpp"

namespace cohort::collective {

template <class C>
concept Communicator = requires(C& c, std::span<float> buffer, std::span<const float> input,
                                std::span<double> doubles, std::string_view reason) {
  { c.rank() } -> std::convertible_to<int>;
  { c.size() } -> std::convertible_to<int>;
  c.all_reduce(buffer, ReduceOp::kSum);
  c.all_reduce(doubles, ReduceOp::kSum);
  c.all_reduce(input, buffer, ReduceOp::kSum);
  c.broadcast(buffer, 0);
  c.all_gather(input, buffer);
  c.reduce_scatter(input, buffer, ReduceOp::kSum);
  c.barrier();
  c.abort(reason);
};

// A communicator between processes that can fold its ranks as nodes of given leaf counts:
// c.set_leaf_counts(counts), on every rank alike, before the reductions it applies to
// (collective::Deterministic). collective::Ring adds in its own order and has no such call.
template <class C>
concept FoldsNodes = requires(C& c, std::vector<std::size_t> counts) {
  c.set_leaf_counts(std::move(counts));
};

// Leaf counts a collective of `ranks` ranks can fold its ranks as (FoldsNodes,
// collective::Local's Options::leaf_counts): none (one each), or every rank's, consecutive nodes
// of the canonical tree. Anything else is a ConfigError naming the field.
inline void require_leaf_counts(std::span<const std::size_t> counts, int ranks) {
  if (counts.empty() ||
      (counts.size() == static_cast<std::size_t>(ranks) && tree::are_nodes(counts))) {
    return;
  }
  options::reject("leaf_counts", counts.size(),
                  "must give every rank's count, consecutive nodes of the canonical tree "
                  "(tree::deal)");
}

// What a communicator's share_buffer gives (collective::Local, collective::Deterministic): memory
// of this rank where the sharded update of strategy/detail/mirrored_replica.hpp keeps the
// gradient sum, and from which gather_shared_stripes gathers.
template <class E>
struct SharedBuffer {
  std::span<E> values{};  // empty where the buffer is not shared
  // Why not, where all_reduce goes through shared memory but this buffer could not be made
  // there: this rank's reason, or the first rank that could not. Empty otherwise.
  std::string why_not{};
};

// The ranks among which gather_shared_stripes shares a striped buffer out (a communicator's
// stripe_group(): collective::Local, collective::Deterministic, collective::Hierarchical where each
// process has one replica): stripe k belongs to the rank at place k mod size among them. Every
// rank of the job, or, where the shared buffers are each host's (Deterministic by host), the ranks
// of this rank's host, every host striping alike.
struct StripeGroup {
  std::size_t place = 0;  // this rank's
  std::size_t size = 1;
};

// A communicator that also runs its all-reduce in two halves (collective::Deterministic over a
// transport, collective::Hierarchical over it where each process has one replica), so that each
// rank can work on the part of the sum it owns before the second half shares it:
//   c.reduces_to_owners()            whether it can now (else the calls below fail)
//   c.for_each_owned<E>(length, body)
//       body(begin, count) for each run of the elements of a buffer of `length` that this rank
//       owns, in order; every element has one owner, and who owns it depends only on the length
//       and the group
//   c.for_each_owner<E>(length, body)
//       body(begin, count, rank) for every rank's runs, in no promised order
//   c.reduce_to_owners(buffer, op)   the first half: the owned elements hold what all_reduce gives
//                                    them, the others are undefined
//   c.gather_from_owners(buffer)     the second: every rank's owned elements of buffer, to every
//                                    rank
// Every rank calls the same halves in the same order with the same lengths; the sharded update
// over TCP (strategy/detail/owned_update.hpp) reduces a bucket of the gradient, updates the
// parameters it owns, and gathers them.
template <class C, class E>
concept ReducesToOwners = requires(C& c, const C& cc, std::span<E> buffer) {
  { cc.reduces_to_owners() } -> std::same_as<bool>;
  cc.template for_each_owned<E>(std::size_t{1}, [](std::size_t, std::size_t) {});
  cc.template for_each_owner<E>(std::size_t{1}, [](std::size_t, std::size_t, int) {});
  c.reduce_to_owners(buffer, ReduceOp::kSum);
  c.gather_from_owners(buffer);
};

// What makes `op` unfit for elements of T (reduces<T>, core/reduce_op.hpp), in words for the error
// that names the call, or empty where it is fit.
template <class T>
std::string reduction_problem(ReduceOp op) {
  if (reduces<T>(op)) return {};
  return std::string(name(op)) + " reduces float elements only";
}

// What makes `input` and `output` unfit for an out-of-place all_reduce, in words for the error
// that names the call, or empty where they are fit: they differ in length, or they overlap
// without being the same memory (a fold would read what it already wrote).
template <class T>
std::string out_of_place_problem(std::span<const T> input, std::span<const T> output) {
  if (input.size() != output.size()) {
    return "input has " + std::to_string(input.size()) + " elements but output " +
           std::to_string(output.size());
  }
  const std::less<const T*> before;
  const bool apart = !before(input.data(), output.data() + output.size()) ||
                     !before(output.data(), input.data() + input.size());
  if (input.data() != output.data() && !apart) {
    return "input and output overlap without being the same buffer";
  }
  return {};
}

// What a reduction over one rank, or of nothing, leaves: output holds input. In place nothing
// moves, so a one-rank all_reduce costs no pass over its buffer.
template <class T>
void copy_unless_same(std::span<const T> input, std::span<T> output) {
  if (input.data() != output.data()) std::copy(input.begin(), input.end(), output.begin());
}

// An operation started and not yet finished. wait() finishes it on this rank, rethrowing its
// failure; a second wait() does nothing.
class Pending {
 public:
  Pending() = default;
  explicit Pending(std::function<void()> finish) : finish_(std::move(finish)) {}

  void wait() {
    if (auto finish = std::exchange(finish_, nullptr)) finish();
  }

 private:
  std::function<void()> finish_;
};

template <Communicator C, class T>
Pending start_all_reduce(C& communicator, std::span<T> buffer, ReduceOp op) {
  if constexpr (requires { communicator.start_all_reduce(buffer, op); }) {
    return communicator.start_all_reduce(buffer, op);
  } else {
    return Pending([&communicator, buffer, op] { communicator.all_reduce(buffer, op); });
  }
}

// The halves of ReducesToOwners started, as start_all_reduce starts the whole (Hierarchical: on its
// communication thread), or run in wait().
template <class C, class T>
requires ReducesToOwners<C, T> Pending start_reduce_to_owners(C& communicator, std::span<T> buffer,
                                                              ReduceOp op) {
  if constexpr (requires { communicator.start_reduce_to_owners(buffer, op); }) {
    return communicator.start_reduce_to_owners(buffer, op);
  } else {
    return Pending([&communicator, buffer, op] { communicator.reduce_to_owners(buffer, op); });
  }
}

template <class C, class T>
requires ReducesToOwners<C, T> Pending start_gather_from_owners(C& communicator,
                                                                std::span<T> buffer) {
  if constexpr (requires { communicator.start_gather_from_owners(buffer); }) {
    return communicator.start_gather_from_owners(buffer);
  } else {
    return Pending([&communicator, buffer] { communicator.gather_from_owners(buffer); });
  }
}

// The operations a collective can be asked for, as named in errors and benchmark output.
enum class Operation : std::uint8_t {
  kAllReduce,
  kBroadcast,
  kAllGather,
  kReduceScatter,
  kBarrier,
  kSend,  // point to point, where a communicator offers it (collective::NcclCommunicator)
  kReceive,
};

constexpr std::string_view name(Operation op) {
  switch (op) {
    case Operation::kAllReduce:
      return "all_reduce";
    case Operation::kBroadcast:
      return "broadcast";
    case Operation::kAllGather:
      return "all_gather";
    case Operation::kReduceScatter:
      return "reduce_scatter";
    case Operation::kBarrier:
      return "barrier";
    case Operation::kSend:
      return "send";
    case Operation::kReceive:
      return "receive";
  }
  return "unknown";
}

}  // namespace cohort::collective
