// A communicator over memory at a device place, made of a communicator over host memory: every
// operation copies its spans to the host, runs there and copies the results back. It serves the
// Trainer's few small collectives (the loss windows) for replicas whose communication goes over
// the host anyway (a parameter server's GPU workers); bulk data stages its own buffers.
#pragma once

#include <span>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "cohort/core/reduce_op.hpp"
#include "cohort/device/device.hpp"

namespace cohort::strategy::detail {

template <class Host, device::Device D>
class StagedCommunicator {
 public:
  StagedCommunicator(Host host, typename D::Place place) : host_(std::move(host)), place_(place) {}

  int rank() const { return host_.rank(); }
  int size() const { return host_.size(); }

  template <class E>
  void all_reduce(std::span<E> buffer, ReduceOp op) {
    all_reduce(std::span<const E>(buffer), buffer, op);
  }
  template <class E>
  void all_reduce(std::span<const std::type_identity_t<E>> input, std::span<E> output,
                  ReduceOp op) {
    auto staged = to_host(input);
    std::vector<E> reduced(output.size());
    host_.all_reduce(std::span<const E>(staged), std::span<E>(reduced), op);
    D::from_host(place_, std::span<const E>(reduced), output);
  }
  template <class E>
  void broadcast(std::span<E> buffer, int root) {
    auto staged = to_host(std::span<const E>(buffer));
    host_.broadcast(std::span<E>(staged), root);
    D::from_host(place_, std::span<const E>(staged), buffer);
  }
  template <class E>
  void all_gather(std::span<const E> input, std::span<E> output) {
    const auto staged = to_host(input);
    std::vector<E> gathered(output.size());
    host_.all_gather(std::span<const E>(staged), std::span<E>(gathered));
    D::from_host(place_, std::span<const E>(gathered), output);
  }
  template <class E>
  void reduce_scatter(std::span<const E> input, std::span<E> output, ReduceOp op) {
    const auto staged = to_host(input);
    std::vector<E> scattered(output.size());
    host_.reduce_scatter(std::span<const E>(staged), std::span<E>(scattered), op);
    D::from_host(place_, std::span<const E>(scattered), output);
  }
  void barrier() { host_.barrier(); }
  void abort(std::string_view reason) { host_.abort(reason); }

 private:
  template <class E>
  std::vector<E> to_host(std::span<const E> values) {
    std::vector<E> host(values.size());
    D::to_host(place_, values, std::span<E>(host));
    return host;
  }

  Host host_;
  typename D::Place place_;
};

}  // namespace cohort::strategy::detail
