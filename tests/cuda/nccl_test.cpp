// collective::NcclCommunicator between the GPUs of this machine, one thread per GPU (Gloo's
// spawn). Inputs are small integers, so every sum is exact and checked with ==.
#include "cohort/collective/nccl.hpp"

#include <doctest/doctest.h>

#include <cstdint>
#include <exception>
#include <functional>
#include <thread>
#include <vector>

#include "cohort/collective/local.hpp"
#include "gpu.hpp"

namespace {

using cohort::collective::Nccl;
using cohort::collective::NcclCommunicator;
using cohort::test::DeviceBuffer;
using cohort::test::gpu_only;
using cohort::test::gpus_only;
using cohort::test::kTestTimeout;

// Runs body(rank) on one thread per rank; rethrows the first exception.
void spawn(int ranks, const std::function<void(int)>& body) {
  std::vector<std::exception_ptr> errors(ranks);
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r) {
    threads.emplace_back([&, r] {
      try {
        body(r);
      } catch (...) {
        errors[r] = std::current_exception();
      }
    });
  }
  for (auto& thread : threads) thread.join();
  for (auto& error : errors) {
    if (error) std::rethrow_exception(error);
  }
}

void check_all_reduce(bool deterministic) {
  const int ranks = cohort::device::cuda::device_count();
  const Nccl group({.ranks = ranks, .timeout = kTestTimeout, .deterministic = deterministic});
  spawn(ranks, [&](int rank) {
    NcclCommunicator comm = group.communicator(rank);
    for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{4099},
                          std::size_t{1} << 20}) {
      std::vector<float> values(n);
      std::vector<float> expected(n);
      for (std::size_t i = 0; i < n; ++i) {
        values[i] = static_cast<float>((i + rank) % 17);
        float sum = 0.0f;
        for (int r = 0; r < ranks; ++r) sum += static_cast<float>((i + r) % 17);
        expected[i] = sum;
      }
      cohort::device::cuda::check(cudaSetDevice(rank), "cudaSetDevice");
      DeviceBuffer<float> buffer(values);
      comm.all_reduce(std::span<float>(buffer.data(), n), cohort::ReduceOp::kSum);
      CHECK(buffer.download() == expected);
    }
    comm.barrier();
  });
}

}  // namespace

TEST_CASE("nccl all_reduce sums small integers exactly over every local GPU" * gpu_only()) {
  check_all_reduce(false);
}

TEST_CASE("nccl deterministic all_reduce sums small integers exactly over every local GPU" *
          gpu_only()) {
  check_all_reduce(true);
}

TEST_CASE("nccl deterministic reduce_scatter gives rank r the tree sum of chunk r" * gpu_only()) {
  const int ranks = cohort::device::cuda::device_count();
  const Nccl group({.ranks = ranks, .timeout = kTestTimeout});
  spawn(ranks, [&](int rank) {
    NcclCommunicator comm = group.communicator(rank);
    const std::size_t count = 4099;
    std::vector<double> input(count * ranks);
    for (std::size_t i = 0; i < input.size(); ++i) input[i] = static_cast<double>(i % 5 + rank);
    cohort::device::cuda::check(cudaSetDevice(rank), "cudaSetDevice");
    DeviceBuffer<double> d_input(input);
    DeviceBuffer<double> d_output(count);
    comm.reduce_scatter(std::span<const double>(d_input.data(), input.size()),
                        std::span<double>(d_output.data(), count), cohort::ReduceOp::kSum);
    const std::vector<double> output = d_output.download();
    for (std::size_t i = 0; i < count; ++i) {
      double sum = 0.0;
      for (int r = 0; r < ranks; ++r) sum += static_cast<double>((rank * count + i) % 5 + r);
      REQUIRE(output[i] == sum);
    }
  });
}

TEST_CASE("nccl unique id travels over a CPU communicator" * gpu_only()) {
  const int ranks = cohort::device::cuda::device_count();
  const cohort::collective::Local bootstrap({.ranks = ranks});
  spawn(ranks, [&](int rank) {
    auto cpu = bootstrap.communicator(rank);
    const ncclUniqueId id = cohort::collective::nccl_unique_id(cpu);
    NcclCommunicator comm(id, rank, ranks, {.device = rank, .timeout = kTestTimeout});
    cohort::device::cuda::check(cudaSetDevice(rank), "cudaSetDevice");
    DeviceBuffer<std::int64_t> word(std::vector<std::int64_t>{rank + 1});
    comm.all_reduce(std::span<std::int64_t>(word.data(), 1), cohort::ReduceOp::kSum);
    CHECK(word.download()[0] == static_cast<std::int64_t>(ranks) * (ranks + 1) / 2);
  });
}

TEST_CASE("nccl send and receive swap buffers between 2 GPUs" * gpus_only(2)) {
  const Nccl group({.ranks = 2, .timeout = kTestTimeout});
  spawn(2, [&](int rank) {
    NcclCommunicator comm = group.communicator(rank);
    cohort::device::cuda::check(cudaSetDevice(rank), "cudaSetDevice");
    const std::size_t n = 4099;
    const auto values = [n](int r) {
      std::vector<float> v(n);
      for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<float>(i * 3 + r);
      return v;
    };
    DeviceBuffer<float> mine(values(rank));
    DeviceBuffer<float> theirs(n);
    const int peer = 1 - rank;
    // The lower rank sends first: a send waits for its receive.
    if (rank == 0) comm.send(std::span<const float>(mine.data(), n), peer);
    comm.receive(std::span<float>(theirs.data(), n), peer);
    if (rank == 1) comm.send(std::span<const float>(mine.data(), n), peer);
    CHECK(theirs.download() == values(peer));
  });
}

TEST_CASE("nccl send to its own rank is a CommError naming the peer" * gpu_only()) {
  const Nccl group({.ranks = 1, .timeout = kTestTimeout});
  NcclCommunicator comm = group.communicator(0);
  CHECK_THROWS_WITH_AS(comm.send(std::span<const float>(), 0),
                       doctest::Contains("send #1: peer 0 is not another rank"), cohort::CommError);
}

TEST_CASE("nccl calls after abort throw CommError naming the reason" * gpu_only()) {
  const Nccl group({.ranks = 1});
  NcclCommunicator comm = group.communicator(0);
  comm.abort("test");
  CHECK_THROWS_WITH_AS(comm.barrier(), doctest::Contains("aborted: test"), cohort::CommError);
}
