// The process collectives (Deterministic, Ring) with ranks as threads over the loopback transport.
// tests/strategy runs them across real processes over TCP.
#include <doctest/doctest.h>

#include <algorithm>
#include <cohort/collective/deterministic.hpp>
#include <cohort/collective/ring.hpp>
#include <cohort/transport/loopback.hpp>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "collective_checks.hpp"

namespace {

using cohort::ReduceOp;
using cohort::transport::Loopback;

// The fields of an error a collective threw.
void check_fields(const std::optional<cohort::CommError>& error, int rank, int peer,
                  std::string_view operation, std::uint64_t sequence) {
  REQUIRE(error.has_value());
  CAPTURE(error->what());
  CHECK(error->rank() == rank);
  CHECK(error->peer() == peer);
  CHECK(error->operation() == operation);
  CHECK(error->sequence() == sequence);
}

template <template <class> class Algorithm>
using Communicator = Algorithm<Loopback::Endpoint>;

// Runs body(communicator) on `ranks` threads and returns each rank's exception message ("" if
// none).
template <template <class> class Algorithm>
std::vector<std::string> on_ranks(int ranks,
                                  const std::function<void(Communicator<Algorithm>&)>& body,
                                  std::chrono::milliseconds timeout = std::chrono::seconds(20)) {
  Loopback group({.ranks = ranks, .timeout = timeout});
  std::vector<std::string> failures(static_cast<std::size_t>(ranks));
  std::vector<std::jthread> threads;
  for (int rank = 0; rank < ranks; ++rank) {
    threads.emplace_back([&, rank] {
      Communicator<Algorithm> communicator(group.endpoint(rank));
      try {
        body(communicator);
      } catch (const std::exception& error) {
        failures[static_cast<std::size_t>(rank)] = error.what();
        communicator.abort(error.what());
      }
    });
  }
  threads.clear();
  return failures;
}

// `leaf_count` leaves of `length` elements dealt over `ranks` ranks (tree::deal): each rank's input
// is its node of the tree, folded as a replica folds, and `expected` is every leaf's canonical sum.
struct DealtLeaves {
  std::vector<std::size_t> counts;
  std::vector<std::vector<float>> inputs;
  std::vector<float> expected;
};
DealtLeaves dealt_leaves(int leaf_count, int ranks, std::size_t length, unsigned seed) {
  const auto leaves = cohort::testing::cancelling_inputs(leaf_count, length, seed);
  std::vector<std::size_t> counts =
      cohort::tree::deal(static_cast<std::size_t>(leaf_count), static_cast<std::size_t>(ranks));
  auto inputs = cohort::testing::dealt_nodes(leaves, counts, &cohort::testing::canonical_sum);
  return {std::move(counts), std::move(inputs), cohort::testing::canonical_sum(leaves)};
}

template <template <class> class Algorithm, class E>
void check_exact_sums(int ranks, std::size_t length) {
  const auto failures = on_ranks<Algorithm>(
      ranks, [&](Communicator<Algorithm>& c) { cohort::testing::check_collectives<E>(c, length); });
  for (const auto& failure : failures) CHECK(failure == "");
}

}  // namespace

TEST_CASE_TEMPLATE("process collectives are exact on integer-valued inputs", E, float, double,
                   std::int32_t, std::int64_t) {
  for (int ranks : {1, 2, 3, 5, 8}) {
    for (std::size_t length : {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{4099}}) {
      CAPTURE(ranks);
      CAPTURE(length);
      check_exact_sums<cohort::collective::Deterministic, E>(ranks, length);
      check_exact_sums<cohort::collective::Ring, E>(ranks, length);
    }
  }
}

TEST_CASE("process collectives are exact on buffers that span several segments") {
  for (int ranks : {2, 3}) {
    CAPTURE(ranks);
    check_exact_sums<cohort::collective::Deterministic, float>(ranks, std::size_t{1} << 22);
    check_exact_sums<cohort::collective::Ring, float>(ranks, std::size_t{1} << 22);
  }
}

TEST_CASE("the deterministic all-reduce gives the canonical tree's bits on every rank") {
  for (int ranks : {2, 3, 4, 5, 8}) {
    // Direct, segmented, and in several segments (2 to 5: 5 on 4 and 8 ranks, halved and doubled).
    for (std::size_t length : {std::size_t{5}, std::size_t{300'000}, std::size_t{1'300'001}}) {
      CAPTURE(ranks);
      CAPTURE(length);
      const auto inputs = cohort::testing::cancelling_inputs(ranks, length, 7);
      const std::vector<float> expected = cohort::testing::canonical_sum(inputs);

      const auto failures = on_ranks<cohort::collective::Deterministic>(ranks, [&](auto& c) {
        const auto& input = inputs[static_cast<std::size_t>(c.rank())];
        auto buffer = input;
        c.all_reduce(std::span<float>(buffer), ReduceOp::kSum);
        std::vector<float> output(length);
        c.all_reduce(std::span<const float>(input), std::span<float>(output), ReduceOp::kSum);
        for (const auto* result : {&buffer, &output}) {
          if (std::memcmp(result->data(), expected.data(), length * sizeof(float)) != 0) {
            throw std::runtime_error(std::string("bits differ from the canonical tree ") +
                                     (result == &buffer ? "in place" : "out of place"));
          }
        }
      });
      for (const auto& failure : failures) CHECK(failure == "");
    }
  }
}

TEST_CASE(
    "the deterministic all-reduce folds ranks of uneven leaf counts as nodes: every leaf's tree") {
  // 8 leaves over 3, 5 and 6 ranks; 8 over 4 (2 each, halved and doubled) and 12 over 4 (2, 2, 4
  // and 4: a power of two of ranks that are not the tree's nodes over ranks).
  for (const auto& [leaf_count, ranks] :
       {std::pair{8, 3}, std::pair{8, 5}, std::pair{8, 6}, std::pair{8, 4}, std::pair{12, 4}}) {
    for (std::size_t length : {std::size_t{5}, std::size_t{300'000}}) {  // direct and segmented
      CAPTURE(leaf_count);
      CAPTURE(ranks);
      CAPTURE(length);
      const auto [counts, inputs, expected] = dealt_leaves(leaf_count, ranks, length, 7);
      const auto failures = on_ranks<cohort::collective::Deterministic>(ranks, [&](auto& c) {
        c.set_leaf_counts(counts);
        auto buffer = inputs[static_cast<std::size_t>(c.rank())];
        c.all_reduce(std::span<float>(buffer), ReduceOp::kSum);
        if (std::memcmp(buffer.data(), expected.data(), length * sizeof(float)) != 0) {
          throw std::runtime_error("bits differ from the canonical tree over every leaf");
        }
      });
      for (const auto& failure : failures) CHECK(failure == "");
    }
  }
  // Counts that are not consecutive nodes are refused, naming the field.
  const auto failures = on_ranks<cohort::collective::Deterministic>(3, [&](auto& c) {
    c.set_leaf_counts({1, 2, 1});
  });
  for (const auto& failure : failures) CHECK(failure.find("leaf_counts") != std::string::npos);
}

TEST_CASE(
    "the deterministic all-reduce in two halves: each element's owner holds the all-reduce's bits, "
    "and the gather brings every owner's elements to every rank") {
  // Direct, one segment and several; halved and doubled on 4 and 8 ranks of even counts, and on
  // 4 ranks of 12 leaves (2, 2, 4, 4) folded and gathered.
  for (const auto& [leaf_count, ranks] :
       {std::pair{2, 2}, std::pair{3, 3}, std::pair{4, 4}, std::pair{8, 8}, std::pair{12, 4}}) {
    for (std::size_t length : {std::size_t{5}, std::size_t{300'000}, std::size_t{1'300'001}}) {
      CAPTURE(leaf_count);
      CAPTURE(ranks);
      CAPTURE(length);
      const auto [counts, inputs, expected] = dealt_leaves(leaf_count, ranks, length, 11);
      std::vector<float> whole(length);
      for (std::size_t i = 0; i < length; ++i) whole[i] = static_cast<float>(i % 1000) - 0.5f;
      const auto failures = on_ranks<cohort::collective::Deterministic>(ranks, [&](auto& c) {
        c.set_leaf_counts(counts);
        if (!c.reduces_to_owners()) throw std::runtime_error("a flat group does not own apart");
        auto buffer = inputs[static_cast<std::size_t>(c.rank())];
        c.reduce_to_owners(std::span<float>(buffer), ReduceOp::kSum);
        // What each owner writes over its elements, which the gather must bring everywhere.
        std::vector<float> written(length, std::numeric_limits<float>::quiet_NaN());
        c.template for_each_owned<float>(length, [&](std::size_t begin, std::size_t count) {
          if (std::memcmp(buffer.data() + begin, expected.data() + begin, count * sizeof(float)) !=
              0) {
            throw std::runtime_error("an owned element differs from the canonical tree");
          }
          std::copy_n(whole.begin() + static_cast<std::ptrdiff_t>(begin), count,
                      written.begin() + static_cast<std::ptrdiff_t>(begin));
        });
        c.gather_from_owners(std::span<float>(written));
        if (std::memcmp(written.data(), whole.data(), length * sizeof(float)) != 0) {
          throw std::runtime_error("the gather left an element that no owner wrote");
        }
      });
      for (const auto& failure : failures) CHECK(failure == "");
    }
  }
  // A group of one rank has nothing to own apart: the call says so, naming itself.
  const auto failures = on_ranks<cohort::collective::Deterministic>(1, [&](auto& c) {
    if (c.reduces_to_owners()) throw std::runtime_error("one rank owns apart");
    std::vector<float> buffer(8);
    c.reduce_to_owners(std::span<float>(buffer), ReduceOp::kSum);
  });
  CHECK(failures[0].find("reduce_scatter") != std::string::npos);
  CHECK(failures[0].find("flat group of more than one rank") != std::string::npos);
}

TEST_CASE("the ring all-reduce gives the same bits on every rank, in place or not") {
  const int ranks = 5;
  for (const std::size_t length : {std::size_t{10'001}, std::size_t{1'500'001}}) {  // segmented
    CAPTURE(length);
    std::vector<std::vector<float>> results(ranks);
    std::vector<std::vector<float>> out_of_place(ranks);
    const auto failures = on_ranks<cohort::collective::Ring>(ranks, [&](auto& c) {
      std::vector<float> input(length);
      std::mt19937 engine(static_cast<unsigned>(c.rank()));
      for (float& value : input) value = std::uniform_real_distribution<float>(-1e4f, 1e4f)(engine);
      auto buffer = input;
      c.all_reduce(std::span<float>(buffer), ReduceOp::kSum);
      results[static_cast<std::size_t>(c.rank())] = buffer;
      std::vector<float> output(length);
      c.all_reduce(std::span<const float>(input), std::span<float>(output), ReduceOp::kSum);
      out_of_place[static_cast<std::size_t>(c.rank())] = output;
    });
    for (const auto& failure : failures) CHECK(failure == "");
    for (const auto& result : results) CHECK(result == results[0]);
    for (const auto& result : out_of_place) CHECK(result == results[0]);
  }
}

TEST_CASE_TEMPLATE("an out-of-place all-reduce refuses buffers of another length or that overlap",
                   Algorithm, cohort::collective::Deterministic<Loopback::Endpoint>,
                   cohort::collective::Ring<Loopback::Endpoint>) {
  std::vector<float> memory(10, 1.0f);
  const auto refusal = [](std::span<const float> input, std::span<float> output) {
    Loopback group({.ranks = 1, .timeout = std::chrono::seconds(20)});
    Algorithm communicator(group.endpoint(0));
    try {
      communicator.all_reduce(input, output, ReduceOp::kSum);
    } catch (const cohort::CommError& error) {
      return std::string(error.detail());
    }
    return std::string();
  };
  const std::span<float> all(memory);
  CHECK(refusal(all.first(4), all.last(5)) == "input has 4 elements but output 5");
  CHECK(refusal(all.first(6), all.last(6)) ==
        "input and output overlap without being the same buffer");
  CHECK(refusal(all.first(5), all.last(5)) == "");
  CHECK(refusal(all.first(5), all.first(5)) == "");  // in place
}

namespace {

// Loopback that can do the caller's work while it "waits" (transport::Overlapping): one piece
// before its frames move and one after, leaving the rest for the caller, so that the pipeline's
// work runs on either side of the next transfer as it may over TCP.
class OverlappingLoopback {
 public:
  explicit OverlappingLoopback(Loopback::Endpoint endpoint) : endpoint_(std::move(endpoint)) {}
  int rank() const { return endpoint_.rank(); }
  int size() const { return endpoint_.size(); }
  void transfer(std::span<const cohort::transport::Send> sends,
                std::span<const cohort::transport::Receive> receives) {
    endpoint_.transfer(sends, receives);
  }
  void transfer(std::span<const cohort::transport::Send> sends,
                std::span<const cohort::transport::Receive> receives,
                cohort::transport::Meanwhile meanwhile) {
    const bool more = meanwhile();
    endpoint_.transfer(sends, receives);
    if (more) meanwhile();
  }
  void close() { endpoint_.close(); }
  void leave(std::string_view reason) { endpoint_.leave(reason); }
  void abort(std::string_view reason) { endpoint_.abort(reason); }

 private:
  Loopback::Endpoint endpoint_;
};
static_assert(cohort::transport::Overlapping<OverlappingLoopback>);

template <class Communicator>
std::vector<std::vector<float>> all_reduce_on_threads(
    int ranks, const std::vector<std::vector<float>>& inputs) {
  Loopback group({.ranks = ranks, .timeout = std::chrono::seconds(20)});
  std::vector<std::vector<float>> results = inputs;
  std::vector<std::jthread> threads;
  for (int rank = 0; rank < ranks; ++rank) {
    threads.emplace_back([&, rank] {
      Communicator communicator(OverlappingLoopback(group.endpoint(rank)));
      communicator.all_reduce(std::span<float>(results[static_cast<std::size_t>(rank)]),
                              ReduceOp::kSum);
    });
  }
  threads.clear();
  return results;
}

}  // namespace

// 5.5 segments with 2 ranks (both lanes, a short last one), fewer with more ranks.
TEST_CASE("the pipelined reductions keep their bits when the work runs during the transfers") {
  for (int ranks : {2, 3, 5}) {
    CAPTURE(ranks);
    const std::size_t length = std::size_t{11} << 17;
    const auto inputs = cohort::testing::cancelling_inputs(ranks, length, 3);
    const std::vector<float> canonical = cohort::testing::canonical_sum(inputs);
    for (const auto& result :
         all_reduce_on_threads<cohort::collective::Deterministic<OverlappingLoopback>>(ranks,
                                                                                       inputs)) {
      CHECK(result == canonical);
    }
    std::vector<std::vector<float>> plain = inputs;
    on_ranks<cohort::collective::Ring>(ranks, [&](auto& c) {
      c.all_reduce(std::span<float>(plain[static_cast<std::size_t>(c.rank())]), ReduceOp::kSum);
    });
    for (const auto& result :
         all_reduce_on_threads<cohort::collective::Ring<OverlappingLoopback>>(ranks, inputs)) {
      CHECK(result == plain[0]);
    }
  }
}

namespace {

// A loopback endpoint that counts the payload bytes its rank sends.
struct Traffic {
  std::size_t bytes = 0;      // sent
  std::size_t transfers = 0;  // the steps of a rank's algorithm
};

class CountingLoopback {
 public:
  CountingLoopback(Loopback::Endpoint endpoint, Traffic& traffic)
      : endpoint_(std::move(endpoint)), traffic_(&traffic) {}
  int rank() const { return endpoint_.rank(); }
  int size() const { return endpoint_.size(); }
  void transfer(std::span<const cohort::transport::Send> sends,
                std::span<const cohort::transport::Receive> receives) {
    for (const auto& send : sends) traffic_->bytes += send.payload.size();
    ++traffic_->transfers;
    endpoint_.transfer(sends, receives);
  }
  void close() { endpoint_.close(); }
  void leave(std::string_view reason) { endpoint_.leave(reason); }
  void abort(std::string_view reason) { endpoint_.abort(reason); }

 private:
  Loopback::Endpoint endpoint_;
  Traffic* traffic_;
};

}  // namespace

// 8 leaves dealt over 1 to 8 ranks (tree::deal): each rank's input is its node of the tree of
// bfloat16 (float16) nodes, as a worker's replicas fold it.
TEST_CASE(
    "a bfloat16 or float16 sum gives the bits of the tree of such nodes on any rank count, "
    "sending half the bytes of a float sum") {
  constexpr int kLeaves = 8;
  // Each format, direct and segmented; and in several segments, each rounded as it enters the
  // pipeline and widened as it leaves (3 of 524,288 elements on 2 ranks, 2 on 3 and 4).
  for (const auto& run : {std::pair{ReduceOp::kSumBfloat16, std::size_t{5}},
                          std::pair{ReduceOp::kSumBfloat16, std::size_t{300'000}},
                          std::pair{ReduceOp::kSumBfloat16, std::size_t{1'300'001}},
                          std::pair{ReduceOp::kSumFloat16, std::size_t{5}},
                          std::pair{ReduceOp::kSumFloat16, std::size_t{300'000}}}) {
    const ReduceOp op = run.first;
    const std::size_t length = run.second;
    const std::string op_name(cohort::name(op));
    CAPTURE(op_name);
    CAPTURE(length);
    const auto leaves = cohort::testing::narrow_inputs(op, kLeaves, length, 11);
    const auto tree_sum = [op](const std::vector<std::vector<float>>& inputs) {
      return cohort::testing::narrow_tree_sum(op, inputs);
    };
    const std::vector<float> expected = tree_sum(leaves);
    // The rounding happened: a float tree gives other bits.
    CHECK(expected != cohort::testing::canonical_sum(leaves));
    for (int ranks : {1, 2, 3, 4, 5, 8}) {
      CAPTURE(ranks);
      const std::vector<std::size_t> counts = cohort::tree::deal(kLeaves, ranks);
      const auto inputs = cohort::testing::dealt_nodes(leaves, counts, tree_sum);
      Loopback group({.ranks = ranks, .timeout = std::chrono::seconds(20)});
      std::vector<Traffic> sent(2 * static_cast<std::size_t>(ranks));  // bfloat16, float
      std::vector<std::string> failures(static_cast<std::size_t>(ranks));
      std::vector<std::jthread> threads;
      for (int rank = 0; rank < ranks; ++rank) {
        threads.emplace_back([&, rank] {
          const auto r = static_cast<std::size_t>(rank);
          cohort::collective::Deterministic<CountingLoopback> narrow(
              CountingLoopback(group.endpoint(rank), sent[2 * r]));
          try {
            narrow.set_leaf_counts(counts);
            auto buffer = inputs[r];
            narrow.all_reduce(std::span<float>(buffer), op);
            std::vector<float> output(length);
            narrow.all_reduce(std::span<const float>(inputs[r]), std::span<float>(output), op);
            if (buffer != expected || output != expected) {
              throw std::runtime_error("bits differ from the tree of rounded nodes");
            }
          } catch (const std::exception& error) {
            failures[r] = error.what();
            narrow.abort(error.what());
          }
        });
      }
      threads.clear();
      for (const auto& failure : failures) CHECK(failure == "");
      // The same two all-reduces as float sums, over a group of their own.
      Loopback wide_group({.ranks = ranks, .timeout = std::chrono::seconds(20)});
      for (int rank = 0; rank < ranks; ++rank) {
        threads.emplace_back([&, rank] {
          const auto r = static_cast<std::size_t>(rank);
          cohort::collective::Deterministic<CountingLoopback> wide(
              CountingLoopback(wide_group.endpoint(rank), sent[2 * r + 1]));
          auto buffer = inputs[r];
          wide.all_reduce(std::span<float>(buffer), ReduceOp::kSum);
          std::vector<float> output(length);
          wide.all_reduce(std::span<const float>(inputs[r]), std::span<float>(output),
                          ReduceOp::kSum);
        });
      }
      threads.clear();
      for (std::size_t rank = 0; rank < static_cast<std::size_t>(ranks); ++rank) {
        CAPTURE(rank);
        // Half, up to how the segments cut chunks that do not divide evenly.
        CHECK(2.0 * static_cast<double>(sent[2 * rank].bytes) ==
              doctest::Approx(static_cast<double>(sent[2 * rank + 1].bytes)).epsilon(0.001));
        if (ranks > 1) CHECK(sent[2 * rank].bytes > 0);
      }
    }
  }
}

// Every message of a segment at most 512 KiB: the ring-like schedule's chunks, and the halving's
// first message, half its segment; the halving's chunks no smaller than 64 KiB.
using SegmentsOf = cohort::collective::Deterministic<CountingLoopback>;
static_assert(SegmentsOf::segment_chunk_bytes(2, false) == 512 * 1024);
static_assert(SegmentsOf::segment_chunk_bytes(8, false) == 512 * 1024);
static_assert(SegmentsOf::segment_chunk_bytes(4, true) == 256 * 1024);
static_assert(SegmentsOf::segment_chunk_bytes(8, true) == 128 * 1024);
static_assert(SegmentsOf::segment_chunk_bytes(1024, true) == 64 * 1024);

TEST_CASE(
    "the segmented deterministic all-reduce takes 2 log2(n) steps a segment where the ranks are a "
    "power of two of equal leaf counts, 2 (n - 1) otherwise") {
  struct Run {
    int ranks;
    std::vector<std::size_t> counts;  // leaf counts; empty: one each
    std::size_t steps_per_segment;
  };
  for (const Run& run : {Run{4, {}, 4}, Run{8, {}, 6}, Run{8, {2, 2, 2, 2, 2, 2, 2, 2}, 6},
                         Run{6, {}, 10}, Run{4, {2, 2, 4, 4}, 6}}) {
    CAPTURE(run.ranks);
    CAPTURE(run.counts.size());
    // Two segments.
    const bool halves = run.steps_per_segment != 2 * static_cast<std::size_t>(run.ranks - 1);
    const std::size_t chunk_bytes =
        SegmentsOf::segment_chunk_bytes(static_cast<std::size_t>(run.ranks), halves);
    const std::size_t length = 2 * static_cast<std::size_t>(run.ranks) * (chunk_bytes / 4);
    Loopback group({.ranks = run.ranks, .timeout = std::chrono::seconds(20)});
    std::vector<Traffic> traffic(static_cast<std::size_t>(run.ranks));
    std::vector<std::jthread> threads;
    for (int rank = 0; rank < run.ranks; ++rank) {
      threads.emplace_back([&, rank] {
        const auto r = static_cast<std::size_t>(rank);
        cohort::collective::Deterministic<CountingLoopback> c(
            CountingLoopback(group.endpoint(rank), traffic[r]));
        if (!run.counts.empty()) c.set_leaf_counts(run.counts);
        std::vector<float> buffer(length, 1.0f);
        c.all_reduce(std::span<float>(buffer), ReduceOp::kSum);
      });
    }
    threads.clear();
    for (const Traffic& rank : traffic) CHECK(rank.transfers == 2 * run.steps_per_segment);
  }
}

TEST_CASE(
    "a bfloat16 or float16 sum of other elements than float is refused, naming the operator") {
  for (const ReduceOp op : {ReduceOp::kSumBfloat16, ReduceOp::kSumFloat16}) {
    const auto failures = on_ranks<cohort::collective::Deterministic>(2, [op](auto& c) {
      std::vector<double> buffer(3, 1.0);
      c.all_reduce(std::span<double>(buffer), op);
    });
    for (const auto& failure : failures) {
      CAPTURE(failure);
      CHECK(failure.find(std::string(cohort::name(op)) + " reduces float elements only") !=
            std::string::npos);
    }
  }
}

TEST_CASE("process collectives apply min, max and product") {
  const auto failures = on_ranks<cohort::collective::Deterministic>(3, [](auto& c) {
    std::vector<double> minimum{double(c.rank()), -double(c.rank())};
    c.all_reduce(std::span<double>(minimum), ReduceOp::kMin);
    std::vector<double> maximum{double(c.rank()), -double(c.rank())};
    c.all_reduce(std::span<double>(maximum), ReduceOp::kMax);
    std::vector<double> product{double(c.rank() + 2)};
    c.all_reduce(std::span<double>(product), ReduceOp::kProduct);
    if (minimum != std::vector<double>{0, -2} || maximum != std::vector<double>{2, 0} ||
        product != std::vector<double>{24}) {
      throw std::runtime_error("wrong reduction");
    }
  });
  for (const auto& failure : failures) CHECK(failure == "");
}

TEST_CASE("ranks that call different collectives fail naming both calls") {
  const auto failures = on_ranks<cohort::collective::Deterministic>(
      2,
      [](auto& c) {
        std::vector<float> buffer(7, 1.0f);
        if (c.rank() == 0) {
          c.all_reduce(std::span<float>(buffer), ReduceOp::kSum);
        } else {
          c.broadcast(std::span<float>(buffer), 1);
          c.barrier();
        }
      },
      std::chrono::milliseconds(2000));
  CAPTURE(failures[0]);
  CAPTURE(failures[1]);
  CHECK(failures[0].find("rank 0: all_reduce #1: called all_reduce(float, 7, sum) but rank 1 "
                         "called broadcast(float, 7, root 1) #1") != std::string::npos);
  CHECK(failures[1] != "");  // released by rank 0's failure, not left waiting
}

TEST_CASE("a rank that aborts makes its peers fail naming it, and the group stays failed") {
  const auto failures = on_ranks<cohort::collective::Deterministic>(3, [](auto& c) {
    std::vector<float> buffer(100, 1.0f);
    if (c.rank() == 2) throw std::runtime_error("replica 2 ran out of memory");
    try {
      c.all_reduce(std::span<float>(buffer), ReduceOp::kSum);
    } catch (const cohort::CommError& error) {
      const std::string message = error.what();
      if (message.find("all_reduce #1") == std::string::npos ||
          message.find("rank 2") == std::string::npos) {
        throw std::runtime_error("unexpected message: " + message);
      }
      c.barrier();  // must fail too
    }
  });
  CHECK(failures[2] == "replica 2 ran out of memory");
  for (int rank : {0, 1}) {
    CAPTURE(failures[static_cast<std::size_t>(rank)]);
    CHECK(failures[static_cast<std::size_t>(rank)].find("barrier") != std::string::npos);
  }
}

TEST_CASE(
    "a rank that aborts while 8 ranks halve and double makes every other fail at once, its "
    "reason quoted, though most never exchange with it") {
  constexpr std::size_t kLength = 1 << 20;  // segmented: halved and doubled
  const auto failures = on_ranks<cohort::collective::Deterministic>(8, [](auto& c) {
    std::vector<float> buffer(kLength, 1.0f);
    if (c.rank() == 7) throw std::runtime_error("replica 7 ran out of memory");
    c.all_reduce(std::span<float>(buffer), ReduceOp::kSum);
  });
  CHECK(failures[7] == "replica 7 ran out of memory");
  for (std::size_t rank = 0; rank < 7; ++rank) {
    CAPTURE(rank);
    CAPTURE(failures[rank]);
    CHECK(failures[rank].find("all_reduce #1") != std::string::npos);
    CHECK(failures[rank].find("replica 7 ran out of memory") != std::string::npos);
    CHECK(failures[rank].find("no progress") == std::string::npos);  // nobody waited it out
  }
}

TEST_CASE("a rank that never arrives is reported after the timeout") {
  const auto failures = on_ranks<cohort::collective::Ring>(
      2,
      [](auto& c) {
        if (c.rank() == 1) {
          std::this_thread::sleep_for(std::chrono::milliseconds(600));
          return;
        }
        std::vector<float> buffer(10, 1.0f);
        c.all_reduce(std::span<float>(buffer), ReduceOp::kSum);
      },
      std::chrono::milliseconds(200));
  CAPTURE(failures[0]);
  CHECK(failures[0].find("rank 0: all_reduce #1: nothing from rank 1 within 200 ms") !=
        std::string::npos);
}

TEST_CASE_TEMPLATE(
    "a collective whose peer aborts fails with rank, peer, operation and sequence as "
    "fields and the peer's reason, and so does every later call",
    Algorithm, cohort::collective::Deterministic<Loopback::Endpoint>,
    cohort::collective::Ring<Loopback::Endpoint>) {
  Loopback group({.ranks = 2, .timeout = std::chrono::seconds(20)});
  std::optional<cohort::CommError> failed;
  std::optional<cohort::CommError> refused;
  {
    std::jthread peer([&] {
      Algorithm communicator(group.endpoint(1));
      communicator.barrier();
      communicator.abort("done");  // rank 0's next collective finds it gone, and why
    });
    Algorithm communicator(group.endpoint(0));
    communicator.barrier();
    peer.join();
    std::vector<float> buffer(7, 1.0f);
    try {
      communicator.all_reduce(std::span<float>(buffer), ReduceOp::kSum);
    } catch (const cohort::CommError& error) {
      failed = error;
    }
    try {
      communicator.broadcast(std::span<float>(buffer), 0);
    } catch (const cohort::CommError& error) {
      refused = error;
    }
  }
  check_fields(failed, 0, 1, "all_reduce", 2);  // the barrier was #1
  CHECK(std::string(failed->what()).starts_with("rank 0: all_reduce #2: rank 1 left: 'done'"));

  check_fields(refused, 0, 1, "broadcast", 3);  // the peer: the first failure's
  CHECK(std::string(refused->detail()).starts_with("refused: the group failed earlier: "));
}

TEST_CASE("ranks that call different collectives fail with the other rank as peer()") {
  Loopback group({.ranks = 2, .timeout = std::chrono::seconds(20)});
  std::optional<cohort::CommError> failed;
  {
    std::jthread other([&] {
      cohort::collective::Deterministic<Loopback::Endpoint> communicator(group.endpoint(1));
      std::vector<float> buffer(7, 1.0f);
      try {
        communicator.broadcast(std::span<float>(buffer), 1);
      } catch (const cohort::CommError&) {
        // released by rank 0's failure
      }
    });
    cohort::collective::Deterministic<Loopback::Endpoint> communicator(group.endpoint(0));
    std::vector<float> buffer(7, 1.0f);
    try {
      communicator.all_reduce(std::span<float>(buffer), ReduceOp::kSum);
    } catch (const cohort::CommError& error) {
      failed = error;
    }
  }
  check_fields(failed, 0, 1, "all_reduce", 1);
  CHECK(failed->detail() ==
        "called all_reduce(float, 7, sum) but rank 1 called broadcast(float, 7, root 1) #1");
}
