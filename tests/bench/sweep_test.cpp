// cohort-bench's measurement (tools/cohort-bench/sweep.hpp) with every rank a thread: over
// collective::Local, and over Deterministic and Ring on transport::Loopback (the code the tcp
// backend runs, without sockets). Every collective, op and element type must check clean, and a
// corrupted result must be counted on exactly one rank per checked call. The nccl backend's shape
// (buffers apart from the host memory the sweep fills, bookkeeping on a control communicator) is
// checked on the CPU with buffers in other host vectors.
#include "sweep.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <exception>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "cohort/collective/deterministic.hpp"
#include "cohort/collective/local.hpp"
#include "cohort/collective/ring.hpp"
#include "cohort/transport/loopback.hpp"
#include "pattern.hpp"

namespace {

using namespace cohort::bench;
using cohort::ReduceOp;

Settings small_sweep(Collective collective, ReduceOp op, Element element, int root) {
  Settings s;
  s.collective = collective;
  s.op = op;
  s.element = element;
  s.root = root;
  s.min_bytes = 4;  // below one chunk for all_gather and reduce_scatter: empty calls too
  s.max_bytes = 40'000;
  s.step_factor = 7;
  s.iters = 2;
  s.warmup_iters = 1;
  s.check = true;
  return s;
}

// Runs the sweep on `ranks` threads with the communicator make(rank) gives; returns rank 0's rows
// and fails the test on any exception.
template <class Make>
std::vector<Row> sweep_on_threads(int ranks, const Settings& s, Make make) {
  std::vector<std::vector<Row>> rows(static_cast<std::size_t>(ranks));
  std::mutex mutex;
  std::string failure;
  {
    std::vector<std::jthread> threads;
    for (int r = 0; r < ranks; ++r) {
      threads.emplace_back([&, r] {
        auto comm = make(r);
        try {
          rows[static_cast<std::size_t>(r)] = with_element(s.element, [&]<class T>() {
            Sweep sweep(comm, comm, HostMemory<T>(), s);
            return sweep.run([](const Row&) {});
          });
        } catch (const std::exception& e) {
          comm.abort(e.what());
          const std::lock_guard lock(mutex);
          failure += "rank " + std::to_string(r) + ": " + e.what() + "\n";
        }
      });
    }
  }
  REQUIRE_MESSAGE(failure.empty(), failure);
  // Every rank reports the same figures: times and counts are reduced over ranks.
  for (int r = 1; r < ranks; ++r) {
    REQUIRE(rows[static_cast<std::size_t>(r)].size() == rows[0].size());
    for (std::size_t i = 0; i < rows[0].size(); ++i) {
      CHECK(rows[static_cast<std::size_t>(r)][i].in_place.wrong == rows[0][i].in_place.wrong);
      CHECK(rows[static_cast<std::size_t>(r)][i].out_of_place.time_us ==
            rows[0][i].out_of_place.time_us);
    }
  }
  return rows[0];
}

std::vector<Row> sweep_local(int ranks, const Settings& s) {
  cohort::collective::Local local({.ranks = ranks});
  return sweep_on_threads(ranks, s, [&](int r) { return local.communicator(r); });
}

template <template <class> class Algorithm>
std::vector<Row> sweep_loopback(int ranks, const Settings& s) {
  cohort::transport::Loopback group({.ranks = ranks});
  return sweep_on_threads(ranks, s, [&](int r) {
    return Algorithm<cohort::transport::Loopback::Endpoint>(group.endpoint(r));
  });
}

void check_clean(const std::vector<Row>& rows, std::size_t sizes) {
  REQUIRE(rows.size() == sizes);
  for (const Row& row : rows) {
    CAPTURE(row.bytes);
    CHECK(row.out_of_place.wrong == 0);
    CHECK(row.in_place.wrong == 0);
    CHECK(row.out_of_place.iterations_us.size() == 2);
    CHECK(row.in_place.time_us > 0.0);
  }
}

// Buffers that are not the host memory the sweep fills and checks, as device memory is not: they
// start as a value no pattern produces, and change only by upload, copy and the collective.
template <class T>
class StagedMemory {
 public:
  using value_type = T;

  void allocate(std::size_t send, std::size_t receive) {
    send_.assign(send, T{55});
    receive_.assign(receive, T{55});
    host_send_.assign(send, T{});
    host_receive_.assign(receive, T{});
  }
  std::span<T> send() { return send_; }
  std::span<T> receive() { return receive_; }
  std::span<T> host_send() { return host_send_; }
  std::span<T> host_receive() { return host_receive_; }
  void upload(std::size_t send, std::size_t receive) {
    std::copy_n(host_send_.begin(), send, send_.begin());
    std::copy_n(host_receive_.begin(), receive, receive_.begin());
  }
  void download(std::size_t send, std::size_t receive) {
    std::copy_n(send_.begin(), send, host_send_.begin());
    std::copy_n(receive_.begin(), receive, host_receive_.begin());
  }
  void copy(std::span<const T> from, std::span<T> to) {
    std::copy(from.begin(), from.end(), to.begin());
  }

 private:
  std::vector<T> send_;
  std::vector<T> receive_;
  std::vector<T> host_send_;
  std::vector<T> host_receive_;
};
static_assert(SweepMemory<StagedMemory<float>>);

// A communicator that counts the calls made on it: float collectives (what a float sweep
// measures) apart from everything else (barriers, and the times and counts it reduces).
template <class C>
class Counted {
 public:
  explicit Counted(C inner) : inner_(std::move(inner)) {}

  int rank() const { return inner_.rank(); }
  int size() const { return inner_.size(); }
  template <class T>
  void all_reduce(std::span<T> buffer, ReduceOp op) {
    count<T>();
    inner_.all_reduce(buffer, op);
  }
  template <class T>
  void all_reduce(std::span<const std::type_identity_t<T>> input, std::span<T> output,
                  ReduceOp op) {
    count<T>();
    inner_.all_reduce(input, output, op);
  }
  template <class T>
  void broadcast(std::span<T> buffer, int root) {
    count<T>();
    inner_.broadcast(buffer, root);
  }
  template <class T>
  void all_gather(std::span<const T> input, std::span<T> output) {
    count<T>();
    inner_.all_gather(input, output);
  }
  template <class T>
  void reduce_scatter(std::span<const T> input, std::span<T> output, ReduceOp op) {
    count<T>();
    inner_.reduce_scatter(input, output, op);
  }
  void barrier() {
    ++bookkeeping;
    inner_.barrier();
  }
  void abort(std::string_view reason) { inner_.abort(reason); }

  int measured = 0;
  int bookkeeping = 0;

 private:
  template <class T>
  void count() {
    ++(std::is_same_v<T, float> ? measured : bookkeeping);
  }

  C inner_;
};
static_assert(cohort::collective::Communicator<Counted<cohort::collective::LocalCommunicator>>);

constexpr Collective kAll[] = {Collective::kAllReduce, Collective::kBroadcast,
                               Collective::kAllGather, Collective::kReduceScatter};
constexpr ReduceOp kOps[] = {ReduceOp::kSum, ReduceOp::kProduct, ReduceOp::kMin, ReduceOp::kMax};
constexpr Element kElements[] = {Element::kFloat, Element::kDouble, Element::kInt32,
                                 Element::kInt64};

}  // namespace

TEST_CASE("the check patterns reduce exactly: prod stays a power of two, sums stay small") {
  CHECK(reduced_value<float>(ReduceOp::kSum, 3, 0) == -4.0f + -1.0f + 2.0f);
  for (std::size_t i = 0; i < 64; ++i) {
    const std::int64_t product = reduced_value<std::int64_t>(ReduceOp::kProduct, 64, i);
    const std::int64_t magnitude = product < 0 ? -product : product;
    CHECK((magnitude & (magnitude - 1)) == 0);
    CHECK(magnitude <= (std::int64_t{1} << 9));
    CHECK(static_cast<double>(reduced_value<float>(ReduceOp::kProduct, 64, i)) ==
          static_cast<double>(product));
  }
}

TEST_CASE("every collective, op and element type checks clean over collective::Local") {
  for (const Collective c : kAll) {
    for (const ReduceOp op : kOps) {
      if (!info(c).reduces && op != ReduceOp::kSum) continue;
      for (const Element e : kElements) {
        CAPTURE(info(c).name);
        CAPTURE(cohort::name(op));
        CAPTURE(name(e));
        check_clean(sweep_local(3, small_sweep(c, op, e, 2)), 5);
      }
    }
  }
}

TEST_CASE("every collective checks clean over Deterministic and Ring on transport::Loopback") {
  for (const Collective c : kAll) {
    for (const int ranks : {1, 2, 5}) {
      CAPTURE(info(c).name);
      CAPTURE(ranks);
      const Settings s = small_sweep(c, ReduceOp::kSum, Element::kFloat, ranks - 1);
      check_clean(sweep_loopback<cohort::collective::Deterministic>(ranks, s), 5);
      check_clean(sweep_loopback<cohort::collective::Ring>(ranks, s), 5);
    }
  }
}

TEST_CASE(
    "a sweep checks clean through host mirrors of its buffers, its bookkeeping all on the control "
    "communicator") {
  for (const Collective c : kAll) {
    CAPTURE(info(c).name);
    for (const bool corrupt : {false, true}) {
      CAPTURE(corrupt);
      constexpr int kRanks = 3;
      Settings s = small_sweep(c, ReduceOp::kSum, Element::kFloat, 1);
      s.corrupt = corrupt;
      cohort::collective::Local measured_group({.ranks = kRanks});
      cohort::collective::Local control_group({.ranks = kRanks});
      std::vector<std::vector<Row>> rows(kRanks);
      std::vector<std::array<int, 4>> calls(kRanks);  // measured and bookkeeping on each
      std::mutex mutex;
      std::string failure;
      {
        std::vector<std::jthread> threads;
        for (int r = 0; r < kRanks; ++r) {
          threads.emplace_back([&, r] {
            Counted comm(measured_group.communicator(r));
            Counted control(control_group.communicator(r));
            try {
              Sweep sweep(comm, control, StagedMemory<float>(), s);
              rows[r] = sweep.run([](const Row&) {});
            } catch (const std::exception& e) {
              comm.abort(e.what());
              control.abort(e.what());
              const std::lock_guard lock(mutex);
              failure += "rank " + std::to_string(r) + ": " + e.what() + "\n";
            }
            calls[r] = {comm.measured, comm.bookkeeping, control.measured, control.bookkeeping};
          });
        }
      }
      REQUIRE_MESSAGE(failure.empty(), failure);
      REQUIRE(rows[0].size() == 5);
      for (const Row& row : rows[0]) {
        CAPTURE(row.bytes);
        const std::int64_t expected = corrupt && row.count > 0 ? 1 : 0;
        CHECK(row.out_of_place.wrong == expected);
        CHECK(row.in_place.wrong == expected);
      }
      // Per rank: warm-up (1 call at 2 sizes), then per size and placement 1 untimed, 2 timed and
      // 1 checked call measured; a barrier and 2 all_reduces (times, wrong counts) on control.
      for (int r = 0; r < kRanks; ++r) {
        CAPTURE(r);
        CHECK(calls[r] == std::array<int, 4>{2 + 5 * 2 * 4, 0, 0, 5 * 2 * 3});
      }
    }
  }
}

TEST_CASE("a corrupted result is caught: one wrong element on one rank per checked call") {
  for (const Collective c : kAll) {
    CAPTURE(info(c).name);
    Settings s = small_sweep(c, ReduceOp::kSum, Element::kInt32, 0);
    s.corrupt = true;
    const std::vector<Row> rows = sweep_local(4, s);
    std::int64_t bad = 0;
    for (const Row& row : rows) {
      CAPTURE(row.bytes);
      const std::int64_t expected = row.count == 0 ? 0 : 1;  // nothing to corrupt in an empty call
      CHECK(row.out_of_place.wrong == expected);
      CHECK(row.in_place.wrong == expected);
      CHECK(row.in_place.ranks_wrong == expected);
      bad += row.out_of_place.ranks_wrong + row.in_place.ranks_wrong;
    }
    CHECK(summarize(rows).out_of_bounds == bad);
    CHECK(bad > 0);
  }
}

TEST_CASE("without check, #wrong is not measured") {
  Settings s = small_sweep(Collective::kAllReduce, ReduceOp::kSum, Element::kFloat, 0);
  s.check = false;
  s.corrupt = true;
  for (const Row& row : sweep_local(2, s)) {
    CHECK(row.out_of_place.wrong == -1);
    CHECK(row.in_place.wrong == -1);
  }
}
