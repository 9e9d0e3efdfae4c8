// collective::Deterministic's all-reduce through shared memory (share_host_memory), between ranks
// that are threads of this process, each with its own TCP transport over real sockets and its own
// mapping of the segment: the bits, the failures it must name, and what it leaves behind.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <cohort/collective/deterministic.hpp>
#include <cohort/transport/tcp/tcp.hpp>
#include <cstring>
#include <functional>
#include <numeric>
#include <span>
#include <stdexcept>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "collective_checks.hpp"
#include "processes.hpp"
#include "tcp_peers.hpp"

namespace {

using cohort::CommError;
using cohort::ReduceOp;
using cohort::collective::Deterministic;
using cohort::collective::detail::SharedSegment;
using cohort::transport::tcp::Tcp;
using namespace std::chrono_literals;

// Runs body(communicator) on `ranks` threads, each a Deterministic over its own Tcp that has
// called share_host_memory(wanted(rank)); returns what each threw, "" for nothing.
// host(rank), where given, is the host identity each rank gives (HostIdentity: this host's).
template <class Body, class Wanted>
std::vector<std::string> on_sharing_ranks(
    int ranks, Body body, Wanted wanted, std::chrono::milliseconds timeout = 10s,
    std::function<cohort::collective::detail::HostIdentity(int)> host = {}) {
  const auto errors = tcp_test::run_ranks(
      ranks,
      [&](Tcp& tcp) {
        Deterministic<Tcp> communicator(std::move(tcp));
        const int rank = communicator.rank();
        const auto sharing = communicator.share_host_memory(
            wanted(rank), communicator.transport().options().spin,
            host ? host(rank) : cohort::collective::detail::host_identity());
        body(communicator, sharing);
      },
      [&](cohort::transport::tcp::Options& options) { options.operation_timeout = timeout; });
  std::vector<std::string> messages;
  for (const auto& error : errors) messages.push_back(tcp_test::message_of(error));
  return messages;
}

// The same where rank r stands for a rank on host r / per_host: ranks of one process made to stand
// for several hosts (their shared segment real, their links TCP over loopback).
template <class Body>
std::vector<std::string> on_hosts(int hosts, int per_host, Body body,
                                  std::chrono::milliseconds timeout = 10s) {
  return on_sharing_ranks(
      hosts * per_host, [&](auto& c, const auto&) { body(c); }, [](int) { return true; }, timeout,
      [per_host](int rank) {
        return cohort::collective::detail::HostIdentity{1000 + rank / per_host};
      });
}

// Rounds of all-reduces of `values`, a shared buffer that holds `mine` anew each round: round 1 in
// three parts from the end, as a gradient's buckets, every other round whole; after each, one of a
// copy of `mine` outside it, through the slots. Each gives `expected`'s bits, or this throws.
template <class C>
void reduce_shared_rounds(C& c, std::span<float> values, const std::vector<float>& mine,
                          const std::vector<float>& expected, int rounds,
                          ReduceOp op = ReduceOp::kSum) {
  const std::size_t length = values.size();
  for (int round = 0; round < rounds; ++round) {
    std::copy(mine.begin(), mine.end(), values.begin());
    if (round == 1) {
      const std::size_t cut = length / 3;
      c.all_reduce(values.subspan(2 * cut), op);
      c.all_reduce(values.subspan(cut, cut), op);
      c.all_reduce(values.first(cut), op);
    } else {
      c.all_reduce(values, op);
    }
    if (std::memcmp(values.data(), expected.data(), length * sizeof(float)) != 0) {
      throw std::runtime_error("bits differ from the canonical tree");
    }
    auto own = mine;
    c.all_reduce(std::span<float>(own), op);
    if (std::memcmp(own.data(), expected.data(), length * sizeof(float)) != 0) {
      throw std::runtime_error("bits differ through the slots");
    }
  }
}

}  // namespace

TEST_CASE(
    "through shared memory the all-reduce gives the canonical tree's bits on every rank, and "
    "leaves nothing in /dev/shm") {
  const auto segments = cohort::testing::shared_memory_segments();
  for (int ranks : {2, 3, 4}) {
    // Direct, one piece, several pieces with a short last one.
    for (std::size_t length : {std::size_t{5}, std::size_t{200'000}, std::size_t{700'003}}) {
      CAPTURE(ranks);
      CAPTURE(length);
      const auto inputs = cohort::testing::cancelling_inputs(ranks, length, 7);
      const std::vector<float> expected = cohort::testing::canonical_sum(inputs);
      const auto failures = on_sharing_ranks(
          ranks,
          [&](auto& c, const auto& sharing) {
            if (!sharing.shared) throw std::runtime_error("not shared: " + sharing.why_not);
            for (int round = 0; round < 3; ++round) {  // both slots of every rank, and back
              auto buffer = inputs[static_cast<std::size_t>(c.rank())];
              c.all_reduce(std::span<float>(buffer), ReduceOp::kSum);
              if (std::memcmp(buffer.data(), expected.data(), length * sizeof(float)) != 0) {
                throw std::runtime_error("bits differ from the canonical tree");
              }
            }
          },
          [](int) { return true; });
      for (const auto& failure : failures) CHECK(failure == "");
    }
  }
  CHECK(cohort::testing::segments_left_since(segments).empty());
}

TEST_CASE(
    "parts of the shared buffer all-reduce in place to the canonical tree's bits, between "
    "all-reduces of other buffers, and leave nothing in /dev/shm") {
  const auto segments = cohort::testing::shared_memory_segments();
  for (int ranks : {2, 3, 4}) {
    for (std::size_t length : {std::size_t{5}, std::size_t{200'000}, std::size_t{700'003}}) {
      CAPTURE(ranks);
      CAPTURE(length);
      const auto inputs = cohort::testing::cancelling_inputs(ranks, length, 11);
      const std::vector<float> expected = cohort::testing::canonical_sum(inputs);
      const auto failures = on_sharing_ranks(
          ranks,
          [&](auto& c, const auto& sharing) {
            if (!sharing.shared) throw std::runtime_error("not shared: " + sharing.why_not);
            // A second call of the same count, or of a smaller one, keeps the buffer.
            const std::span<float> values = c.template share_buffer<float>(length).values;
            if (values.size() != length) throw std::runtime_error("no shared buffer");
            if (c.template share_buffer<float>(length / 2 + 1).values.data() != values.data()) {
              throw std::runtime_error("a smaller count moved the buffer");
            }
            reduce_shared_rounds(c, values, inputs[static_cast<std::size_t>(c.rank())], expected,
                                 3);
          },
          [](int) { return true; });
      for (const auto& failure : failures) CHECK(failure == "");
    }
  }
  CHECK(cohort::testing::segments_left_since(segments).empty());
}

TEST_CASE(
    "a shared buffer that cannot be made says why, and the all-reduce goes on through the slots; "
    "ranks that do not share memory get none, without a reason") {
  const auto failures = on_sharing_ranks(
      2,
      [](auto& c, const auto& sharing) {
        if (!sharing.shared) throw std::runtime_error("not shared: " + sharing.why_not);
        // 2 ranks x 2^46 bytes: more than any /dev/shm.
        const auto refused = c.template share_buffer<float>(std::size_t{1} << 44);
        if (!refused.values.empty()) throw std::runtime_error("an impossible buffer was made");
        const std::string expected_why =
            c.rank() == 0 ? "posix_fallocate(/cohort-" : "rank 0 could not create or map";
        if (refused.why_not.find(expected_why) == std::string::npos) {
          throw std::runtime_error("why not: " + refused.why_not);
        }
        // Every rank refuses what no segment could hold, without asking the others.
        const auto too_large = c.template share_buffer<float>(std::size_t{1} << 47);
        if (too_large.why_not !=
            "140737488355328 elements are more than a shared buffer holds "
            "(281474976710656 bytes per rank)") {
          throw std::runtime_error("why not: " + too_large.why_not);
        }
        cohort::testing::check_collectives<float>(c, 300'001);
      },
      [](int) { return true; });
  for (const auto& failure : failures) CHECK(failure == "");

  const auto unshared = on_sharing_ranks(
      2,
      [](auto& c, const auto&) {
        const auto none = c.template share_buffer<float>(100);
        if (!none.values.empty() || !none.why_not.empty()) {
          throw std::runtime_error("a shared buffer, or a reason, without shared memory");
        }
      },
      [](int) { return false; });
  for (const auto& failure : unshared) CHECK(failure == "");
}

// Every element's owner in c's stripe group (stripe k: the rank at place k mod the group's size)
// writes its index plus 1 into its shared buffer where the element is its own, and keeps it in
// its gathered copy too; the other elements of both are garbage. Once gathered, the copy holds
// every index plus 1, or this throws.
template <class C>
void gather_index_stripes(C& c, std::size_t stripe, std::size_t length) {
  const std::span<float> values = c.template share_buffer<float>(length).values;
  if (values.size() != length) throw std::runtime_error("no shared buffer");
  const auto group = *c.stripe_group();
  std::vector<float> gathered(length, -1.0f);
  for (std::size_t i = 0; i < length; ++i) {
    const bool own = (i / stripe) % group.size == group.place;
    values[i] = own ? static_cast<float>(i + 1) : -2.0f;
    if (own) gathered[i] = values[i];
  }
  c.gather_shared_stripes(std::span<const float>(values), std::span<float>(gathered), stripe);
  for (std::size_t i = 0; i < length; ++i) {
    if (gathered[i] != static_cast<float>(i + 1)) {
      throw std::runtime_error("element " + std::to_string(i) + " is " +
                               std::to_string(gathered[i]));
    }
  }
}

TEST_CASE(
    "gather_shared_stripes copies every other rank's stripes from its shared buffer, and refuses "
    "a part outside the shared buffer") {
  for (int ranks : {2, 3}) {
    for (std::size_t stripe : {std::size_t{1}, std::size_t{7}, std::size_t{4096}}) {
      CAPTURE(ranks);
      CAPTURE(stripe);
      constexpr std::size_t kLength = 10'007;
      const auto failures = on_sharing_ranks(
          ranks,
          [&](auto& c, const auto&) {
            const auto group = *c.stripe_group();
            if (group.place != static_cast<std::size_t>(c.rank()) ||
                group.size != static_cast<std::size_t>(c.size())) {
              throw std::runtime_error("the stripe group is not every rank");
            }
            gather_index_stripes(c, stripe, kLength);
          },
          [](int) { return true; });
      for (const auto& failure : failures) CHECK(failure == "");
    }
  }
  const auto outside = on_sharing_ranks(
      2,
      [](auto& c, const auto&) {
        std::vector<float> own(10, 1.0f);
        std::vector<float> into(10);
        c.gather_shared_stripes(std::span<const float>(own), std::span<float>(into), 1);
      },
      [](int) { return true; });
  CHECK(outside[0] ==
        "rank 0: all_gather #4: gather_shared_stripes needs a part of the shared buffer, a buffer "
        "of its length and stripes of at least one element");
}

TEST_CASE("ranks that all-reduce different places of the shared buffer are named, with both") {
  const auto failures = on_sharing_ranks(
      2,
      [](auto& c, const auto&) {
        const std::span<float> values = c.template share_buffer<float>(100).values;
        // Floats [0, 10) of the buffer on rank 0, [10, 20) on rank 1.
        c.all_reduce(c.rank() == 0 ? values.first(10) : values.subspan(10, 10), ReduceOp::kSum);
      },
      [](int) { return true; });
  CHECK(failures[0] ==
        "rank 0: all_reduce #6: this rank reduces byte 0 of its shared buffer but rank 1 reduces "
        "byte 40 of its shared buffer");
  CHECK(failures[1] ==
        "rank 1: all_reduce #6: this rank reduces byte 40 of its shared buffer but rank 0 reduces "
        "byte 0 of its shared buffer");

  const auto outside = on_sharing_ranks(
      2,
      [](auto& c, const auto&) {
        const std::span<float> values = c.template share_buffer<float>(100).values;
        std::vector<float> own(10, 1.0f);
        c.all_reduce(c.rank() == 0 ? std::span<float>(own) : values.first(10), ReduceOp::kSum);
      },
      [](int) { return true; });
  CHECK(outside[0] ==
        "rank 0: all_reduce #6: this rank reduces a buffer outside its shared buffer but rank 1 "
        "reduces byte 0 of its shared buffer");
}

TEST_CASE("a rank that does not want shared memory keeps every rank on the transport") {
  const auto failures = on_sharing_ranks(
      3,
      [](auto& c, const auto& sharing) {
        if (sharing.shared || !sharing.why_not.empty()) {
          throw std::runtime_error("shared, or a reason given: " + sharing.why_not);
        }
        cohort::testing::check_collectives<float>(c, 4099);
      },
      [](int rank) { return rank != 1; });
  for (const auto& failure : failures) CHECK(failure == "");
}

TEST_CASE("a rank that calls another collective is named, with both calls") {
  const auto failures = on_sharing_ranks(
      2,
      [](auto& c, const auto&) {
        std::vector<float> buffer(7, 1.0f);
        if (c.rank() == 0) {
          c.all_reduce(std::span<float>(buffer), ReduceOp::kSum);
        } else {
          c.broadcast(std::span<float>(buffer), 1);
        }
      },
      [](int) { return true; });
  // The set-up's three collectives come first.
  CHECK(failures[0] ==
        "rank 0: all_reduce #4: called all_reduce(float, 7, sum) but rank 1 called "
        "broadcast(float, 7, root 1) #4");
}

TEST_CASE("a rank that calls an all-reduce of another length is named, with both calls") {
  const auto failures = on_sharing_ranks(
      2,
      [](auto& c, const auto&) {
        std::vector<float> buffer(c.rank() == 0 ? 7 : 9, 1.0f);
        c.all_reduce(std::span<float>(buffer), ReduceOp::kSum);
      },
      [](int) { return true; });
  CHECK(failures[0] ==
        "rank 0: all_reduce #4: called all_reduce(float, 7, sum) but rank 1 called "
        "all_reduce(float, 9, sum) #4");
  CHECK(failures[1] ==
        "rank 1: all_reduce #4: called all_reduce(float, 9, sum) but rank 0 called "
        "all_reduce(float, 7, sum) #4");
}

TEST_CASE("a rank that never arrives is named after operation_timeout, with a warning before") {
  const auto failures = on_sharing_ranks(
      2,
      [](auto& c, const auto&) {
        std::vector<float> buffer(1000, 1.0f);
        if (c.rank() == 1) std::this_thread::sleep_for(1500ms);
        c.all_reduce(std::span<float>(buffer), ReduceOp::kSum);
        // Rank 1 finds rank 0's arrival and completes the call rank 0 gave up, as a transfer
        // would find what rank 0 had sent: its next call fails.
        c.all_reduce(std::span<float>(buffer), ReduceOp::kSum);
      },
      [](int) { return true; }, 600ms);
  CHECK(failures[0] ==
        "rank 0: all_reduce #4: no progress within 600 ms during sequence 4, waiting for: rank 1 "
        "in shared memory, all_reduce(float, 1000, sum)");
  // Rank 1, late, learns why rank 0 left.
  CHECK(failures[1].starts_with("rank 1: all_reduce #5: rank 0 left: "));
}

TEST_CASE("an abort, from a peer or from another thread of the waiting rank, ends the wait") {
  for (const bool own : {false, true}) {
    CAPTURE(own);
    std::atomic<bool> rank_one_done = false;
    std::atomic<bool> failed_before = false;
    const auto failures = on_sharing_ranks(
        2,
        [&](auto& c, const auto&) {
          std::vector<float> buffer(1000, 1.0f);
          if (c.rank() == 1) {
            std::this_thread::sleep_for(300ms);  // rank 0 asleep in the segment
            if (!own) c.abort("stopped by the test");
            std::this_thread::sleep_for(1500ms);
            rank_one_done = true;
            return;
          }
          std::jthread aborter;
          if (own) {
            aborter = std::jthread([&c] {
              std::this_thread::sleep_for(300ms);
              c.abort("stopped by the test");
            });
          }
          try {
            c.all_reduce(std::span<float>(buffer), ReduceOp::kSum);
          } catch (...) {
            failed_before = !rank_one_done;
            throw;
          }
        },
        [](int) { return true; });
    CAPTURE(failures[0]);
    CHECK(failures[0].starts_with("rank 0: all_reduce #4: "));
    CHECK(failed_before);  // not at rank 1's end, nor at the deadline
    if (!own) CHECK(failures[0].find("rank 1") != std::string::npos);
  }
}

TEST_CASE("a segment is mapped only under its ticket") {
  const auto segments = cohort::testing::shared_memory_segments();
  SharedSegment created = SharedSegment::create(0, 2, 5000);
  SharedSegment::Ticket wrong = created.ticket();
  wrong[3] ^= 1;  // the name's part is right, the token is not
  CHECK_THROWS_WITH_AS(SharedSegment::open(wrong, 1, 2, 5000),
                       doctest::Contains("is not this job's"), std::runtime_error);
  wrong = created.ticket();
  wrong[0] ^= 1;  // no such name
  CHECK_THROWS_AS(SharedSegment::open(wrong, 1, 2, 5000), std::system_error);
  CHECK_THROWS_WITH_AS(SharedSegment::open(created.ticket(), 1, 3, 5000),
                       doctest::Contains("bytes"), std::runtime_error);  // another layout
  CHECK_THROWS_WITH_AS(SharedSegment::open(created.ticket(), 1, 2, 9000),
                       doctest::Contains("bytes"), std::runtime_error);  // other regions
  {
    SharedSegment opened = SharedSegment::open(created.ticket(), 1, 2, 5000);
    created.unlink();
    CHECK(opened.region_bytes() == 8192);  // whole pages
    // What one mapping writes, the other reads.
    *created.slot(1, 0) = std::byte{42};
    CHECK(*opened.slot(1, 0) == std::byte{42});
    created.region(1)[8191] = std::byte{7};
    CHECK(opened.region(1)[8191] == std::byte{7});
    CHECK(*opened.slot(1, 0) == std::byte{42});
    opened.arrive(1, {.sequence = 3, .tag = 9});
    CHECK(created.arrived(1, 1));
    CHECK_FALSE(created.arrived(1, 2));
    CHECK(created.stamp(1, 1) == SharedSegment::Stamp{.sequence = 3, .tag = 9});
  }
  CHECK(cohort::testing::segments_left_since(segments).empty());
}

TEST_CASE(
    "across hosts the all-reduce goes by host, with the canonical tree's bits, under every "
    "deal whose hosts are nodes of the tree") {
  const auto segments = cohort::testing::shared_memory_segments();
  struct Shape {
    int hosts;
    int per_host;
  };
  for (const Shape shape : {Shape{2, 2}, Shape{3, 2}, Shape{2, 4}}) {
    const int ranks = shape.hosts * shape.per_host;
    // Direct, one piece, several pieces with a short last one.
    for (std::size_t length : {std::size_t{5}, std::size_t{200'000}, std::size_t{700'003}}) {
      CAPTURE(ranks);
      CAPTURE(length);
      const auto inputs = cohort::testing::cancelling_inputs(ranks, length, 13);
      const std::vector<float> expected = cohort::testing::canonical_sum(inputs);
      const auto failures = on_hosts(shape.hosts, shape.per_host, [&](auto& c) {
        if (!c.reduces_by_host()) throw std::runtime_error("not by host");
        for (int round = 0; round < 3; ++round) {  // both slots of every rank, and back
          auto buffer = inputs[static_cast<std::size_t>(c.rank())];
          if (round == 1) {  // out of place
            std::vector<float> output(length);
            c.all_reduce(std::span<const float>(buffer), std::span<float>(output), ReduceOp::kSum);
            buffer = output;
          } else {
            c.all_reduce(std::span<float>(buffer), ReduceOp::kSum);
          }
          if (std::memcmp(buffer.data(), expected.data(), length * sizeof(float)) != 0) {
            throw std::runtime_error("bits differ from the canonical tree");
          }
        }
      });
      for (const auto& failure : failures) CHECK(failure == "");
    }
  }
  // Leaves dealt unevenly over hosts of 2: where each host's leaves are a node of the tree it
  // goes by host, its ranks and the hosts folded as nodes of their counts, else flat; the bits are
  // the tree's either way, in bfloat16 too.
  struct Deal {
    std::vector<std::size_t> counts;
    bool by_host;
  };
  for (const ReduceOp op : {ReduceOp::kSum, ReduceOp::kSumBfloat16}) {
    for (const Deal& deal :
         {Deal{{1, 1, 2, 4}, false}, Deal{{2, 2, 2, 2}, true}, Deal{{2, 1, 1, 4}, false},
          Deal{{2, 2, 1, 1}, true}, Deal{{2, 2, 1, 1, 1, 1}, true}}) {
      const std::size_t leaves =
          std::accumulate(deal.counts.begin(), deal.counts.end(), std::size_t{0});
      const int ranks = static_cast<int>(deal.counts.size());
      CAPTURE(ranks);
      CAPTURE(leaves);
      CAPTURE(deal.counts[0]);
      CAPTURE(deal.counts[1]);
      CAPTURE(static_cast<int>(op));
      const std::size_t length = 300'001;
      const auto inputs =
          op == ReduceOp::kSum
              ? cohort::testing::cancelling_inputs(static_cast<int>(leaves), length, 17)
              : cohort::testing::narrow_inputs(op, static_cast<int>(leaves), length, 17);
      const auto sum = [op](const std::vector<std::vector<float>>& values) {
        return op == ReduceOp::kSum ? cohort::testing::canonical_sum(values)
                                    : cohort::testing::narrow_tree_sum(op, values);
      };
      const auto nodes = cohort::testing::dealt_nodes(inputs, deal.counts, sum);
      const std::vector<float> expected = sum(inputs);
      const auto failures = on_hosts(ranks / 2, 2, [&](auto& c) {
        c.set_leaf_counts(deal.counts);
        if (c.reduces_by_host() != deal.by_host) throw std::runtime_error("by host or not: wrong");
        auto buffer = nodes[static_cast<std::size_t>(c.rank())];
        c.all_reduce(std::span<float>(buffer), op);
        if (std::memcmp(buffer.data(), expected.data(), length * sizeof(float)) != 0) {
          throw std::runtime_error("bits differ from the canonical tree");
        }
      });
      for (const auto& failure : failures) CHECK(failure == "");
    }
  }
  CHECK(cohort::testing::segments_left_since(segments).empty());
}

TEST_CASE(
    "ranks whose hosts cannot go by host all-reduce flat, say why, and where another order would "
    "let them, say which") {
  // Host 0 has ranks 0 and 2, host 1 ranks 1 and 3: in the order of their hosts 0, 2, 1, 3 (old
  // rank r at place order[r]). Then 3 ranks on one host and 1 on another, which no order helps.
  for (const auto& host_of : {std::vector<int>{0, 1, 0, 1}, std::vector<int>{0, 0, 0, 1}}) {
    CAPTURE(host_of[1]);
    const std::vector<int> order =
        host_of[1] == 1 ? std::vector<int>{0, 2, 1, 3} : std::vector<int>{-1, -1, -1, -1};
    const auto inputs = cohort::testing::cancelling_inputs(4, 1000, 19);
    const std::vector<float> expected = cohort::testing::canonical_sum(inputs);
    std::vector<std::string> reasons(4);
    const auto failures = on_sharing_ranks(
        4,
        [&](auto& c, const auto& sharing) {
          if (sharing.shared || c.reduces_by_host() || sharing.hosts != 2) {
            throw std::runtime_error("went by host");
          }
          if (sharing.rank_by_host != order[static_cast<std::size_t>(c.rank())]) {
            throw std::runtime_error("place in the order by host " +
                                     std::to_string(sharing.rank_by_host));
          }
          reasons[static_cast<std::size_t>(c.rank())] = sharing.why_not;
          auto buffer = inputs[static_cast<std::size_t>(c.rank())];
          c.all_reduce(std::span<float>(buffer), ReduceOp::kSum);
          if (std::memcmp(buffer.data(), expected.data(), 1000 * sizeof(float)) != 0) {
            throw std::runtime_error("bits differ from the canonical tree");
          }
        },
        [](int) { return true; }, 10s,
        [&](int rank) {
          return cohort::collective::detail::HostIdentity{1000 +
                                                          host_of[static_cast<std::size_t>(rank)]};
        });
    for (const auto& failure : failures) CHECK(failure == "");
    CHECK(reasons[0] == (host_of[1] == 1 ? "ranks 0 and 2 share a host but the ranks between "
                                           "them do not: the ranks of each host must be "
                                           "consecutive"
                                         : "host 1 (from rank 3) has 1 rank, host 0 has 3: "
                                           "every host must have as many"));
  }
}

TEST_CASE("by host, a rank that leaves is named by its rank in the job, on every host") {
  const auto failures = on_hosts(2, 2, [&](auto& c) {
    std::vector<float> buffer(300'000, 1.0f);
    c.all_reduce(std::span<float>(buffer), ReduceOp::kSum);
    if (c.rank() == 3) {
      c.abort("stopped by the test");
      return;
    }
    c.all_reduce(std::span<float>(buffer), ReduceOp::kSum);
  });
  CHECK(failures[3] == "");
  for (int rank = 0; rank < 3; ++rank) {
    CAPTURE(failures[static_cast<std::size_t>(rank)]);
    // The job's all-reduce and its sequence, the same on every rank, whichever group failed.
    CHECK(failures[static_cast<std::size_t>(rank)].starts_with("rank " + std::to_string(rank) +
                                                               ": all_reduce #4: "));
    CHECK(failures[static_cast<std::size_t>(rank)].find("rank 3 left: 'stopped by the test'") !=
          std::string::npos);
  }
}

TEST_CASE("by host, a rank that never arrives is named by its rank in the job after the timeout") {
  const auto failures = on_hosts(
      2, 2,
      [&](auto& c) {
        std::vector<float> buffer(300'000, 1.0f);
        if (c.rank() == 3) {
          std::this_thread::sleep_for(2500ms);  // its host's other rank waits for it
          return;
        }
        c.all_reduce(std::span<float>(buffer), ReduceOp::kSum);
      },
      1000ms);
  CAPTURE(failures[2]);
  CHECK(failures[2].starts_with("rank 2: all_reduce #"));
  CHECK(failures[2].find("waiting for: rank 3 in shared memory") != std::string::npos);
}

TEST_CASE(
    "by host, parts of each host's shared buffer all-reduce in place to the canonical tree's "
    "bits, in bfloat16 too, and stripes do not reach every rank") {
  const auto segments = cohort::testing::shared_memory_segments();
  // 4 hosts halve and double between the hosts; 2,100,007 elements are several segments of a
  // rail's all-reduce, folded from the host and written back while others travel.
  for (const int hosts : {2, 3, 4}) {
    const int ranks = hosts * 2;
    for (const ReduceOp op : {ReduceOp::kSum, ReduceOp::kSumBfloat16}) {
      for (std::size_t length : {std::size_t{5}, std::size_t{700'003}, std::size_t{2'100'007}}) {
        CAPTURE(ranks);
        CAPTURE(length);
        CAPTURE(static_cast<int>(op));
        const auto inputs = op == ReduceOp::kSum
                                ? cohort::testing::cancelling_inputs(ranks, length, 23)
                                : cohort::testing::narrow_inputs(op, ranks, length, 23);
        const std::vector<float> expected = op == ReduceOp::kSum
                                                ? cohort::testing::canonical_sum(inputs)
                                                : cohort::testing::narrow_tree_sum(op, inputs);
        const auto failures = on_hosts(hosts, 2, [&](auto& c) {
          if (c.stripes_reach_every_rank()) throw std::runtime_error("stripes reach every rank");
          const std::span<float> values = c.template share_buffer<float>(length).values;
          if (values.size() != length) throw std::runtime_error("no shared buffer");
          reduce_shared_rounds(c, values, inputs[static_cast<std::size_t>(c.rank())], expected, 2,
                               op);
        });
        for (const auto& failure : failures) CHECK(failure == "");
      }
    }
  }
  CHECK(cohort::testing::segments_left_since(segments).empty());
}

TEST_CASE(
    "by host, a buffer striped over the ranks of each host is whole on every rank once gathered, "
    "each host's ranks its stripe group") {
  for (const int per_host : {2, 3}) {
    CAPTURE(per_host);
    const auto failures = on_hosts(2, per_host, [&](auto& c) {
      const auto group = *c.stripe_group();
      if (group.size != static_cast<std::size_t>(per_host) ||
          group.place != static_cast<std::size_t>(c.rank() % per_host)) {
        throw std::runtime_error("rank " + std::to_string(c.rank()) + " is at place " +
                                 std::to_string(group.place) + " of " + std::to_string(group.size));
      }
      gather_index_stripes(c, 7, 10'007);
    });
    for (const auto& failure : failures) CHECK(failure == "");
  }
}
