// tcp::LossWatch: ranks as threads of this process on 127.0.0.1 watch their mesh while nothing
// else reads it. The rank whose Tcp ends (its sockets closed, as the kernel closes a killed
// process's) is named by every other; a frame that waits unread is no loss and stays whole; a
// watch stopped calls nothing; with no peer, a poll waits rather than returning at once.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <cohort/transport/tcp/loss_watch.hpp>
#include <cstddef>
#include <future>
#include <latch>
#include <thread>
#include <vector>

#include "tcp_peers.hpp"

using namespace tcp_test;  // NOLINT: the helpers are this file's vocabulary

TEST_CASE("a loss watch names the rank whose connections ended, not one whose frame waits unread") {
  constexpr int kSize = 3;
  constexpr int kLost = 1;
  constexpr int kSender = 0;
  constexpr int kReader = 2;
  std::latch watching(kSize);   // every watch runs before the frame
  std::latch sent(1);           // the frame to kReader is in its socket, unread
  std::latch checked(kSize);    // kReader looked for a loss before kLost ends
  std::latch named(kSize - 1);  // the others keep their meshes until each has named kLost
  std::vector<int> seen(kSize, -1);
  const auto errors = run_ranks(kSize, [&](tcp::Tcp& transport) {
    const int rank = transport.rank();
    std::promise<int> loss;
    std::future<int> lost = loss.get_future();
    tcp::LossWatch watch(transport, [&](int peer) { loss.set_value(peer); });
    watching.arrive_and_wait();
    const auto frame = filled(kSender, 0, 4099);
    if (rank == kSender) {
      const Send send{kReader, {kCollective, 0, 0}, frame};
      transport.transfer({&send, 1}, {});
      sent.count_down();
    }
    if (rank == kReader) {
      sent.wait();
      // Long enough for a poll that woke on data to have reported it.
      CHECK(lost.wait_for(std::chrono::milliseconds(200)) == std::future_status::timeout);
    }
    checked.arrive_and_wait();
    if (rank == kLost) return;  // its Tcp ends after its watch
    REQUIRE(lost.wait_for(std::chrono::seconds(10)) == std::future_status::ready);
    seen[static_cast<std::size_t>(rank)] = lost.get();
    named.arrive_and_wait();
    if (rank == kReader) {
      std::vector<std::byte> in(frame.size());
      const Receive receive{kSender, {kCollective, 0, 0}, in};
      transport.transfer({}, {&receive, 1});
      CHECK(in == frame);
    }
  });
  require_no_errors(errors);
  CHECK(seen[kSender] == kLost);
  CHECK(seen[kReader] == kLost);
}

TEST_CASE("a loss watch stopped calls nothing, also when a peer ends after") {
  std::atomic<int> calls = 0;
  std::latch stopped(2);
  const auto errors = run_ranks(2, [&](tcp::Tcp& transport) {
    tcp::LossWatch watch(transport, [&](int) { ++calls; });
    watch.stop();
    stopped.arrive_and_wait();
    if (transport.rank() == 1) return;
    // Rank 1's end, seen by a poll of rank 0's own.
    CHECK(transport.ended_peer(std::chrono::seconds(10)) == 1);
  });
  require_no_errors(errors);
  CHECK(calls == 0);
}

TEST_CASE(
    "with no peer to watch, ended_peer waits out its timeout, so that a watch does not spin") {
  const auto errors = run_ranks(1, [&](tcp::Tcp& transport) {
    const auto start = Clock::now();
    CHECK(transport.ended_peer(milliseconds(200)) == -1);
    CHECK(Clock::now() - start >= milliseconds(150));  // it returned at once before
  });
  require_no_errors(errors);
}
