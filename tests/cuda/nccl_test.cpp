// collective::NcclCommunicator between the GPUs of this machine, one thread per GPU (Gloo's
// spawn). Inputs are small integers, so every sum is exact and checked with ==.
#include "cohort/collective/nccl.hpp"

#include <doctest/doctest.h>

#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <latch>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "cohort/collective/local.hpp"
#include "gpu.hpp"

namespace {

using namespace std::chrono_literals;
using cohort::collective::Nccl;
using cohort::collective::NcclCommunicator;
using cohort::test::DeviceBuffer;
using cohort::test::gpu_only;
using cohort::test::gpus_only;
using cohort::test::kTestTimeout;
using Clock = std::chrono::steady_clock;

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

// Rank r's element i of the exact-sum tests, and the sum over `ranks` ranks.
float small_integer(std::size_t i, int rank) { return static_cast<float>((i + rank) % 17); }
float sum_of_small_integers(std::size_t i, int ranks) {
  float sum = 0.0f;
  for (int r = 0; r < ranks; ++r) sum += small_integer(i, r);
  return sum;
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

TEST_CASE("nccl start_all_reduce gives all_reduce's sums with several pending at once" *
          gpu_only()) {
  const int ranks = cohort::device::cuda::device_count();
  for (const bool deterministic : {true, false}) {
    CAPTURE(deterministic);
    const Nccl group({.ranks = ranks, .timeout = kTestTimeout, .deterministic = deterministic});
    spawn(ranks, [&](int rank) {
      NcclCommunicator comm = group.communicator(rank);
      cohort::device::cuda::check(cudaSetDevice(rank), "cudaSetDevice");
      const std::vector<std::size_t> lengths = {7, 4099, std::size_t{1} << 16, 0};
      std::vector<std::unique_ptr<DeviceBuffer<float>>> buffers;
      std::vector<cohort::collective::Pending> pending;
      for (const std::size_t n : lengths) {
        std::vector<float> values(n);
        for (std::size_t i = 0; i < n; ++i) values[i] = small_integer(i, rank);
        buffers.push_back(std::make_unique<DeviceBuffer<float>>(values));
        pending.push_back(comm.start_all_reduce(std::span<float>(buffers.back()->data(), n),
                                                cohort::ReduceOp::kSum));
      }
      for (cohort::collective::Pending& each : pending) each.wait();
      for (std::size_t b = 0; b < lengths.size(); ++b) {
        const std::vector<float> result = buffers[b]->download();
        std::vector<float> expected(lengths[b]);
        for (std::size_t i = 0; i < lengths[b]; ++i) expected[i] = sum_of_small_integers(i, ranks);
        CHECK(result == expected);
      }
    });
  }
}

// The communicator's work runs on a stream of its own: each call must first wait for what the
// replica enqueued on its stream before the call. A large upload enqueued on the replica's stream
// just before start_all_reduce, never synchronized by the host, is still in flight when the
// all-reduce is enqueued: without that wait the sums would read the zeros it overwrites.
TEST_CASE("nccl start_all_reduce waits for the work on the replica's stream before it" *
          gpu_only()) {
  const int ranks = cohort::device::cuda::device_count();
  const Nccl group({.ranks = ranks, .timeout = kTestTimeout});
  spawn(ranks, [&](int rank) {
    cohort::device::cuda::check(cudaSetDevice(rank), "cudaSetDevice");
    const cohort::device::cuda::Stream replica(rank, kTestTimeout);
    NcclCommunicator comm = group.communicator(rank, replica.get());
    const std::size_t n = std::size_t{1} << 24;
    float* host = nullptr;
    cohort::device::cuda::check(cudaMallocHost(reinterpret_cast<void**>(&host), n * sizeof(float)),
                                "cudaMallocHost");
    const std::unique_ptr<float, decltype(&cudaFreeHost)> pinned(host, &cudaFreeHost);
    for (std::size_t i = 0; i < n; ++i) host[i] = small_integer(i, rank);
    DeviceBuffer<float> buffer(std::vector<float>(n, 0.0f));
    cohort::device::cuda::check(cudaMemcpyAsync(buffer.data(), host, n * sizeof(float),
                                                cudaMemcpyHostToDevice, replica.get()),
                                "cudaMemcpyAsync");
    comm.start_all_reduce(std::span<float>(buffer.data(), n), cohort::ReduceOp::kSum).wait();
    const std::vector<float> result = buffer.download();
    std::size_t wrong = 0;
    for (std::size_t i = 0; i < n; ++i) wrong += result[i] != sum_of_small_integers(i, ranks);
    CHECK(wrong == 0);
  });
}

TEST_CASE("a moved NcclCommunicator keeps working and the moved-from one owns nothing" *
          gpu_only()) {
  const Nccl group({.ranks = 1, .timeout = kTestTimeout});
  std::optional<NcclCommunicator> first(group.communicator(0));
  const cudaStream_t stream = first->stream();
  NcclCommunicator second = std::move(*first);
  first.reset();  // the moved-from shell ends without touching what second owns
  CHECK(second.stream() == stream);
  cohort::device::cuda::check(cudaSetDevice(0), "cudaSetDevice");
  DeviceBuffer<float> values(std::vector<float>{1.0f, 2.0f, 3.0f});
  second.all_reduce(std::span<float>(values.data(), values.size()), cohort::ReduceOp::kSum);
  second.barrier();
  const Nccl other_group({.ranks = 1, .timeout = kTestTimeout});
  NcclCommunicator third = other_group.communicator(0);
  third = std::move(second);  // third's own communicator ends; second's lives on in third
  third.all_reduce(std::span<float>(values.data(), values.size()), cohort::ReduceOp::kSum);
  third.barrier();
  CHECK(values.download() == std::vector<float>{1.0f, 2.0f, 3.0f});
}

TEST_CASE(
    "a synchronous set-up failure on one rank fails the other's set-up at once with its reason" *
    gpu_only()) {
  ncclUniqueId id{};
  COHORT_NCCL_CHECK(ncclGetUniqueId(&id));
  const auto failure = std::make_shared<cohort::collective::nccl::GroupFailure>();
  // Rank 1 names a GPU that does not exist: its set-up throws before it ever reaches NCCL.
  const int no_such_gpu = cohort::device::cuda::device_count();
  std::string waiting_rank_error;
  spawn(2, [&](int rank) {
    const NcclCommunicator::Options options{.device = rank == 0 ? 0 : no_such_gpu,
                                            .timeout = kTestTimeout,
                                            .setup_timeout = kTestTimeout,
                                            .group = failure};
    if (rank == 1) {
      CHECK_THROWS_AS(NcclCommunicator(id, 1, 2, options), cohort::DeviceError);
      return;
    }
    try {
      NcclCommunicator comm(id, 0, 2, options);
    } catch (const cohort::CommError& error) {
      waiting_rank_error = error.what();
    }
  });
  CAPTURE(waiting_rank_error);
  CHECK(waiting_rank_error.find("nccl rank 1 of 2: set-up failed") != std::string::npos);
  CHECK(waiting_rank_error.find("cudaSetDevice") != std::string::npos);
}

TEST_CASE(
    "nccl teardown with an all-reduce its peer never joins aborts within the timeout instead of "
    "hanging" *
    gpus_only(2)) {
  const cohort::test::HangGuard guard("nccl teardown with an unjoined all-reduce", 120s);
  constexpr auto kTimeout = 3s;
  const Nccl group({.ranks = 2, .timeout = kTimeout});
  std::latch rank_0_ended(1);
  Clock::duration teardown{};
  spawn(2, [&](int rank) {
    // Counted down however rank 0's part ends, so that rank 1 never waits for it forever.
    struct Ended {
      std::latch& latch;
      int rank;
      ~Ended() {
        if (rank == 0) latch.count_down();
      }
    } ended{rank_0_ended, rank};
    cohort::device::cuda::check(cudaSetDevice(rank), "cudaSetDevice");
    // Before the communicator: freeing memory that a pending kernel uses would wait for it.
    DeviceBuffer<float> buffer(std::vector<float>(4099, 1.0f));
    const std::span<float> values(buffer.data(), buffer.size());
    std::optional<NcclCommunicator> comm(group.communicator(rank));
    comm->all_reduce(values, cohort::ReduceOp::kSum);  // both ranks: NCCL's connections are up
    if (rank == 1) {
      rank_0_ended.wait();
      return;
    }
    // Enqueued and never waited for: rank 1 does not join, so NCCL can never finalize.
    (void)comm->start_all_reduce(values, cohort::ReduceOp::kSum);
    const auto start = Clock::now();
    comm.reset();
    teardown = Clock::now() - start;
  });
  CHECK(teardown < 10 * kTimeout);
}
