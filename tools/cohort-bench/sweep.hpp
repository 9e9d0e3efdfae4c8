// The measurement: one collective over a sweep of sizes, on any collective::Communicator, as
// nccl-tests does it on a GPU.
//
// Per run: warm-up_iters out-of-place calls at the largest size, then as many at the smallest.
// Per size and placement (out-of-place, then in-place):
//   1. the buffers are filled with values that the timed calls leave unchanged (pattern.hpp), one
//      untimed call is made and the ranks meet at a barrier;
//   2. iters calls are timed one by one, each rank timing its own (no barrier between them, as on
//      a GPU stream: a rank that arrives early waits inside the call, and that wait is counted);
//   3. the per-iteration times are all-reduced with max: the slowest rank's time of each
//      iteration; the table's time is their mean, p50 and p99 their percentiles;
//   4. with check on, the buffers are filled with the exact pattern, the call is made once more,
//      every element of the result is compared on every rank, and the counts are summed.
//
// cohort's all_reduce and broadcast work in place only. Their out-of-place form here is what a
// caller who keeps its input does: copy the send buffer into the receive buffer (broadcast: on
// the root), then call in place; the copy is inside the timed region. all_gather and
// reduce_scatter take separate buffers; their in-place forms pass this rank's chunk of the output
// (all_gather) or of the input (reduce_scatter) as the other buffer.
#pragma once

#include <algorithm>
#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "cohort/collective/collective.hpp"
#include "cohort/core/reduce_op.hpp"
#include "pattern.hpp"
#include "report.hpp"
#include "settings.hpp"

namespace cohort::bench {

// Every rank's pid and host name, in rank order, exchanged once through the communicator.
template <collective::Communicator C>
std::vector<RankInfo> gather_rank_info(C& comm, long pid, const std::string& host) {
  constexpr std::size_t kHostWords = 8;  // 63 characters and a terminating zero
  std::array<std::int64_t, 1 + kHostWords> mine{};
  mine[0] = pid;
  std::memcpy(&mine[1], host.data(), std::min(host.size(), kHostWords * 8 - 1));
  std::vector<std::int64_t> all(mine.size() * static_cast<std::size_t>(comm.size()));
  comm.all_gather(std::span<const std::int64_t>(mine), std::span<std::int64_t>(all));
  std::vector<RankInfo> ranks;
  for (int r = 0; r < comm.size(); ++r) {
    const std::int64_t* record = all.data() + static_cast<std::size_t>(r) * mine.size();
    char name[kHostWords * 8] = {};
    std::memcpy(name, record + 1, sizeof name - 1);
    ranks.push_back({r, static_cast<long>(record[0]), name});
  }
  return ranks;
}

template <class T, collective::Communicator C>
class Sweep {
 public:
  Sweep(C& comm, const Settings& settings)
      : comm_(comm), settings_(settings), rank_(comm.rank()), ranks_(comm.size()) {}

  // Measures every size; on_row(row) runs on every rank as each row completes (rank 0 prints).
  template <class OnRow>
  std::vector<Row> run(OnRow&& on_row) {
    const std::vector<std::size_t> sizes = sweep_sizes(settings_.min_bytes, settings_.max_bytes,
                                                       settings_.step_factor, settings_.step_bytes);
    std::vector<Row> rows;
    if (sizes.empty()) return rows;
    const Shape largest = shape_of(settings_.collective, sizes.back(), sizeof(T), ranks_);
    send_.assign(std::max<std::size_t>(largest.send, 1), T{});
    receive_.assign(std::max<std::size_t>(largest.receive, 1), T{});

    for (const std::size_t size : {sizes.back(), sizes.front()}) {
      const Shape shape = shape_of(settings_.collective, size, sizeof(T), ranks_);
      fill_stable(shape);
      for (int i = 0; i < settings_.warmup_iters; ++i) call(false, shape);
    }
    const CollectiveInfo& c = info(settings_.collective);
    for (const std::size_t size : sizes) {
      const Shape shape = shape_of(settings_.collective, size, sizeof(T), ranks_);
      Row row;
      row.bytes = shape.bytes;
      row.count = shape.count;
      row.type = std::string(name(settings_.element));
      row.redop = c.reduces ? std::string(cohort::name(settings_.op)) : "none";
      row.root = c.rooted ? settings_.root : -1;
      row.out_of_place = measure_placement(false, shape);
      row.in_place = measure_placement(true, shape);
      on_row(row);
      rows.push_back(std::move(row));
    }
    return rows;
  }

 private:
  using Clock = std::chrono::steady_clock;

  Measurement measure_placement(bool in_place, const Shape& shape) {
    fill_stable(shape);
    call(in_place, shape);
    comm_.barrier();
    std::vector<double> seconds(static_cast<std::size_t>(settings_.iters));
    for (double& s : seconds) {
      const auto start = Clock::now();
      call(in_place, shape);
      s = std::chrono::duration<double>(Clock::now() - start).count();
    }
    comm_.all_reduce(std::span<double>(seconds), ReduceOp::kMax);
    std::array<std::int64_t, 2> wrong{-1, 0};  // elements, ranks with any
    if (settings_.check) wrong = check(in_place, shape);
    return measure(settings_.collective, shape.bytes, ranks_, seconds, wrong[0], wrong[1]);
  }

  std::span<T> send(const Shape& shape) { return {send_.data(), shape.send}; }
  std::span<T> receive(const Shape& shape) { return {receive_.data(), shape.receive}; }
  std::size_t own_offset(const Shape& shape) const {
    return static_cast<std::size_t>(rank_) * shape.chunk;
  }

  // One call of the collective on the buffers of `shape`.
  void call(bool in_place, const Shape& shape) {
    const std::span<T> in = send(shape);
    const std::span<T> out = receive(shape);
    switch (settings_.collective) {
      case Collective::kAllReduce:
        if (!in_place) std::copy(in.begin(), in.end(), out.begin());
        comm_.all_reduce(out, settings_.op);
        return;
      case Collective::kBroadcast:
        if (!in_place && rank_ == settings_.root) std::copy(in.begin(), in.end(), out.begin());
        comm_.broadcast(out, settings_.root);
        return;
      case Collective::kAllGather:
        comm_.all_gather(
            std::span<const T>(in_place ? out.subspan(own_offset(shape), shape.chunk) : in), out);
        return;
      case Collective::kReduceScatter:
        comm_.reduce_scatter(std::span<const T>(in),
                             in_place ? in.subspan(own_offset(shape), shape.chunk) : out,
                             settings_.op);
        return;
      case Collective::kPushPull:  // no communicator runs it: push_pull.hpp measures it
        return;
    }
  }

  ReduceOp pattern_op() const {
    return info(settings_.collective).reduces ? settings_.op : ReduceOp::kSum;
  }

  void fill_stable(const Shape& shape) {
    const ReduceOp op = pattern_op();
    const std::span<T> in = send(shape);
    const std::span<T> out = receive(shape);
    for (std::size_t i = 0; i < in.size(); ++i) in[i] = stable_value<T>(op, rank_, i);
    for (std::size_t i = 0; i < out.size(); ++i) out[i] = stable_value<T>(op, rank_, i);
  }

  // Fills the exact pattern, calls once, counts wrong elements here, and sums the counts (and the
  // ranks that saw any) over every rank.
  std::array<std::int64_t, 2> check(bool in_place, const Shape& shape) {
    const ReduceOp op = pattern_op();
    const std::span<T> in = send(shape);
    const std::span<T> out = receive(shape);
    std::fill(out.begin(), out.end(), sentinel<T>());
    std::span<T> inputs = in;  // where this rank's input goes
    if (in_place && settings_.collective != Collective::kReduceScatter) {
      inputs = settings_.collective == Collective::kAllGather
                   ? out.subspan(own_offset(shape), shape.chunk)
                   : out;
    }
    for (std::size_t i = 0; i < inputs.size(); ++i) inputs[i] = input_value<T>(op, rank_, i);

    call(in_place, shape);

    std::span<T> result = out;
    if (settings_.collective == Collective::kReduceScatter && in_place) {
      result = in.subspan(own_offset(shape), shape.chunk);
    }
    if (settings_.corrupt && rank_ == ranks_ - 1 && !result.empty()) {
      result[result.size() / 2] += T{1};  // what the check exists to catch
    }
    const std::size_t wrong = count_wrong<T>(result, [&](std::size_t i) -> T {
      switch (settings_.collective) {
        case Collective::kAllReduce:
          return reduced_value<T>(op, ranks_, i);
        case Collective::kBroadcast:
          return input_value<T>(op, settings_.root, i);
        case Collective::kAllGather:
          return input_value<T>(op, static_cast<int>(i / shape.chunk), i % shape.chunk);
        case Collective::kReduceScatter:
          return reduced_value<T>(op, ranks_, own_offset(shape) + i);
        case Collective::kPushPull:
          break;
      }
      return T{};
    });
    std::array<std::int64_t, 2> counts{static_cast<std::int64_t>(wrong), wrong > 0 ? 1 : 0};
    comm_.all_reduce(std::span<std::int64_t>(counts), ReduceOp::kSum);
    return counts;
  }

  C& comm_;
  const Settings& settings_;
  const int rank_;
  const int ranks_;
  std::vector<T> send_;
  std::vector<T> receive_;
};

}  // namespace cohort::bench
