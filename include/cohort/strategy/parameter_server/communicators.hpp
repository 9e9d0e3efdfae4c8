// The communicators a parameter-server worker's replicas hand the Trainer (strategy/strategy.hpp,
// replica.communicator()): under Sync the workers among themselves (WorkerView, under the
// mirrored strategies' hierarchical all-reduce), otherwise only a worker's own replicas
// (Independent: asynchronous workers never wait for each other). Servers take no part in them.
#pragma once

#include <span>
#include <string_view>
#include <type_traits>
#include <utility>

#include "cohort/collective/local.hpp"
#include "cohort/core/reduce_op.hpp"
#include "cohort/transport/transport.hpp"

namespace cohort::strategy::ps {

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
  void abort(std::string_view reason) { transport_->abort(reason); }

 private:
  Tr* transport_;
  int workers_;
};

// The communicator of an asynchronous worker's replicas: it never waits for the other workers.
// Collectives run among this worker's replicas only; a sum of doubles (the Trainer's loss window)
// returns this worker's sum times the number of workers, an estimate of the job's loss from this
// worker's share of each batch. abort also aborts the transport, so that the servers see this
// worker leave, and why.
template <transport::Transport Tr>
class Independent {
 public:
  Independent(Tr& transport, collective::LocalCommunicator local, int workers)
      : transport_(&transport), local_(std::move(local)), workers_(workers) {}
  int rank() const { return local_.rank(); }
  int size() const { return local_.size(); }
  template <class E>
  void all_reduce(std::span<E> buffer, ReduceOp op) {
    all_reduce(std::span<const E>(buffer), buffer, op);
  }
  template <class E>
  void all_reduce(std::span<const std::type_identity_t<E>> input, std::span<E> output,
                  ReduceOp op) {
    local_.all_reduce(input, output, op);
    if constexpr (std::is_same_v<E, double>) {
      if (op == ReduceOp::kSum) {
        for (double& value : output) value *= workers_;
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
    transport_->abort(reason);
  }

 private:
  Tr* transport_;
  collective::LocalCommunicator local_;
  int workers_;
};

}  // namespace cohort::strategy::ps
