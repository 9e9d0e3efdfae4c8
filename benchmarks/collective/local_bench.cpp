// collective::Local all-reduce (float, sum) against the memory floor, and the merge of a tree's
// nodes that every reduction runs, in float and in the rounded sums.
//
// Every rank is a thread, created once per benchmark run and kept across its iterations; rank 0
// is the thread that runs the timing loop. An iteration is timed from the first rank that leaves a
// barrier and starts the operation to the last rank that returns from it, each rank stamping its
// own clock; the time is reported as manual time.
//
// Counters (nccl-tests' definitions):
//   bytes           per-rank buffer bytes
//   algbw           bytes / time, GB/s
//   busbw           algbw x 2(n-1)/n, GB/s
//   wrong           elements that differ from the exact sum in a fresh all_reduce after the timed
//                   ones (the timed sums grow by a factor n per iteration, so they are not checked)
//   floor_fraction  64 MiB only: floor time / all-reduce time (medians), where the floor is the
//                   time the same number of threads need to move the all-reduce's minimum
//                   traffic, 2 x ranks x bytes, at the copy bandwidth measured as
//                   stream/copy/ranks:n
//
// stream/copy/ranks:n (STREAM-like): each of n threads copies its own 64 MiB buffer into another
// with std::memcpy (read + write, 2 x n x 64 MiB moved in all); counter GBps is bytes moved / time.
// stream/update/ranks:n: each thread adds 1 to its own 64 MiB in place. A copy's write first reads
// the target line into the cache unless memcpy streams past it; the all-reduce writes lines it has
// just read, as the update does, so update is the stricter floor (update_floor_fraction).
//
// merge/op:N, labelled sum, sum_bf16 or sum_fp16 (the ReduceOp): one merge of a canonical tree over
// the 1,863,690 gradient values of the MLP 784-1024-1024-10 (device::cpu::combine_into), the pass
// that a fold, a communicator and a parameter server make per node; sum_bf16 and sum_fp16 round
// each sum to their format (core/narrow_float.hpp).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <exception>
#include <map>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "cohort/collective/local.hpp"
#include "cohort/core/reduce_op.hpp"
#include "cohort/device/cpu.hpp"

namespace {

using cohort::ReduceOp;
using cohort::collective::Local;
using cohort::collective::LocalCommunicator;
using Clock = std::chrono::steady_clock;

constexpr std::size_t kFloorBytes = std::size_t{64} << 20;

// Small integers: the sum over ranks is exact in float.
float input(int rank, std::size_t i) {
  return static_cast<float>((i + static_cast<std::size_t>(rank) * 5) % 13);
}

float exact_sum(int ranks, std::size_t i) {
  float sum = 0.0f;
  for (int r = 0; r < ranks; ++r) sum += input(r, i);
  return sum;
}

void fill(std::span<float> buffer, int rank) {
  for (std::size_t i = 0; i < buffer.size(); ++i) buffer[i] = input(rank, i);
}

// Runs body(comm) on ranks 1..n-1 in their own threads and on rank 0 in the calling thread.
// Returns the first error; a failing rank aborts the group so that no other rank waits for it.
template <class Body>
std::string run_team(const Local& local, Body body) {
  std::vector<std::string> errors(static_cast<std::size_t>(local.size()));
  auto rank_main = [&](int rank) {
    LocalCommunicator comm = local.communicator(rank);
    try {
      body(comm);
    } catch (const std::exception& e) {
      errors[rank] = e.what();
      comm.abort(e.what());
    }
  };
  {
    std::vector<std::jthread> threads;
    for (int rank = 1; rank < local.size(); ++rank) threads.emplace_back(rank_main, rank);
    rank_main(0);
  }
  for (const std::string& error : errors) {
    if (!error.empty()) return error;
  }
  return "";
}

// Times one step of work across the ranks: from the first rank's start to the last rank's end.
// Per-rank stamps, not rank 0's clock alone: with more ranks than cores, rank 0 may be scheduled
// after the others have done their part.
class TeamClock {
 public:
  explicit TeamClock(int ranks)
      : start_(static_cast<std::size_t>(ranks)), end_(static_cast<std::size_t>(ranks)) {}

  template <class Work>
  double time(LocalCommunicator& comm, Work&& work) {
    comm.barrier();
    start_[comm.rank()] = Clock::now();
    work();
    end_[comm.rank()] = Clock::now();
    comm.barrier();  // every stamp is written; none is rewritten before the next step's barrier
    return std::chrono::duration<double>(*std::max_element(end_.begin(), end_.end()) -
                                         *std::min_element(start_.begin(), start_.end()))
        .count();
  }

 private:
  std::vector<Clock::time_point> start_;
  std::vector<Clock::time_point> end_;
};

// Runs `step` (which returns its time) on every rank: on rank 0 once per iteration of the
// benchmark loop, reporting the time, or `repetitions` times without a state; on the other ranks
// as many times. Returns rank 0's times.
template <class Step>
std::vector<double> repeat(LocalCommunicator& comm, benchmark::State* state,
                           std::int64_t repetitions, Step&& step) {
  std::vector<double> seconds;
  if (comm.rank() == 0 && state != nullptr) {
    for (auto _ : *state) {
      seconds.push_back(step());
      state->SetIterationTime(seconds.back());
    }
    return seconds;
  }
  if (state != nullptr) repetitions = state->max_iterations;
  for (std::int64_t i = 0; i < repetitions; ++i) seconds.push_back(step());
  return seconds;
}

// The two memory-floor references: each rank streams its own 64 MiB.
enum class Stream {
  kCopy,    // std::memcpy into a second buffer: read 64 MiB, write 64 MiB
  kUpdate,  // x[i] += 1 in place: read 64 MiB, write the same 64 MiB back
};

// Times `ranks` threads streaming their own `bytes`, as benchmark iterations (state) or
// `repetitions` times; returns the time of each.
std::vector<double> time_streams(Stream stream, int ranks, std::size_t bytes,
                                 benchmark::State* state, std::int64_t repetitions) {
  const Local local({.ranks = ranks});
  TeamClock clock(ranks);
  std::vector<double> seconds;
  const std::string error = run_team(local, [&](LocalCommunicator& comm) {
    // Filled by the thread that streams them, so that first touch places them near it.
    std::vector<float> from(bytes / sizeof(float), 1.0f);
    std::vector<float> to(stream == Stream::kCopy ? from.size() : 0, 2.0f);
    auto times = repeat(comm, state, repetitions, [&] {
      return clock.time(comm, [&] {
        if (stream == Stream::kCopy) {
          std::memcpy(to.data(), from.data(), bytes);
        } else {
          for (float& x : from) x += 1.0f;
        }
      });
    });
    benchmark::DoNotOptimize(to.data());
    benchmark::DoNotOptimize(from.data());
    if (comm.rank() == 0) seconds = std::move(times);
  });
  if (!error.empty()) throw std::runtime_error(error);
  return seconds;
}

double median(std::vector<double> values) {
  std::nth_element(values.begin(), values.begin() + values.size() / 2, values.end());
  return values[values.size() / 2];
}

// Bytes moved per second (read + write) by `ranks` threads streaming 64 MiB each: the median of
// a few repetitions, measured once per stream and rank count and kept.
double stream_bandwidth(Stream stream, int ranks) {
  static std::map<std::pair<Stream, int>, double> measured;
  const auto key = std::pair(stream, ranks);
  if (!measured.contains(key)) {
    const double seconds = median(time_streams(stream, ranks, kFloorBytes, nullptr, 9));
    measured[key] = 2.0 * ranks * static_cast<double>(kFloorBytes) / seconds;
  }
  return measured[key];
}

void all_reduce_sum_float(benchmark::State& state) {
  const auto ranks = static_cast<int>(state.range(0));
  const auto bytes = static_cast<std::size_t>(state.range(1));
  const std::size_t length = bytes / sizeof(float);
  // Measured before this run's buffers exist, so the two never compete for memory.
  const bool compare_with_floor = bytes == kFloorBytes;
  const double copy_bandwidth = compare_with_floor ? stream_bandwidth(Stream::kCopy, ranks) : 0.0;
  const double update_bandwidth =
      compare_with_floor ? stream_bandwidth(Stream::kUpdate, ranks) : 0.0;

  const Local local({.ranks = ranks});
  TeamClock clock(ranks);
  std::vector<double> seconds;
  std::vector<std::size_t> wrong(static_cast<std::size_t>(ranks));
  const std::string error = run_team(local, [&](LocalCommunicator& comm) {
    std::vector<float> buffer(length);
    const std::span<float> span(buffer);
    fill(span, comm.rank());
    auto times = repeat(comm, &state, 0, [&] {
      return clock.time(comm, [&] { comm.all_reduce(span, ReduceOp::kSum); });
    });
    if (comm.rank() == 0) seconds = std::move(times);
    fill(span, comm.rank());
    comm.all_reduce(span, ReduceOp::kSum);
    for (std::size_t i = 0; i < length; ++i) wrong[comm.rank()] += buffer[i] != exact_sum(ranks, i);
  });
  if (!error.empty()) {
    state.SkipWithError(error.c_str());
    return;
  }

  double total = 0.0;
  for (const double s : seconds) total += s;
  const double mean = total / static_cast<double>(seconds.size());
  const double algbw = static_cast<double>(bytes) / mean / 1e9;
  state.counters["bytes"] = static_cast<double>(bytes);
  state.counters["algbw"] = algbw;
  state.counters["busbw"] = algbw * 2.0 * (ranks - 1) / ranks;
  std::size_t total_wrong = 0;
  for (const std::size_t w : wrong) total_wrong += w;
  state.counters["wrong"] = static_cast<double>(total_wrong);
  if (compare_with_floor) {
    const double moved = 2.0 * ranks * static_cast<double>(bytes);
    state.counters["floor_fraction"] = moved / copy_bandwidth / median(seconds);
    state.counters["update_floor_fraction"] = moved / update_bandwidth / median(seconds);
  }
}

void stream(benchmark::State& state, Stream kind) {
  const auto ranks = static_cast<int>(state.range(0));
  const std::vector<double> seconds = time_streams(kind, ranks, kFloorBytes, &state, 0);
  double total = 0.0;
  for (const double s : seconds) total += s;
  const double moved = 2.0 * ranks * static_cast<double>(kFloorBytes);
  state.counters["bytes"] = moved;
  state.counters["GBps"] = moved / (total / static_cast<double>(seconds.size())) / 1e9;
}

BENCHMARK_CAPTURE(stream, copy, Stream::kCopy)
    ->ArgName("ranks")
    ->Arg(2)
    ->Arg(4)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(stream, update, Stream::kUpdate)
    ->ArgName("ranks")
    ->Arg(2)
    ->Arg(4)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
void merge(benchmark::State& state) {
  constexpr std::size_t kValues = 1'863'690;
  const auto op = static_cast<ReduceOp>(state.range(0));
  std::vector<float> left(kValues);
  std::vector<float> right(kValues);
  std::vector<float> out(kValues);
  for (std::size_t i = 0; i < kValues; ++i) {
    // Nodes of every format's tree: sums of them round.
    left[i] = cohort::combine(op, 1e-3f * static_cast<float>(i % 977), 0.0f);
    right[i] = cohort::combine(op, -7e-4f * static_cast<float>(i % 613), 0.0f);
  }
  for (auto _ : state) {
    cohort::device::cpu::combine_into<float>(op, left, right, out);
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  state.SetLabel(std::string(cohort::name(op)));
}

BENCHMARK(merge)
    ->ArgName("op")
    ->Arg(static_cast<int>(ReduceOp::kSum))
    ->Arg(static_cast<int>(ReduceOp::kSumBfloat16))
    ->Arg(static_cast<int>(ReduceOp::kSumFloat16))
    ->Unit(benchmark::kMillisecond);
BENCHMARK(all_reduce_sum_float)
    ->ArgNames({"ranks", "bytes"})
    ->ArgsProduct({{2, 4}, {1 << 10, 1 << 20, 64 << 20}})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);

}  // namespace
