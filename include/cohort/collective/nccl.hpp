// collective::Nccl: collectives between GPUs over NCCL, for cohort::cuda users.
//
// Each rank is one GPU, driven by one host thread (or process) that owns a NcclCommunicator. The
// spans given to it are DEVICE memory (a std::span only carries the pointer and the length). A
// call's work runs on the communicator's own communication stream, after the work enqueued on the
// replica's stream before the call (an event orders the two), and each call returns when it has
// finished, like every other cohort communicator (a call is a step boundary).
//
//   ncclUniqueId id = collective::nccl_unique_id(bootstrap);    // rank 0 makes it; any
//       communicator able to broadcast std::int64_t (Local, Ring<Tcp>, ...) carries it
//   collective::NcclCommunicator comm(id, rank, size, {.device = local_gpu});
//
//   collective::Nccl group({.ranks = 4});     // one process, GPUs 0..3 (Mirrored's shape):
//   auto comm = group.communicator(rank);     // called by each replica's thread, concurrently
//   auto comm = group.communicator(rank, stream);  // after the replica's own stream (of GPU rank)
//
// Options (NcclCommunicator::Options):
//   device         the CUDA device of this rank (cudaSetDevice before every call)
//   stream         the replica's stream, whose work a call waits for; nullptr makes the
//                  communicator create its own
//   timeout        how long a collective may take before it is aborted (ncclCommAbort) and
//                  reported as a CommError naming the rank, the operation and its sequence number;
//                  also how long teardown may wait for NCCL to finalize
//   setup_timeout  how long joining the group may take (every rank must arrive, and NCCL set up
//                  its connections): a launcher's start-up spread, not a collective's
//   deterministic  true (default): NCCL is transport only. Floating-point all_reduce and
//                  reduce_scatter move chunks with ncclSend/ncclRecv and sum them with
//                  cuda::reduce_tree, ranks in the canonical tree (core/reduction_tree.hpp): the
//                  same bits as every other cohort collective and as the CPU. false: NCCL's own
//                  ncclAllReduce / ncclReduceScatter, faster, in an order NCCL chooses (it
//                  depends on the topology and algorithm, so bits may differ between machines).
//                  Integer reductions and all_gather / broadcast are exact either way.
//
// Point to point (NcclCommunicator only, beside the Communicator operations): send(buffer, peer)
// and receive(buffer, peer), on the same streams and under the same timeout.
//
// Asynchronous all-reduce (collective.hpp's verb): start_all_reduce(buffer, op) enqueues the
// all_reduce on the communication stream, behind the replica stream's work so far (the kernels
// that made the gradient range final), and returns a collective::Pending; its wait() waits as
// all_reduce does, under the same timeout and checks. Work enqueued on the replica's stream
// meanwhile (the rest of the backward pass) runs beside the all-reduce, so the transfer hides
// behind it; it must not touch the buffer until wait() returns (the readiness contract:
// core/readiness.hpp). The communicator must neither move nor end while a Pending of it is not
// yet waited for.
//
// Errors: a failing NCCL or CUDA call is a DeviceError naming the call; an asynchronous
// communicator error (ncclCommGetAsyncError, polled while waiting) or a timeout aborts the
// communicator and is a CommError naming the rank, operation and sequence number. After that, or
// after abort(reason), every call throws CommError. Within one process (collective::Nccl) the
// failure reaches every rank of the group at once, with its reason (Options::group, polled while
// waiting), as collective::Local's abort does; across processes NCCL cannot carry the reason, and
// the other ranks fail when their own collective times out or reports the aborted peer. A rank
// whose set-up fails tells the group before it aborts, so that the others stop waiting for it.
//
// Teardown (the destructor, never throwing): a healthy communicator is finalized
// (ncclCommFinalize, waited for at most `timeout`) and then destroyed (ncclCommDestroy); when
// finalizing fails, outlasts the timeout, or another rank of the in-process group fails meanwhile,
// the communicator is aborted instead (ncclCommAbort: ncclCommDestroy would wait for a quiescence
// that a lost peer never grants), and the group is told. A failed communicator was aborted at once.
//
// Requires the kernels: link cohort::cuda and compile one .cu that includes cuda/instantiate.cuh.
// Deterministic mode combines at most cuda::kMaxTreeInputs (64) ranks (ConfigError otherwise).
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "cohort/collective/collective.hpp"
#include "cohort/core/error.hpp"
#include "cohort/core/options.hpp"
#include "cohort/core/reduce_op.hpp"
#include "cohort/cuda/launch.hpp"
#include "cohort/device/cuda.hpp"

namespace cohort::collective {

namespace nccl {

inline std::string describe(std::string_view call, ncclResult_t code) {
  return std::string(call) + " failed: " + ncclGetErrorString(code) + " (" +
         std::to_string(static_cast<int>(code)) + ")";
}

// A DeviceError naming the call, the code and its text. ncclInProgress is not an error here: the
// caller of a non-blocking communicator's call settles it (NcclCommunicator::settle).
inline void check(ncclResult_t code, std::string_view call) {
  if (code != ncclSuccess && code != ncclInProgress) throw DeviceError(describe(call, code));
}

template <class T>
constexpr ncclDataType_t data_type() {
  if constexpr (std::is_same_v<T, float>) {
    return ncclFloat32;
  } else if constexpr (std::is_same_v<T, double>) {
    return ncclFloat64;
  } else if constexpr (std::is_same_v<T, std::int32_t>) {
    return ncclInt32;
  } else if constexpr (std::is_same_v<T, std::int64_t>) {
    return ncclInt64;
  } else if constexpr (std::is_same_v<T, cuda::half>) {
    return ncclFloat16;
  } else {
    static_assert(std::is_same_v<T, cuda::bfloat16>,
                  "cohort: NCCL collectives take float, double, std::int32_t, std::int64_t, half "
                  "or bfloat16 elements");
    return ncclBfloat16;
  }
}

inline ncclRedOp_t reduction(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return ncclSum;
    case ReduceOp::kProduct:
      return ncclProd;
    case ReduceOp::kMin:
      return ncclMin;
    case ReduceOp::kMax:
      return ncclMax;
    case ReduceOp::kSumBfloat16:  // refused before they get here (NcclCommunicator::refuse_unfit)
    case ReduceOp::kSumFloat16:
      break;
  }
  return ncclSum;
}

}  // namespace nccl

#define COHORT_NCCL_CHECK(call) ::cohort::collective::nccl::check((call), #call)

namespace nccl {

// The failure of one rank of an in-process group, which every other rank's waiting call sees: the
// first reason raised, kept.
class GroupFailure {
 public:
  void raise(const std::string& reason) {
    const std::lock_guard lock(mutex_);
    if (!raised_.load(std::memory_order_relaxed)) reason_ = reason;
    raised_.store(true, std::memory_order_release);
  }
  bool raised() const { return raised_.load(std::memory_order_acquire); }
  std::string reason() const {
    const std::lock_guard lock(mutex_);
    return reason_;
  }

 private:
  mutable std::mutex mutex_;
  std::string reason_;
  std::atomic<bool> raised_{false};
};

// How an owned communicator ends (the deleter of Comm): finalized, then destroyed. NCCL asks for
// ncclCommAbort where finalizing does not succeed: ncclCommDestroy after an unfinished finalize
// waits for the communicator to become quiescent, which a lost peer never lets happen. So the
// communicator is aborted when ncclCommFinalize or its progress reports an error, when it has not
// finished within `limit`, or when another rank of the in-process group has failed (it will not
// finalize its side); the group then hears why. Never throws.
struct Close {
  int device = 0;
  int rank = 0;
  std::chrono::milliseconds limit{};
  std::shared_ptr<GroupFailure> group;

  void operator()(ncclComm_t comm) const noexcept {
    (void)cudaSetDevice(device);
    const std::string failure = finalize(comm);
    if (failure.empty()) {
      (void)ncclCommDestroy(comm);
      return;
    }
    if (group) group->raise("nccl rank " + std::to_string(rank) + ": " + failure);
    (void)ncclCommAbort(comm);
  }

 private:
  // "" once the communicator is finalized, else why it is not.
  std::string finalize(ncclComm_t comm) const {
    const ncclResult_t started = ncclCommFinalize(comm);
    if (started != ncclSuccess && started != ncclInProgress) {
      return describe("ncclCommFinalize", started);
    }
    const auto deadline = std::chrono::steady_clock::now() + limit;
    for (;;) {
      ncclResult_t state = ncclInProgress;
      const ncclResult_t code = ncclCommGetAsyncError(comm, &state);
      if (code != ncclSuccess) return describe("ncclCommGetAsyncError", code);
      if (state == ncclSuccess) return "";
      if (state != ncclInProgress) return describe("ncclCommFinalize", state);
      if (group && group->raised()) return "finalize abandoned: " + group->reason();
      if (std::chrono::steady_clock::now() > deadline) {
        return "ncclCommFinalize timed out after " + std::to_string(limit.count()) + " ms";
      }
      std::this_thread::yield();
    }
  }
};

// An owned communicator: moves with its owner, ends by Close.
using Comm = std::unique_ptr<ncclComm, Close>;

}  // namespace nccl

// A fresh ncclUniqueId made by rank 0 of `bootstrap` and broadcast to every rank of it, as 16
// std::int64_t words (the id is 128 opaque bytes). Every rank of bootstrap calls it.
template <Communicator C>
ncclUniqueId nccl_unique_id(C& bootstrap) {
  std::array<std::int64_t, 16> words{};
  static_assert(sizeof(ncclUniqueId) == sizeof(words), "ncclUniqueId is 128 bytes");
  ncclUniqueId id{};
  if (bootstrap.rank() == 0) {
    COHORT_NCCL_CHECK(ncclGetUniqueId(&id));
    std::memcpy(words.data(), &id, sizeof(id));
  }
  bootstrap.broadcast(std::span<std::int64_t>(words), 0);
  std::memcpy(&id, words.data(), sizeof(id));
  return id;
}

class NcclCommunicator {
 public:
  struct Options {
    int device = 0;
    cudaStream_t stream = nullptr;
    std::chrono::milliseconds timeout{std::chrono::minutes(5)};
    std::chrono::milliseconds setup_timeout{std::chrono::minutes(5)};
    bool deterministic = true;
    // Shared by the ranks of one process (collective::Nccl sets it): a rank that fails or aborts
    // raises it, and every other rank's waiting or later call fails with the reason.
    std::shared_ptr<nccl::GroupFailure> group = nullptr;
  };

  // Joins the group `id` as `rank` of `size`; returns once every rank has joined (or throws
  // CommError after options.setup_timeout). Every rank calls it with the same id and size. A rank
  // whose set-up fails raises options.group (when given) with its reason before it aborts.
  NcclCommunicator(const ncclUniqueId& id, int rank, int size, Options options)
      : rank_(rank),
        size_(size),
        options_(std::move(options)),
        comm_(nullptr, nccl::Close{.device = options_.device,
                                   .rank = rank,
                                   .limit = options_.timeout,
                                   .group = options_.group}) {
    try {
      cohort::options::require_positive("size", size);
      if (rank < 0 || rank >= size) cohort::options::reject("rank", rank, "must lie in [0, size)");
      cohort::options::require_positive("timeout", options_.timeout.count());
      cohort::options::require_positive("setup_timeout", options_.setup_timeout.count());
      if (options_.deterministic && static_cast<std::size_t>(size) > cuda::kMaxTreeInputs) {
        cohort::options::reject(
            "size", size, "deterministic NCCL combines at most 64 ranks (cuda::kMaxTreeInputs)");
      }
      use_device();
      if (options_.stream == nullptr) {
        own_stream_.emplace(options_.device, options_.timeout);
        options_.stream = own_stream_->get();
      }
      communication_.emplace(options_.device, options_.timeout);
      replica_ready_ = device::cuda::Event(options_.device);
      done_ = device::cuda::Event(options_.device);
      // Non-blocking, so that a wedged peer cannot hang a call inside NCCL: every call returns at
      // once and is waited for here, where the timeout and ncclCommAbort apply.
      ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
      config.blocking = 0;
      ncclUniqueId copy = id;
      ncclComm_t comm = nullptr;
      const ncclResult_t started = ncclCommInitRankConfig(&comm, size_, copy, rank_, &config);
      comm_.reset(comm);
      COHORT_NCCL_CHECK(started);
      settle(Operation::kBarrier, "ncclCommInitRankConfig", 0, options_.setup_timeout);
    } catch (...) {
      // The others wait in their set-up for this rank: tell them first, then abort (which may
      // take a while), rather than finalizing a communicator that never joined. The members
      // made so far release themselves.
      failed_ = "nccl rank " + std::to_string(rank_) + " of " + std::to_string(size_) +
                ": set-up failed: " + what_of(std::current_exception());
      if (options_.group) options_.group->raise(failed_);
      abort_comm();
      throw;
    }
  }

  // Moves and teardown come from the members: a moved-from communicator owns nothing, and the
  // end of one finalizes or aborts its NCCL communicator (nccl::Close) before its memory, events
  // and streams go. Never throws.

  int rank() const { return rank_; }
  int size() const { return size_; }
  // The replica's stream (Options::stream, or the one made for it).
  cudaStream_t stream() const { return options_.stream; }
  const Options& options() const { return options_; }

  template <class T>
  void all_reduce(std::span<T> buffer, ReduceOp op) {
    start_all_reduce(buffer, op).wait();
  }

  // Out of place (collective.hpp): NCCL reads the input and writes the output.
  template <class T>
  void all_reduce(std::span<const std::type_identity_t<T>> input, std::span<T> output,
                  ReduceOp op) {
    start(input, output, op).wait();
  }

  // all_reduce enqueued on the communication stream; the Pending's wait() waits for it (see the
  // top of the file).
  template <class T>
  Pending start_all_reduce(std::span<T> buffer, ReduceOp op) {
    return start(std::span<const T>(buffer), buffer, op);
  }

  template <class T>
  void broadcast(std::span<T> buffer, int root) {
    const Call call = begin(Operation::kBroadcast);
    if (root < 0 || root >= size_) fail_shape(call, "root " + std::to_string(root));
    if (!buffer.empty()) {
      enqueue(ncclBroadcast(buffer.data(), buffer.data(), buffer.size(), nccl::data_type<T>(), root,
                            comm(), communication()),
              call, "ncclBroadcast");
    }
    wait(call);
  }

  template <class T>
  void all_gather(std::span<const T> input, std::span<T> output) {
    const Call call = begin(Operation::kAllGather);
    if (output.size() != input.size() * static_cast<std::size_t>(size_)) {
      fail_shape(call, "output of " + std::to_string(output.size()) + " for input of " +
                           std::to_string(input.size()));
    }
    if (!input.empty()) {
      enqueue(ncclAllGather(input.data(), output.data(), input.size(), nccl::data_type<T>(), comm(),
                            communication()),
              call, "ncclAllGather");
    }
    wait(call);
  }

  template <class T>
  void reduce_scatter(std::span<const T> input, std::span<T> output, ReduceOp op) {
    const Call call = begin(Operation::kReduceScatter);
    const std::size_t count = output.size();
    if (input.size() != count * static_cast<std::size_t>(size_)) {
      fail_shape(call, "input of " + std::to_string(input.size()) + " for output of " +
                           std::to_string(count));
    }
    refuse_unfit<T>(call, op);
    if (count > 0) {
      if (deterministic<T>()) {
        reduce_chunks<T>(
            input.data(),
            [&](int r) { return std::pair<std::size_t, std::size_t>(r * count, count); },
            output.data(), op, call);
      } else {
        enqueue(ncclReduceScatter(input.data(), output.data(), count, nccl::data_type<T>(),
                                  nccl::reduction(op), comm(), communication()),
                call, "ncclReduceScatter");
      }
    }
    wait(call);
  }

  // Point to point: `buffer` goes to rank `peer`, which calls receive with a buffer of the same
  // length and element type and this rank. Each returns when its side is done, and a send waits
  // for its receive: two ranks that both send and receive must order their calls (for example
  // the lower rank sends first), or they wait for each other until the timeout.
  template <class T>
  void send(std::span<const T> buffer, int peer) {
    const Call call = begin(Operation::kSend);
    require_peer(call, peer);
    if (!buffer.empty()) {
      enqueue(ncclSend(buffer.data(), buffer.size(), nccl::data_type<T>(), peer, comm(), communication()),
              call, "ncclSend");
    }
    wait(call);
  }

  template <class T>
  void receive(std::span<T> buffer, int peer) {
    const Call call = begin(Operation::kReceive);
    require_peer(call, peer);
    if (!buffer.empty()) {
      enqueue(ncclRecv(buffer.data(), buffer.size(), nccl::data_type<T>(), peer, comm(), communication()),
              call, "ncclRecv");
    }
    wait(call);
  }

  void barrier() {
    const Call call = begin(Operation::kBarrier);
    if (barrier_word_.size() == 0) barrier_word_ = device::cuda::Buffer<std::int32_t>(1, place());
    std::int32_t* const word = barrier_word_.span().data();
    enqueue(ncclAllReduce(word, word, 1, ncclInt32, ncclSum, comm(), communication()), call,
            "ncclAllReduce");
    wait(call);
  }

  // Aborts the communicator (ncclCommAbort): this rank's later calls throw CommError with reason.
  void abort(std::string_view reason) {
    if (!failed_.empty()) return;
    failed_ = "rank " + std::to_string(rank_) + " aborted: " + std::string(reason);
    if (options_.group) options_.group->raise(failed_);
    abort_comm();
  }

 private:
  struct Call {
    Operation operation;
    std::uint64_t sequence;
  };

  ncclComm_t comm() const { return comm_.get(); }
  cudaStream_t communication() const { return communication_->get(); }
  // Where the communicator's own memory is zeroed and used: its communication stream.
  device::cuda::Place place() const { return communication_->place(); }

  // ncclCommAbort now, for a failed communicator (teardown would try to finalize it).
  void abort_comm() noexcept {
    if (!comm_) return;
    (void)cudaSetDevice(options_.device);
    (void)ncclCommAbort(comm_.release());
  }

  template <class T>
  bool deterministic() const {
    return options_.deterministic &&
           (std::is_floating_point_v<T> || std::is_same_v<T, cuda::half> ||
            std::is_same_v<T, cuda::bfloat16>);
  }

  template <class T>
  Pending start(std::span<const T> input, std::span<T> output, ReduceOp op) {
    const Call call = begin(Operation::kAllReduce);
    const std::string problem = out_of_place_problem(input, std::span<const T>(output));
    if (!problem.empty()) fail_shape(call, problem);
    refuse_unfit<T>(call, op);
    if (deterministic<T>() && size_ > 1 && !output.empty()) {
      reduce_chunks<T>(
          input.data(), [&](int r) { return chunk(output.size(), r); },
          output.data() + chunk(output.size(), rank_).first, op, call);
      // All-gather of the reduced chunks, by point-to-point (chunks differ in length by one).
      const auto [mine, mine_length] = chunk(output.size(), rank_);
      group_start(call);
      for (int peer = 0; peer < size_; ++peer) {
        if (peer == rank_) continue;
        const auto [offset, length] = chunk(output.size(), peer);
        enqueue(ncclSend(output.data() + mine, mine_length, nccl::data_type<T>(), peer, comm(),
                         communication()),
                call, "ncclSend");
        enqueue(ncclRecv(output.data() + offset, length, nccl::data_type<T>(), peer, comm(),
                         communication()),
                call, "ncclRecv");
      }
      group_end(call);
    } else if (!output.empty()) {
      enqueue(ncclAllReduce(input.data(), output.data(), output.size(), nccl::data_type<T>(),
                            nccl::reduction(op), comm(), communication()),
              call, "ncclAllReduce");
      // A non-blocking communicator may still be placing the call on the stream; it takes no
      // other call until then.
      settle(call.operation, "ncclAllReduce", call.sequence, options_.timeout);
    }
    return Pending([this, call] { wait(call); });
  }

  // Rank r's chunk of an n-element all_reduce: [offset, offset + length), lengths differing by
  // at most one.
  std::pair<std::size_t, std::size_t> chunk(std::size_t n, int r) const {
    const std::size_t first = n * static_cast<std::size_t>(r) / size_;
    const std::size_t last = n * (static_cast<std::size_t>(r) + 1) / size_;
    return {first, last - first};
  }

  // A failure of `call`; `peer` is the other rank involved, -1 when none is.
  CommError failure(const Call& call, std::string detail, int peer = -1) const {
    return CommError({.rank = rank_,
                      .peer = peer,
                      .operation = std::string(name(call.operation)),
                      .sequence = call.sequence,
                      .detail = std::move(detail)});
  }

  Call begin(Operation operation) {
    const Call call{operation, ++sequence_};
    if (!failed_.empty())
      throw failure(call, "refused: the communicator failed earlier: " + failed_);
    check_group(call);
    use_device();
    // The call's work waits for what the replica enqueued before it (the gradients it reduces,
    // the values it sends), and for nothing the replica enqueues after.
    COHORT_CUDA_CHECK(cudaEventRecord(replica_ready_.get(), stream()));
    COHORT_CUDA_CHECK(cudaStreamWaitEvent(communication(), replica_ready_.get(), 0));
    return call;
  }

  // Fails this call when another rank of the group has failed.
  void check_group(const Call& call) {
    if (options_.group && options_.group->raised()) fail(call, options_.group->reason());
  }

  void require_peer(const Call& call, int peer) const {
    if (peer < 0 || peer >= size_ || peer == rank_) {
      throw failure(call, "peer " + std::to_string(peer) + " is not another rank of the group",
                    peer);
    }
  }

  // kSumBfloat16 and kSumFloat16 (core/reduce_op.hpp) are trees of rounded nodes: float elements
  // only, and only the deterministic mode's kernels compute them; NCCL's own reductions have no
  // such operator.
  template <class T>
  void refuse_unfit(const Call& call, ReduceOp op) {
    if (const std::string problem = reduction_problem<T>(op); !problem.empty()) {
      throw failure(call, problem);
    }
    if (rounds_nodes(op) && !deterministic<T>()) {
      throw failure(
          call, std::string(name(op)) + " needs the deterministic mode (Options::deterministic)");
    }
  }

  [[noreturn]] void fail_shape(const Call& call, const std::string& what) {
    throw failure(call, "shape mismatch, " + what);
  }

  void use_device() const { COHORT_CUDA_CHECK(cudaSetDevice(options_.device)); }

  [[noreturn]] void fail(const Call& call, const std::string& what) {
    const CommError error = failure(call, what + "; communicator aborted");
    failed_ = error.what();
    // NCCL counts group depth per thread: a group left open would swallow this thread's later
    // NCCL calls, those of a fresh communicator too.
    if (in_group_) (void)ncclGroupEnd();
    in_group_ = false;
    if (options_.group) options_.group->raise(failed_);
    abort_comm();
    throw error;
  }

  void enqueue(ncclResult_t code, const Call& call, std::string_view what) {
    if (code == ncclSuccess || code == ncclInProgress) return;
    fail(call, nccl::describe(what, code) + last_error());
  }

  std::string last_error() const {
    const char* text = comm_ ? ncclGetLastError(comm()) : nullptr;
    return text != nullptr && *text != '\0' ? std::string(" (") + text + ")" : std::string();
  }

  void group_start(const Call& call) {
    enqueue(ncclGroupStart(), call, "ncclGroupStart");
    in_group_ = true;
  }
  void group_end(const Call& call) {
    in_group_ = false;
    enqueue(ncclGroupEnd(), call, "ncclGroupEnd");
    settle(call.operation, "ncclGroupEnd", call.sequence, options_.timeout);
  }

  // Waits until the non-blocking communicator has no call in progress (an init, a group).
  void settle(Operation operation, std::string_view what, std::uint64_t sequence,
              std::chrono::milliseconds limit) {
    const Call call{operation, sequence};
    const auto deadline = std::chrono::steady_clock::now() + limit;
    for (;;) {
      ncclResult_t state = ncclSuccess;
      const ncclResult_t code = ncclCommGetAsyncError(comm(), &state);
      if (code != ncclSuccess) fail(call, nccl::describe("ncclCommGetAsyncError", code));
      if (state == ncclSuccess) return;
      if (state != ncclInProgress) fail(call, nccl::describe(what, state) + last_error());
      if (std::chrono::steady_clock::now() > deadline) {
        fail(call, std::string(what) + " timed out after " + std::to_string(limit.count()) + " ms");
      }
      check_group(call);
      std::this_thread::yield();
    }
  }

  // Waits for everything enqueued so far, polling the communicator's asynchronous error. Also a
  // Pending's finish: the communicator may have failed since its call was enqueued.
  void wait(const Call& call) {
    if (!failed_.empty())
      throw failure(call, "refused: the communicator failed earlier: " + failed_);
    settle(call.operation, name(call.operation), call.sequence, options_.timeout);
    COHORT_CUDA_CHECK(cudaEventRecord(done_.get(), communication()));
    const auto deadline = std::chrono::steady_clock::now() + options_.timeout;
    for (;;) {
      const cudaError_t query = cudaEventQuery(done_.get());
      if (query == cudaSuccess) return;
      if (query != cudaErrorNotReady) device::cuda::check(query, "cudaEventQuery");
      // The runtime also keeps "not ready" as this thread's last error, which the next launch's
      // check would take for its own failure.
      (void)cudaGetLastError();
      ncclResult_t state = ncclSuccess;
      if (ncclCommGetAsyncError(comm(), &state) != ncclSuccess ||
          (state != ncclSuccess && state != ncclInProgress)) {
        fail(call, nccl::describe("asynchronous communicator error", state) + last_error());
      }
      if (std::chrono::steady_clock::now() > deadline) {
        fail(call, "timed out after " + std::to_string(options_.timeout.count()) + " ms");
      }
      check_group(call);
      std::this_thread::yield();
    }
  }

  // Device memory for `elements` values of T on the communication stream, kept for the next call
  // (grown, never shrunk).
  template <class T>
  T* scratch(std::size_t elements) {
    const std::size_t bytes = elements * sizeof(T);
    if (bytes > scratch_.size()) {
      scratch_ = device::cuda::Buffer<std::byte>();  // the old memory goes first
      scratch_ = device::cuda::Buffer<std::byte>(bytes, place());
    }
    return reinterpret_cast<T*>(scratch_.span().data());
  }

  // The deterministic reduce-scatter: chunk r of every rank's `input` (located by chunk_of(r))
  // travels to rank r by ncclSend/ncclRecv; rank r combines the size() chunks, ranks in the
  // canonical tree, into out.
  template <class T, class ChunkOf>
  void reduce_chunks(const T* input, ChunkOf chunk_of, T* out, ReduceOp op, const Call& call) {
    std::size_t widest = 0;
    for (int r = 0; r < size_; ++r) widest = std::max(widest, chunk_of(r).second);
    const std::size_t mine = chunk_of(rank_).second;
    T* slots = scratch<T>(widest * static_cast<std::size_t>(size_));
    group_start(call);
    for (int peer = 0; peer < size_; ++peer) {
      if (peer == rank_) continue;
      enqueue(ncclSend(input + chunk_of(peer).first, chunk_of(peer).second, nccl::data_type<T>(),
                       peer, comm(), communication()),
              call, "ncclSend");
      enqueue(ncclRecv(slots + peer * widest, mine, nccl::data_type<T>(), peer, comm(), communication()),
              call, "ncclRecv");
    }
    group_end(call);
    // Own chunk copied too: out may be where it lies (all_reduce), and reduce_tree's output
    // aliases no input.
    COHORT_CUDA_CHECK(cudaMemcpyAsync(slots + rank_ * widest, input + chunk_of(rank_).first,
                                      mine * sizeof(T), cudaMemcpyDeviceToDevice, communication()));
    std::vector<const T*> leaves(static_cast<std::size_t>(size_));
    for (int r = 0; r < size_; ++r) leaves[r] = slots + r * widest;
    cuda::reduce_tree<T>(op, std::span<const T* const>(leaves), out, mine, communication());
  }

  int rank_ = 0;
  int size_ = 0;
  Options options_{};
  std::optional<device::cuda::Stream> own_stream_;  // made when options.stream was nullptr
  // Every NCCL call, copy and reduction of the communicator runs here, so that the replica's
  // stream goes on with its own work meanwhile.
  std::optional<device::cuda::Stream> communication_;
  device::cuda::Event replica_ready_;  // recorded on the replica's stream by each call
  device::cuda::Event done_;           // recorded on the communication stream by wait()
  device::cuda::Buffer<std::byte> scratch_;         // the deterministic reduction's chunks
  device::cuda::Buffer<std::int32_t> barrier_word_;
  // Declared after what its work uses, so that it ends (finalized or aborted) before they go.
  nccl::Comm comm_;
  std::uint64_t sequence_ = 0;
  bool in_group_ = false;  // between group_start and group_end
  std::string failed_;     // empty while healthy; else why every later call fails
};
static_assert(Communicator<NcclCommunicator>);

// The group policy for one process driving several GPUs (Mirrored's shape): rank r on device r.
class Nccl {
 public:
  struct Options {
    int ranks = 1;
    std::chrono::milliseconds timeout{std::chrono::minutes(5)};
    bool deterministic = true;
  };

  explicit Nccl(Options options) : options_(options) {
    cohort::options::require_positive("ranks", options_.ranks);
    cohort::options::require_positive("timeout", options_.timeout.count());
    const int devices = device::cuda::device_count();
    if (options_.ranks > devices) {
      cohort::options::reject(
          "ranks", options_.ranks,
          "needs one GPU per rank; this process sees " + std::to_string(devices));
    }
    COHORT_NCCL_CHECK(ncclGetUniqueId(&id_));
  }

  // Rank `rank`'s communicator, on device `rank`, enqueuing on `stream` (a stream of that
  // device, which must outlive the communicator; nullptr: the communicator makes its own). Every
  // rank's thread calls it, concurrently: each returns once all have joined. A rank that fails
  // or aborts makes every other rank's call fail with its reason.
  NcclCommunicator communicator(int rank, cudaStream_t stream = nullptr) const {
    return NcclCommunicator(id_, rank, options_.ranks,
                            {.device = rank,
                             .stream = stream,
                             .timeout = options_.timeout,
                             .setup_timeout = options_.timeout,
                             .deterministic = options_.deterministic,
                             .group = failure_});
  }

  // For a rank that fails before it has a communicator (its set-up threw): every rank's call,
  // its set-up included, fails with the reason.
  void abort(int rank, std::string_view reason) const {
    failure_->raise("rank " + std::to_string(rank) + " aborted: " + std::string(reason));
  }

  const Options& options() const { return options_; }

 private:
  Options options_;
  ncclUniqueId id_{};
  std::shared_ptr<nccl::GroupFailure> failure_ = std::make_shared<nccl::GroupFailure>();
};

}  // namespace cohort::collective
