// collective::Deterministic's all-reduce through shared memory (share_host_memory), between ranks
// that are threads of this process, each with its own TCP transport over real sockets and its own
// mapping of the segment: the bits, the failures it must name, and what it leaves behind.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <cohort/collective/deterministic.hpp>
#include <cohort/transport/tcp/tcp.hpp>
#include <cstring>
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
template <class Body, class Wanted>
std::vector<std::string> on_sharing_ranks(int ranks, Body body, Wanted wanted,
                                          std::chrono::milliseconds timeout = 10s) {
  const auto errors = tcp_test::run_ranks(
      ranks,
      [&](Tcp& tcp) {
        Deterministic<Tcp> communicator(std::move(tcp));
        const auto sharing = communicator.share_host_memory(
            wanted(communicator.rank()), communicator.transport().options().spin);
        body(communicator, sharing);
      },
      [&](cohort::transport::tcp::Options& options) { options.operation_timeout = timeout; });
  std::vector<std::string> messages;
  for (const auto& error : errors) messages.push_back(tcp_test::message_of(error));
  return messages;
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
  CHECK(cohort::testing::shared_memory_segments() == segments);
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
            const auto& mine = inputs[static_cast<std::size_t>(c.rank())];
            for (int round = 0; round < 3; ++round) {
              std::copy(mine.begin(), mine.end(), values.begin());
              // Whole, then in three parts from the end as a gradient's buckets; an all-reduce
              // through the slots between the rounds.
              if (round == 1) {
                const std::size_t cut = length / 3;
                c.all_reduce(values.subspan(2 * cut), ReduceOp::kSum);
                c.all_reduce(values.subspan(cut, cut), ReduceOp::kSum);
                c.all_reduce(values.first(cut), ReduceOp::kSum);
              } else {
                c.all_reduce(values, ReduceOp::kSum);
              }
              if (std::memcmp(values.data(), expected.data(), length * sizeof(float)) != 0) {
                throw std::runtime_error("bits differ from the canonical tree");
              }
              auto own = mine;
              c.all_reduce(std::span<float>(own), ReduceOp::kSum);
              if (std::memcmp(own.data(), expected.data(), length * sizeof(float)) != 0) {
                throw std::runtime_error("bits differ through the slots");
              }
            }
          },
          [](int) { return true; });
      for (const auto& failure : failures) CHECK(failure == "");
    }
  }
  CHECK(cohort::testing::shared_memory_segments() == segments);
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
            const std::span<float> values = c.template share_buffer<float>(kLength).values;
            const auto me = static_cast<std::size_t>(c.rank());
            const auto size = static_cast<std::size_t>(c.size());
            // Every element's owner writes its index plus 1 where the element is its own, and
            // keeps it in its gathered copy too; the other elements of both are garbage.
            std::vector<float> gathered(kLength, -1.0f);
            for (std::size_t i = 0; i < kLength; ++i) {
              values[i] = (i / stripe) % size == me ? static_cast<float>(i + 1) : -2.0f;
              if ((i / stripe) % size == me) gathered[i] = values[i];
            }
            c.gather_shared_stripes(std::span<const float>(values), std::span<float>(gathered),
                                    stripe);
            for (std::size_t i = 0; i < kLength; ++i) {
              if (gathered[i] != static_cast<float>(i + 1)) {
                throw std::runtime_error("element " + std::to_string(i) + " is " +
                                         std::to_string(gathered[i]));
              }
            }
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
  CHECK(cohort::testing::shared_memory_segments() == segments);
}
