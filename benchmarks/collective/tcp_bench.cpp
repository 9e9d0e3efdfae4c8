// All-reduce between processes over TCP on 127.0.0.1: collective::Deterministic (the default)
// and collective::Ring, float sum, 2 and 4 processes, 4 KiB, 1 MiB and 64 MiB per rank.
//
// The benchmark process is rank 0; ranks 1..n-1 are forked from it each time the benchmark runs,
// and run the same sequence of collectives (they know the iteration count from the fork). Every
// iteration is one all-reduce timed on rank 0 (manual time); ranks run back to back, as in
// nccl-tests' timing loop.
//
// Counters (nccl-tests' definitions):
//   bytes   per-rank buffer bytes
//   algbw   bytes / time, GB/s
//   busbw   algbw x 2(n-1)/n, GB/s
//   wrong   elements that differ from the exact sum in a fresh all-reduce after the timed ones
#include <benchmark/benchmark.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cohort/collective/deterministic.hpp>
#include <cohort/collective/ring.hpp>
#include <cohort/transport/tcp/tcp.hpp>
#include <cstdio>
#include <string>
#include <vector>

#include "processes.hpp"

namespace {

using Clock = std::chrono::steady_clock;

float input(int rank, std::size_t i) {
  return static_cast<float>((i + static_cast<std::size_t>(rank) * 5) % 13);
}

// One rank's whole part of a benchmark: warm-up, the timed all-reduces, the check. Rank 0 reports
// through `state`; the others pass nullptr.
template <template <class> class Algorithm>
std::size_t run_rank(int rank, int ranks, std::uint16_t port, std::size_t bytes,
                     benchmark::IterationCount iterations, benchmark::State* state) {
  Algorithm<cohort::transport::tcp::Tcp> communicator(cohort::transport::tcp::Tcp(
      {.rank = rank, .size = ranks, .job_id = "bench", .rendezvous_port = port}));
  std::vector<float> buffer(bytes / sizeof(float), 1.0f);
  for (int warmup = 0; warmup < 2; ++warmup) {
    communicator.all_reduce(std::span<float>(buffer), cohort::ReduceOp::kSum);
  }
  communicator.barrier();
  if (state != nullptr) {
    for (auto _ : *state) {
      const auto start = Clock::now();
      communicator.all_reduce(std::span<float>(buffer), cohort::ReduceOp::kSum);
      state->SetIterationTime(std::chrono::duration<double>(Clock::now() - start).count());
    }
  } else {
    for (benchmark::IterationCount i = 0; i < iterations; ++i) {
      communicator.all_reduce(std::span<float>(buffer), cohort::ReduceOp::kSum);
    }
  }
  for (std::size_t i = 0; i < buffer.size(); ++i) buffer[i] = input(rank, i);
  communicator.all_reduce(std::span<float>(buffer), cohort::ReduceOp::kSum);
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < buffer.size(); ++i) {
    float expected = 0.0f;
    for (int r = 0; r < ranks; ++r) expected += input(r, i);
    wrong += buffer[i] != expected;
  }
  return wrong;
}

template <template <class> class Algorithm>
void all_reduce(benchmark::State& state) {
  const int ranks = static_cast<int>(state.range(0));
  const auto bytes = static_cast<std::size_t>(state.range(1));
  const auto port = static_cast<std::uint16_t>(cohort::testing::free_port());
  std::vector<pid_t> children;
  for (int rank = 1; rank < ranks; ++rank) {
    const pid_t child = ::fork();
    if (child == 0) {
      int code = 0;
      try {
        code = run_rank<Algorithm>(rank, ranks, port, bytes, state.max_iterations, nullptr) == 0
                   ? 0
                   : 1;
      } catch (const std::exception& error) {
        std::fprintf(stderr, "rank %d: %s\n", rank, error.what());
        code = 2;
      }
      std::fflush(stderr);
      ::_exit(code);
    }
    children.push_back(child);
  }
  std::size_t wrong = 0;
  try {
    wrong = run_rank<Algorithm>(0, ranks, port, bytes, state.max_iterations, &state);
  } catch (const std::exception& error) {
    state.SkipWithError(error.what());
  }
  for (const pid_t child : children) {
    int status = 0;
    ::waitpid(child, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) == 2) state.SkipWithError("a rank failed");
  }
  const double factor = 2.0 * (ranks - 1) / ranks;
  state.counters["bytes"] = static_cast<double>(bytes);
  state.counters["algbw"] = benchmark::Counter(static_cast<double>(bytes) / 1e9,
                                               benchmark::Counter::kIsIterationInvariantRate);
  state.counters["busbw"] = benchmark::Counter(factor * static_cast<double>(bytes) / 1e9,
                                               benchmark::Counter::kIsIterationInvariantRate);
  state.counters["wrong"] = static_cast<double>(wrong);
}

void sizes(benchmark::internal::Benchmark* benchmark) {
  for (int ranks : {2, 4}) {
    for (int bytes : {4 << 10, 1 << 20, 64 << 20}) benchmark->Args({ranks, bytes});
  }
  benchmark->ArgNames({"ranks", "bytes"})
      ->UseManualTime()
      ->MinTime(0.5)
      ->Unit(benchmark::kMicrosecond);
}

BENCHMARK(all_reduce<cohort::collective::Deterministic>)
    ->Name("tcp/deterministic/all_reduce")
    ->Apply(sizes);
BENCHMARK(all_reduce<cohort::collective::Ring>)->Name("tcp/ring/all_reduce")->Apply(sizes);

}  // namespace
