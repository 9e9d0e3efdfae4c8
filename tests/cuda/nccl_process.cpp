// One process of the cross-process NCCL test (multi_worker_test.cpp): joins a NCCL group whose
// unique id travels over cohort's TCP transport, one rank per process on the GPU at its local
// rank, and checks every NcclCommunicator operation on small integers, whose sums are exact in
// any order: all_reduce (deterministic and NCCL's own), broadcast, all_gather, reduce_scatter,
// send and receive. Prints what was wrong and exits 1, else exits 0.
//   nccl_process        (COHORT_RANK, COHORT_WORLD_SIZE, COHORT_MASTER_PORT, ... as for training)
#include <chrono>
#include <cohort/cluster/cluster.hpp>
#include <cohort/collective/deterministic.hpp>
#include <cohort/collective/nccl.hpp>
#include <cohort/device/cuda.hpp>
#include <cohort/transport/tcp/tcp.hpp>
#include <cstdio>
#include <functional>
#include <span>
#include <string>
#include <vector>

namespace {

using cohort::collective::NcclCommunicator;
using cohort::device::Cuda;

constexpr std::size_t kLengths[] = {0, 1, 7, 4099, std::size_t{1} << 20};

// Rank r's element i: small integers, so every reduction order gives the same float.
float value(int rank, std::size_t i) { return static_cast<float>((i * 3 + rank * 5) % 17); }

class Checker {
 public:
  Checker(NcclCommunicator& comm, cohort::device::cuda::Place place) : comm_(comm), place_(place) {}

  // `values` of this rank on the GPU, run(buffer) there, then the result against expected(i).
  void check(const std::string& what, const std::vector<float>& values, std::size_t out_length,
             const std::function<void(std::span<const float>, std::span<float>)>& run,
             const std::function<float(std::size_t)>& expected) {
    Cuda::Buffer<float> input(values.size(), place_);
    Cuda::Buffer<float> output(out_length, place_);
    Cuda::from_host(place_, std::span<const float>(values), input.span());
    run(std::span<const float>(input.span()), output.span());
    std::vector<float> result(out_length);
    Cuda::to_host(place_, std::span<const float>(output.span()), std::span<float>(result));
    std::size_t wrong = 0;
    for (std::size_t i = 0; i < out_length; ++i) wrong += result[i] != expected(i) ? 1 : 0;
    if (wrong > 0) {
      std::fprintf(stderr, "rank %d: %s: %zu of %zu elements wrong\n", comm_.rank(), what.c_str(),
                   wrong, out_length);
      failed_ = true;
    }
  }

  bool failed() const { return failed_; }

 private:
  NcclCommunicator& comm_;
  cohort::device::cuda::Place place_;
  bool failed_ = false;
};

// Every operation of comm, at every length of kLengths.
bool check_every_operation(NcclCommunicator& comm, cohort::device::cuda::Place place) {
  Checker checker(comm, place);
  const int rank = comm.rank();
  const int size = comm.size();
  const auto sum_over_ranks = [size](std::size_t i) {
    float sum = 0.0f;
    for (int r = 0; r < size; ++r) sum += value(r, i);
    return sum;
  };
  for (const std::size_t n : kLengths) {
    const std::string at = " of " + std::to_string(n) +
                           (comm.options().deterministic ? " (deterministic)" : " (NCCL's own)");
    std::vector<float> mine(n);
    for (std::size_t i = 0; i < n; ++i) mine[i] = value(rank, i);
    // In place, so the input is copied to the output first.
    const auto in_place = [&](std::span<const float> input, std::span<float> output) {
      Cuda::copy(place, input, output);
    };
    checker.check(
        "all_reduce" + at, mine, n,
        [&](std::span<const float> input, std::span<float> output) {
          in_place(input, output);
          comm.all_reduce(output, cohort::ReduceOp::kSum);
        },
        sum_over_ranks);
    checker.check(
        "broadcast from rank 1" + at, mine, n,
        [&](std::span<const float> input, std::span<float> output) {
          in_place(input, output);
          comm.broadcast(output, 1);
        },
        [](std::size_t i) { return value(1, i); });
    checker.check(
        "all_gather" + at, mine, n * size,
        [&](std::span<const float> input, std::span<float> output) {
          comm.all_gather(input, output);
        },
        [n](std::size_t i) { return value(static_cast<int>(i / n), i % n); });
    std::vector<float> chunks(n * size);
    for (std::size_t i = 0; i < chunks.size(); ++i) chunks[i] = value(rank, i);
    checker.check(
        "reduce_scatter" + at, chunks, n,
        [&](std::span<const float> input, std::span<float> output) {
          comm.reduce_scatter(input, output, cohort::ReduceOp::kSum);
        },
        [&](std::size_t i) { return sum_over_ranks(rank * n + i); });
    // Rank 0 and rank 1 swap their values: the lower rank sends first.
    if (rank < 2 && size >= 2) {
      const int peer = 1 - rank;
      checker.check(
          "send and receive" + at, mine, n,
          [&](std::span<const float> input, std::span<float> output) {
            if (rank == 0) comm.send(input, peer);
            comm.receive(output, peer);
            if (rank == 1) comm.send(input, peer);
          },
          [peer](std::size_t i) { return value(peer, i); });
    }
  }
  return !checker.failed();
}

}  // namespace

int main() {
  try {
    const cohort::cluster::Spec spec = cohort::cluster::resolve({});
    std::fprintf(stderr, "nccl_process: %s, GPU %d\n", cohort::cluster::describe(spec).c_str(),
                 spec.local_rank);
    cohort::collective::Deterministic<cohort::transport::tcp::Tcp> bootstrap(
        cohort::transport::tcp::Tcp({.rank = spec.rank,
                                     .size = spec.size,
                                     .job_id = spec.job_id.empty() ? "cohort" : spec.job_id,
                                     .rendezvous_host = spec.master_address,
                                     .rendezvous_port = spec.master_port,
                                     .connect_timeout = std::chrono::seconds(30),
                                     .operation_timeout = std::chrono::seconds(60)}));
    const cohort::device::cuda::Stream stream(spec.local_rank);
    bool passed = true;
    for (const bool deterministic : {true, false}) {
      NcclCommunicator comm(cohort::collective::nccl_unique_id(bootstrap), spec.rank, spec.size,
                            {.device = spec.local_rank,
                             .stream = stream.place().stream,
                             .timeout = std::chrono::seconds(60),
                             .deterministic = deterministic});
      passed = check_every_operation(comm, stream.place()) && passed;
    }
    return passed ? 0 : 1;
  } catch (const std::exception& error) {
    std::fprintf(stderr, "error: %s\n", error.what());
    return 1;
  }
}
