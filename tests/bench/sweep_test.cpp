// cohort-bench's measurement (tools/cohort-bench/sweep.hpp) with every rank a thread: over
// collective::Local, and over Deterministic and Ring on transport::Loopback (the code the tcp
// backend runs, without sockets). Every collective, op and element type must check clean, and a
// corrupted result must be counted on exactly one rank per checked call.
#include "sweep.hpp"

#include <doctest/doctest.h>

#include <cstdint>
#include <exception>
#include <mutex>
#include <string>
#include <thread>
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
            Sweep<T, decltype(comm)> sweep(comm, s);
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
