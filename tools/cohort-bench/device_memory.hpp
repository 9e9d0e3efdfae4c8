// The sweep's buffers in the memory of one GPU (a SweepMemory, sweep.hpp), for the nccl backend.
// CUDA builds only: it includes the CUDA runtime's header through device/cuda.hpp.
//
// The collective gets device::cuda::Buffer spans; the sweep fills and checks host mirrors of them,
// copied up after each fill and down after the checked call. Every copy is enqueued on
// place.stream, the communicator's own, so it is ordered with the communicator's calls, which
// enqueue there and return once their stream has done them.
#pragma once

#include <cstddef>
#include <span>
#include <vector>

#include "cohort/device/cuda.hpp"
#include "sweep.hpp"

namespace cohort::bench {

template <class T>
class DeviceMemory {
 public:
  using value_type = T;

  // place: the rank's GPU and the measured communicator's stream on it.
  explicit DeviceMemory(device::cuda::Place place) : place_(place) {}

  void allocate(std::size_t send, std::size_t receive) {
    // The old buffers go first: the GPU may not hold two sets of the largest size.
    send_ = {};
    receive_ = {};
    send_ = device::cuda::Buffer<T>(send, place_);
    receive_ = device::cuda::Buffer<T>(receive, place_);
    host_send_.assign(send, T{});
    host_receive_.assign(receive, T{});
  }

  std::span<T> send() { return send_.span(); }
  std::span<T> receive() { return receive_.span(); }
  std::span<T> host_send() { return host_send_; }
  std::span<T> host_receive() { return host_receive_; }

  // Each copy waits for the stream (device::Cuda::from_host and to_host synchronize), so the host
  // may refill its mirrors, or read them, as soon as these return.
  void upload(std::size_t send, std::size_t receive) {
    device::Cuda::from_host(place_, std::span<const T>(host_send_).first(send),
                            send_.span().first(send));
    device::Cuda::from_host(place_, std::span<const T>(host_receive_).first(receive),
                            receive_.span().first(receive));
  }
  void download(std::size_t send, std::size_t receive) {
    device::Cuda::to_host(place_, std::span<const T>(send_.span()).first(send),
                          std::span<T>(host_send_).first(send));
    device::Cuda::to_host(place_, std::span<const T>(receive_.span()).first(receive),
                          std::span<T>(host_receive_).first(receive));
  }

  // Device to device, enqueued on the communicator's stream and not waited for: the collective
  // called next enqueues behind it, and its wait, which the sweep times, covers the copy too.
  void copy(std::span<const T> from, std::span<T> to) { device::Cuda::copy(place_, from, to); }

 private:
  device::cuda::Place place_;
  device::cuda::Buffer<T> send_;
  device::cuda::Buffer<T> receive_;
  std::vector<T> host_send_;
  std::vector<T> host_receive_;
};
static_assert(SweepMemory<DeviceMemory<float>>);

}  // namespace cohort::bench
