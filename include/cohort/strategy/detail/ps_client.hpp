// The worker side of the parameter server: one request per chunk, every chunk of every server in
// one transfer, so that the servers work in parallel and, within a server, the chunks pipeline.
// Also the communicators a worker's replica hands the Trainer: the workers among themselves
// (Sync: WorkerView, under the mirrored strategies' hierarchical all-reduce), or only a worker's
// own replicas (asynchronous workers never wait for each other).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "cohort/collective/local.hpp"
#include "cohort/core/error.hpp"
#include "cohort/core/reduce_op.hpp"
#include "cohort/strategy/detail/ps_protocol.hpp"
#include "cohort/transport/transport.hpp"

namespace cohort::strategy::detail::ps {

// "parameter server 1 (rank 5)" for the first rank of a server named in a transport message.
inline std::string name_server(std::string_view message, int workers, int self) {
  for (std::size_t at = message.find("rank "); at != std::string_view::npos;
       at = message.find("rank ", at + 5)) {
    std::size_t end = at + 5;
    int rank = 0;
    bool digits = false;
    while (end < message.size() && message[end] >= '0' && message[end] <= '9') {
      rank = rank * 10 + (message[end] - '0');
      ++end;
      digits = true;
    }
    if (digits && rank >= workers && rank != self) {
      return "parameter server " + std::to_string(rank - workers) + " (rank " +
             std::to_string(rank) + ")";
    }
  }
  return "a parameter server";
}

template <transport::Transport Tr>
class Client {
 public:
  Client(Tr& transport, const Layout& layout, int worker, int workers)
      : transport_(transport), layout_(layout), worker_(worker), workers_(workers) {}

  struct Call {
    Operation operation;
    std::uint64_t step = 0;
    double inverse_batch = 1.0;
    std::size_t element_bytes = 4;
    std::size_t slots = 0;
  };

  // One request for every chunk; payload(chunk) and reply(chunk) give its bytes.
  void exchange(const Call& call,
                const std::function<std::span<const std::byte>(const Chunk&)>& payload,
                const std::function<std::span<std::byte>(const Chunk&)>& reply) {
    const auto& chunks = layout_.chunks();
    requests_.assign(chunks.size(), Request{});
    replies_.assign(chunks.size(), Reply{});
    sends_.clear();
    receives_.clear();
    for (std::size_t i = 0; i < chunks.size(); ++i) {
      const Chunk& chunk = chunks[i];
      Request& request = requests_[i];
      request.operation = static_cast<std::uint16_t>(call.operation);
      request.element_bytes = static_cast<std::uint16_t>(call.element_bytes);
      request.worker = static_cast<std::uint32_t>(worker_);
      request.shard = static_cast<std::uint32_t>(chunk.server);
      request.chunk = chunk.index;
      request.step = call.step;
      request.length = chunk.size();
      const auto bytes = payload(chunk);
      const auto answer = reply(chunk);
      request.payload_bytes = bytes.size();
      request.reply_bytes = answer.size();
      request.inverse_batch = call.inverse_batch;
      const int peer = workers_ + chunk.server;
      sends_.push_back({peer, header(tag::kRequest), std::as_bytes(std::span(&request, 1))});
      sends_.push_back({peer, header(tag::kRequestPayload), bytes});
      receives_.push_back(
          {peer, header(tag::kReply), std::as_writable_bytes(std::span(&replies_[i], 1))});
      receives_.push_back({peer, header(tag::kReplyPayload), answer});
    }
    run(call.operation);
  }

  // Tells every server that this worker's fit has ended.
  void done() {
    requests_.assign(static_cast<std::size_t>(layout_.servers()), Request{});
    replies_.assign(requests_.size(), Reply{});
    sends_.clear();
    receives_.clear();
    for (std::size_t server = 0; server < requests_.size(); ++server) {
      Request& request = requests_[server];
      request.operation = static_cast<std::uint16_t>(Operation::kDone);
      request.worker = static_cast<std::uint32_t>(worker_);
      request.shard = static_cast<std::uint32_t>(server);
      const int peer = workers_ + static_cast<int>(server);
      sends_.push_back({peer, header(tag::kRequest), std::as_bytes(std::span(&request, 1))});
      sends_.push_back({peer, header(tag::kRequestPayload), {}});
      receives_.push_back(
          {peer, header(tag::kReply), std::as_writable_bytes(std::span(&replies_[server], 1))});
      receives_.push_back({peer, header(tag::kReplyPayload), {}});
    }
    run(Operation::kDone);
  }

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
  void run(Operation operation) {
    try {
      transport_.transfer(sends_, receives_);
    } catch (const CommError& error) {
      const std::string message =
          "worker " + std::to_string(worker_) + ": " + std::string(name(operation)) +
          " failed: " + name_server(error.what(), workers_, transport_.rank()) +
          " is gone or broke the protocol: " + error.what();
      // Every other process learns the first cause, so that a surviving server's error names
      // the server that died, not this worker.
      transport_.leave(message);
      throw CommError(message);
    }
    for (const Reply& reply : replies_) {
      if (reply.status != 0) {
        throw CommError("worker " + std::to_string(worker_) + ": " + std::string(name(operation)) +
                        " refused: " + reply.message);
      }
    }
  }

  Tr& transport_;
  const Layout& layout_;
  int worker_;
  int workers_;
  std::vector<Request> requests_;
  std::vector<Reply> replies_;
  std::vector<transport::Send> sends_;
  std::vector<transport::Receive> receives_;
};

// The workers' part of the job's transport: workers are ranks 0 .. W-1 of the mesh, so the view
// only shrinks its size (servers never take part in the workers' collectives).
template <transport::Transport Tr>
class WorkerView {
 public:
  WorkerView(Tr& transport, int workers) : transport_(&transport), workers_(workers) {}
  int rank() const { return transport_->rank(); }
  int size() const { return workers_; }
  void transfer(std::span<const transport::Send> sends,
                std::span<const transport::Receive> receives) {
    transport_->transfer(sends, receives);
  }
  void close() { transport_->close(); }
  void leave(std::string_view reason) { transport_->leave(reason); }

 private:
  Tr* transport_;
  int workers_;
};

// The communicator of an asynchronous worker's replicas: it never waits for the other workers.
// Collectives run among this worker's replicas only; a sum of doubles (the Trainer's loss window)
// returns this worker's sum times the number of workers, an estimate of the job's loss from this
// worker's share of each batch. abort also closes the transport, so that the servers see this
// worker leave.
template <transport::Transport Tr>
class Independent {
 public:
  Independent(Tr& transport, collective::LocalCommunicator local, int workers)
      : transport_(&transport), local_(std::move(local)), workers_(workers) {}
  int rank() const { return local_.rank(); }
  int size() const { return local_.size(); }
  template <class E>
  void all_reduce(std::span<E> buffer, ReduceOp op) {
    local_.all_reduce(buffer, op);
    if constexpr (std::is_same_v<E, double>) {
      if (op == ReduceOp::kSum) {
        for (double& value : buffer) value *= workers_;
      }
    }
  }
  template <class E>
  void broadcast(std::span<E> buffer, int root) {
    local_.broadcast(buffer, root);
  }
  template <class E>
  void all_gather(std::span<const E> input, std::span<E> output) {
    local_.all_gather(input, output);
  }
  template <class E>
  void reduce_scatter(std::span<const E> input, std::span<E> output, ReduceOp op) {
    local_.reduce_scatter(input, output, op);
  }
  void barrier() { local_.barrier(); }
  void abort(std::string_view reason) {
    local_.abort(reason);
    transport_->close();
  }

 private:
  Tr* transport_;
  collective::LocalCommunicator local_;
  int workers_;
};

}  // namespace cohort::strategy::detail::ps
