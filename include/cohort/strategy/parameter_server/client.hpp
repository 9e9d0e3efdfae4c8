// The worker side of the parameter server's protocol (protocol.hpp): requests about chunks,
// queued with add() and sent together by transfer(), with the receives of their answers.
//
//   client.add({.operation = Operation::kPush, .step = s, .inverse_batch = 1.0 / B,
//               .element_bytes = sizeof(float)}, chunk, std::as_bytes(gradient_of_chunk));
//   client.transfer();   // pushes only: returns once they are sent
//   client.add({.operation = Operation::kPull, .element_bytes = sizeof(float)}, chunk, {},
//              std::as_writable_bytes(parameters_of_chunk));
//   client.transfer();   // returns with every answer in place
//
// Required of the caller: one thread at a time (the transport's rule); the spans stay valid until
// transfer() returns.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <span>
#include <string>
#include <vector>

#include "cohort/core/error.hpp"
#include "cohort/strategy/parameter_server/protocol.hpp"
#include "cohort/strategy/strategy.hpp"
#include "cohort/transport/transport.hpp"

namespace cohort::strategy::ps {

template <transport::Transport Tr>
class Client {
 public:
  Client(Tr& transport, int worker, int workers)
      : transport_(transport), worker_(worker), workers_(workers) {}

  // What a request asks, beyond its chunk.
  struct Call {
    Operation operation;
    // kPush: the Trainer's step; kInit: the run's step; kPull: the updates the parameters hold
    std::uint64_t step = 0;
    double inverse_batch = 1.0;     // kPush: the scale the server applies to it
    std::size_t element_bytes = 0;  // sizeof(T)
    std::uint16_t flags = 0;        // kDone: kPreempted or kCheckpoint; its step is the run's
    std::uint32_t leaves = 1;       // kPush: the micro-batches it sums
  };

  // Queues a request about `chunk` that carries `payload`; the payload of its answer lands in
  // `reply`. A push is not answered (protocol.hpp): give it no reply.
  void add(const Call& call, const Chunk& chunk, std::span<const std::byte> payload,
           std::span<std::byte> reply = {}) {
    Request request;
    request.operation = static_cast<std::uint16_t>(call.operation);
    request.element_bytes = static_cast<std::uint16_t>(call.element_bytes);
    request.worker = static_cast<std::uint32_t>(worker_);
    request.shard = static_cast<std::uint32_t>(chunk.server);
    request.chunk = static_cast<std::uint32_t>(chunk.index);
    request.leaves = call.leaves;
    request.step = call.step;
    request.length = chunk.size();
    request.payload_bytes = payload.size();
    request.reply_bytes = reply.size();
    request.inverse_batch = call.inverse_batch;
    request.flags = call.flags;
    queue_.push_back({request, chunk.server, payload, reply});
  }

  // Sends every queued request and receives every answer, in one transfer (so that the servers
  // work in parallel and, within a server, the requests pipeline), then empties the queue. A
  // transfer of pushes only returns once they are sent. Throws CommError whose peer() is the
  // server whose connection failed (the transport's peer()) or that refused a request; a server
  // that ends the run answers with why (a Sync server names the worker that stalled), which the
  // error quotes. Throws ConfigError, after telling every process, when a server found the job's
  // settings to differ (protocol.hpp).
  void transfer() {
    // The queue empties now, so that the next transfer starts empty even after a failure; the
    // requests stay in in_flight_, which the transfer's spans point into.
    in_flight_.swap(queue_);
    queue_.clear();
    replies_.assign(in_flight_.size(), Reply{});
    sends_.clear();
    receives_.clear();
    for (std::size_t i = 0; i < in_flight_.size(); ++i) {
      const Queued& queued = in_flight_[i];
      const int peer = workers_ + queued.server;
      sends_.push_back({peer, header(tag::kRequest), std::as_bytes(std::span(&queued.request, 1))});
      sends_.push_back({peer, header(tag::kRequestPayload), queued.payload});
      if (!answered(queued)) continue;
      receives_.push_back(
          {peer, header(tag::kReply), std::as_writable_bytes(std::span(&replies_[i], 1))});
      receives_.push_back({peer, header(tag::kReplyPayload), queued.reply});
    }
    try {
      transport_.transfer(sends_, receives_);
    } catch (const CommError& error) {
      fail(error);
    }
    // Settings that differ are the cause, whatever else the servers answered.
    for (std::size_t i = 0; i < in_flight_.size(); ++i) {
      if (answered(in_flight_[i]) && replies_[i].status == kSettingsDiffer) {
        differ(replies_[i]);
      }
    }
    for (std::size_t i = 0; i < in_flight_.size(); ++i) {
      if (!answered(in_flight_[i])) continue;
      const Reply& reply = replies_[i];
      const Request& request = in_flight_[i].request;
      const auto refusal = [&](std::string detail) {
        return CommError({.rank = transport_.rank(),
                          .peer = workers_ + in_flight_[i].server,
                          .operation = std::string(name(static_cast<Operation>(request.operation))),
                          .detail = std::move(detail)});
      };
      if (reply.status != 0)
        throw refusal("refused: " + quote_peer_text(message_text(reply.message)));
      if ((reply.flags & kPreempted) != 0) preemption_heard_ = true;
      if (reply.operation != request.operation || reply.chunk != request.chunk) {
        throw refusal("the request for chunk " + std::to_string(request.chunk) + " of shard " +
                      std::to_string(request.shard) + " was answered for chunk " +
                      std::to_string(reply.chunk) + " (operation " +
                      std::to_string(reply.operation) + "): the answers came out of order");
      }
    }
  }

  // Presents this worker's settings (settings::encode's bytes) to each of the job's `servers`
  // servers: its first request of a fit (protocol.hpp).
  void present(std::span<const std::byte> settings, int servers) {
    to_every_server({.operation = Operation::kSettings}, servers, settings);
  }

  // Tells each of the job's `servers` servers that this worker's fit (or a segment of it) has
  // ended, and how.
  void done(int servers, FitEnd end, std::uint64_t step) {
    const std::uint16_t flags = end == FitEnd::kPreempted    ? kPreempted
                                : end == FitEnd::kCheckpoint ? kCheckpoint
                                : end == FitEnd::kAdmit      ? kAdmit
                                                             : std::uint16_t{0};
    to_every_server({.operation = Operation::kDone, .step = step, .flags = flags}, servers);
  }

  // A worker's process started again for its place: the step its fit goes on from, the earliest
  // each of the job's `servers` servers names (protocol.hpp, kResume); `own` where none does (no
  // server holds a chunk).
  std::uint64_t resume(int servers, std::uint64_t own) {
    to_every_server({.operation = Operation::kResume}, servers);
    std::uint64_t step = ~std::uint64_t{0};
    for (const Reply& reply : replies_) step = std::min(step, reply.updates);
    return step == ~std::uint64_t{0} ? own : step;
  }

  // The chief of a job that takes workers back, its own steps done: how many other workers the
  // job's `servers` servers still hear from or wait for (the most any names; protocol.hpp,
  // kWorking), counting one lost less than `grace` ago.
  std::uint64_t working(int servers, std::chrono::milliseconds grace) {
    to_every_server(
        {.operation = Operation::kWorking, .step = static_cast<std::uint64_t>(grace.count())},
        servers);
    std::uint64_t working = 0;
    for (const Reply& reply : replies_) working = std::max(working, reply.updates);
    return working;
  }

  // Whether an answer so far said that its server was signalled (protocol.hpp, preemption).
  bool preemption_heard() const { return preemption_heard_; }

  // A raw exchange of hand-made requests with one server: the tests of the server's validation.
  Reply send_raw(int server, const Request& request, std::span<const std::byte> payload,
                 std::span<std::byte> reply_payload) {
    Reply reply;
    const int peer = workers_ + server;
    const transport::Send sends[] = {
        {peer, header(tag::kRequest), std::as_bytes(std::span(&request, 1))},
        {peer, header(tag::kRequestPayload), payload}};
    const transport::Receive receives[] = {
        {peer, header(tag::kReply), std::as_writable_bytes(std::span(&reply, 1))},
        {peer, header(tag::kReplyPayload), reply_payload}};
    transport_.transfer(sends, receives);
    return reply;
  }

 private:
  struct Queued {
    Request request;
    int server;
    std::span<const std::byte> payload;
    std::span<std::byte> reply;
  };

  // One request about no chunk, `call` with `payload`, to each of the job's `servers` servers,
  // in one transfer; their answers are in replies_, in server order.
  void to_every_server(const Call& call, int servers, std::span<const std::byte> payload = {}) {
    for (int server = 0; server < servers; ++server) {
      add(call, Chunk{.server = server, .index = 0, .begin = 0, .end = 0}, payload);
    }
    transfer();
  }

  static bool answered(const Queued& queued) {
    return queued.request.operation != static_cast<std::uint16_t>(Operation::kPush);
  }

  // "parameter server 1 (rank 5)": the process at mesh rank `rank` (servers follow the workers).
  std::string peer_name(int rank) const {
    if (rank < workers_) return "rank " + std::to_string(rank);
    return "parameter server " + std::to_string(rank - workers_) + " (rank " +
           std::to_string(rank) + ")";
  }

  // A transfer that failed (at the server that error.peer() names, if one): every other process
  // learns the first cause (so that a surviving server's error names the process that failed,
  // not this worker), then this worker throws it.
  [[noreturn, gnu::cold]] void fail(const CommError& error) {
    const std::string server = error.peer() >= 0 ? peer_name(error.peer()) : "a parameter server";
    const CommError failure({.rank = transport_.rank(),
                             .peer = error.peer(),
                             .operation = describe(),
                             .detail = "failed at " + server + ": " + std::string(error.detail())});
    transport_.leave(failure.what());
    throw failure;
  }

  // A server's sentence naming the setting that differs: every other process learns it, then
  // this worker throws it.
  [[noreturn, gnu::cold]] void differ(const Reply& reply) {
    const std::string message(std::begin(reply.message),
                              std::find(std::begin(reply.message), std::end(reply.message), '\0'));
    transport_.leave(message);
    throw ConfigError(message);
  }

  // "push", "push and pull": the operations in flight, for errors.
  std::string describe() const {
    std::string text;
    std::uint32_t seen = 0;
    for (const Queued& queued : in_flight_) {
      const std::uint32_t bit = 1u << queued.request.operation;
      if ((seen & bit) != 0) continue;
      seen |= bit;
      text += (text.empty() ? "" : " and ") +
              std::string(name(static_cast<Operation>(queued.request.operation)));
    }
    return text.empty() ? "nothing" : text;
  }

  Tr& transport_;
  int worker_;
  int workers_;
  std::vector<Queued> queue_;
  std::vector<Queued> in_flight_;
  std::vector<Reply> replies_;
  std::vector<transport::Send> sends_;
  std::vector<transport::Receive> receives_;
  bool preemption_heard_ = false;
};

}  // namespace cohort::strategy::ps
