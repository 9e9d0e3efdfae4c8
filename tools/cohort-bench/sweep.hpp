// The measurement: one collective over a sweep of sizes, on any collective::Communicator, as
// nccl-tests does it on a GPU.
//
// Three parts vary: the communicator measured; where its buffers live (SweepMemory: HostMemory
// below, or DeviceMemory in device_memory.hpp for GPUs), which the sweep fills and checks through
// host memory; and the control communicator, which carries the bookkeeping on host data (the
// barrier before timing, the per-iteration times, the wrong counts, gather_rank_info). Every host
// backend measures its control communicator itself; the nccl backend measures NcclCommunicator
// and keeps its TCP communicator for control.
//
// Per run: warm-up_iters out-of-place calls at the largest size, then as many at the smallest.
// Per size and placement (out-of-place, then in-place):
//   1. the buffers are filled with values that the timed calls leave unchanged (pattern.hpp), one
//      untimed call is made and the ranks meet at a barrier (of the control communicator);
//   2. iters calls are timed one by one, each rank timing its own (no barrier between them, as on
//      a GPU stream: a rank that arrives early waits inside the call, and that wait is counted);
//   3. the per-iteration times are all-reduced with max: the slowest rank's time of each
//      iteration; the table's time is their mean, p50 and p99 their percentiles;
//   4. with check on, the buffers are filled with the exact pattern, the call is made once more,
//      every element of the result is compared on every rank, and the counts are summed.
// Copies between the host and device memory happen after each fill and after the checked call
// only, never in the timed region.
//
// cohort's broadcast works in place only. Its out-of-place form here is what a caller who keeps
// its input does: the root copies the send buffer into the receive buffer, then calls in place;
// the copy is inside the timed region (in device memory, a device-to-device copy on the
// communicator's stream). all_reduce, all_gather and reduce_scatter take separate buffers; their
// in-place forms pass the receive buffer as both (all_reduce), or this rank's chunk of the output
// (all_gather) or of the input (reduce_scatter) as the other buffer.
#pragma once

#include <algorithm>
#include <array>
#include <chrono>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "cohort/collective/collective.hpp"
#include "cohort/core/error.hpp"
#include "cohort/core/reduce_op.hpp"
#include "pattern.hpp"
#include "report.hpp"
#include "settings.hpp"

namespace cohort::bench {

// Every rank's pid, host name, device (device_name: this rank's, "" on the CPU) and CPUs, in
// rank order, exchanged once through the communicator. Names are cut at 63 characters.
template <collective::Communicator C>
std::vector<RankInfo> gather_rank_info(C& comm, long pid, const std::string& host,
                                       const std::string& device_name, const std::string& cpus) {
  constexpr std::size_t kNameWords = 8;  // 63 characters and a terminating zero
  std::array<std::int64_t, 1 + 3 * kNameWords> mine{};
  mine[0] = pid;
  const std::string* const names[] = {&host, &device_name, &cpus};
  for (std::size_t i = 0; i < 3; ++i) {
    std::memcpy(&mine[1 + i * kNameWords], names[i]->data(),
                std::min(names[i]->size(), kNameWords * 8 - 1));
  }
  std::vector<std::int64_t> all(mine.size() * static_cast<std::size_t>(comm.size()));
  comm.all_gather(std::span<const std::int64_t>(mine), std::span<std::int64_t>(all));
  const auto text = [](const std::int64_t* words) {
    char name[kNameWords * 8] = {};
    std::memcpy(name, words, sizeof name - 1);
    return std::string(name);
  };
  std::vector<RankInfo> ranks;
  for (int r = 0; r < comm.size(); ++r) {
    const std::int64_t* record = all.data() + static_cast<std::size_t>(r) * mine.size();
    ranks.push_back({r, static_cast<long>(record[0]), text(record + 1),
                     text(record + 1 + kNameWords), text(record + 1 + 2 * kNameWords)});
  }
  return ranks;
}

// Where a sweep's buffers live. send() and receive() are what the collective is given;
// host_send() and host_receive() are host memory of the same lengths that the sweep fills and
// checks. upload(s, r) makes the first s and r elements of the buffers equal those of the host
// memory, download(s, r) the reverse; both are complete on return. copy(from, to) is the timed
// out-of-place copy between two of the buffers, ordered before the communicator's next call.
// clang-format off
template <class M>
concept SweepMemory = requires(M& m, std::size_t n, std::span<const typename M::value_type> from,
                               std::span<typename M::value_type> to) {
  m.allocate(n, n);
  { m.send() } -> std::same_as<std::span<typename M::value_type>>;
  { m.receive() } -> std::same_as<std::span<typename M::value_type>>;
  { m.host_send() } -> std::same_as<std::span<typename M::value_type>>;
  { m.host_receive() } -> std::same_as<std::span<typename M::value_type>>;
  m.upload(n, n);
  m.download(n, n);
  m.copy(from, to);
};
// clang-format on

// Host memory: the collective works on the very buffers the sweep fills and checks, so uploads
// and downloads have nothing to do. The receive buffer is a vector of its own, or what
// `lend(count)` gives (backends.hpp: a communicator's shared buffer, --shared-buffer).
template <class T>
class HostMemory {
 public:
  using value_type = T;
  using Lend = std::function<std::span<T>(std::size_t)>;

  HostMemory() = default;
  explicit HostMemory(Lend lend) : lend_(std::move(lend)) {}

  void allocate(std::size_t send, std::size_t receive) {
    send_.assign(send, T{});
    if (lend_) {
      receive_ = lend_(receive);
      std::fill(receive_.begin(), receive_.end(), T{});
    } else {
      owned_.assign(receive, T{});
      receive_ = owned_;
    }
  }
  std::span<T> send() { return send_; }
  std::span<T> receive() { return receive_; }
  std::span<T> host_send() { return send_; }
  std::span<T> host_receive() { return receive_; }
  void upload(std::size_t, std::size_t) {}
  void download(std::size_t, std::size_t) {}
  void copy(std::span<const T> from, std::span<T> to) {
    std::copy(from.begin(), from.end(), to.begin());
  }

 private:
  Lend lend_;
  std::vector<T> send_;
  std::vector<T> owned_;
  std::span<T> receive_;
};
static_assert(SweepMemory<HostMemory<float>>);

// comm is measured on the buffers of memory; control, the same ranks in the same order (comm
// itself for every host backend), carries the bookkeeping. Every rank of both calls run() with the
// same settings.
template <collective::Communicator C, collective::Communicator Control, SweepMemory Memory>
class Sweep {
 public:
  using T = typename Memory::value_type;

  Sweep(C& comm, Control& control, Memory memory, const Settings& settings)
      : comm_(comm),
        control_(control),
        memory_(std::move(memory)),
        settings_(settings),
        rank_(comm.rank()),
        ranks_(comm.size()) {
    COHORT_ASSERT(control.rank() == rank_ && control.size() == ranks_);
  }

  // Measures every size; on_row(row) runs on every rank as each row completes (rank 0 prints).
  template <class OnRow>
  std::vector<Row> run(OnRow&& on_row) {
    const std::vector<std::size_t> sizes = sweep_sizes(settings_.min_bytes, settings_.max_bytes,
                                                       settings_.step_factor, settings_.step_bytes);
    std::vector<Row> rows;
    if (sizes.empty()) return rows;
    const Shape largest = shape_of(settings_.collective, sizes.back(), sizeof(T), ranks_);
    memory_.allocate(std::max<std::size_t>(largest.send, 1),
                     std::max<std::size_t>(largest.receive, 1));

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
    control_.barrier();
    std::vector<double> seconds(static_cast<std::size_t>(settings_.iters));
    for (double& s : seconds) {
      const auto start = Clock::now();
      call(in_place, shape);
      s = std::chrono::duration<double>(Clock::now() - start).count();
    }
    control_.all_reduce(std::span<double>(seconds), ReduceOp::kMax);
    std::array<std::int64_t, 2> wrong{-1, 0};  // elements, ranks with any
    if (settings_.check) wrong = check(in_place, shape);
    return measure(settings_.collective, shape.bytes, ranks_, seconds, wrong[0], wrong[1]);
  }

  // The buffers the collective is given, and the host memory that mirrors them.
  std::span<T> send(const Shape& shape) { return memory_.send().first(shape.send); }
  std::span<T> receive(const Shape& shape) { return memory_.receive().first(shape.receive); }
  std::span<T> host_send(const Shape& shape) { return memory_.host_send().first(shape.send); }
  std::span<T> host_receive(const Shape& shape) {
    return memory_.host_receive().first(shape.receive);
  }
  std::size_t own_offset(const Shape& shape) const {
    return static_cast<std::size_t>(rank_) * shape.chunk;
  }

  // One call of the collective on the buffers of `shape`.
  void call(bool in_place, const Shape& shape) {
    const std::span<T> in = send(shape);
    const std::span<T> out = receive(shape);
    switch (settings_.collective) {
      case Collective::kAllReduce:
        comm_.all_reduce(std::span<const T>(in_place ? out : in), out, settings_.op);
        return;
      case Collective::kBroadcast:
        if (!in_place && rank_ == settings_.root) memory_.copy(in, out);
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
    const std::span<T> in = host_send(shape);
    const std::span<T> out = host_receive(shape);
    for (std::size_t i = 0; i < in.size(); ++i) in[i] = stable_value<T>(op, rank_, i);
    for (std::size_t i = 0; i < out.size(); ++i) out[i] = stable_value<T>(op, rank_, i);
    memory_.upload(shape.send, shape.receive);
  }

  // Fills the exact pattern, calls once, counts wrong elements here, and sums the counts (and the
  // ranks that saw any) over every rank.
  std::array<std::int64_t, 2> check(bool in_place, const Shape& shape) {
    const ReduceOp op = pattern_op();
    const std::span<T> in = host_send(shape);
    const std::span<T> out = host_receive(shape);
    std::fill(out.begin(), out.end(), sentinel<T>());
    std::span<T> inputs = in;  // where this rank's input goes
    if (in_place && settings_.collective != Collective::kReduceScatter) {
      inputs = settings_.collective == Collective::kAllGather
                   ? out.subspan(own_offset(shape), shape.chunk)
                   : out;
    }
    for (std::size_t i = 0; i < inputs.size(); ++i) inputs[i] = input_value<T>(op, rank_, i);
    memory_.upload(shape.send, shape.receive);

    call(in_place, shape);
    memory_.download(shape.send, shape.receive);

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
    control_.all_reduce(std::span<std::int64_t>(counts), ReduceOp::kSum);
    return counts;
  }

  C& comm_;
  Control& control_;
  Memory memory_;
  const Settings& settings_;
  const int rank_;
  const int ranks_;
};

}  // namespace cohort::bench
