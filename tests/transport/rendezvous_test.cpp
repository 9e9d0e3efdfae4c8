// The rendezvous under a secret, attacked over raw sockets on 127.0.0.1: whatever a connection
// that has not proved the secret sends, the job meets, and the attacker learns nothing derived
// from the secret. Every test is bounded by the transport's timeouts (a few seconds).
#include <doctest/doctest.h>
#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cohort/transport/tcp/tcp.hpp>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

#include "tcp_peers.hpp"

using namespace tcp_test;  // NOLINT: the helpers are this file's vocabulary

namespace {

void with_secret(tcp::Options& options) {
  options.secret = kSecret;
  options.handshake_timeout = milliseconds(500);
}

// Ranks 1 to size - 1 as threads joining rank 0 at `port`, each running ring_once; returns what
// each threw, by rank (entry 0 unused).
std::vector<std::string> join_and_ring(std::uint16_t port, int size) {
  std::vector<std::string> errors(static_cast<std::size_t>(size));
  std::vector<std::thread> ranks;
  for (int rank = 1; rank < size; ++rank) {
    ranks.emplace_back([&, rank] {
      try {
        tcp::Options options = options_for(rank, size);
        with_secret(options);
        options.rendezvous_port = port;
        tcp::Tcp transport(options);
        ring_once(transport);
      } catch (...) {
        errors[static_cast<std::size_t>(rank)] = message_of(std::current_exception());
      }
    });
  }
  for (auto& rank : ranks) rank.join();
  return errors;
}

std::size_t resident_bytes() {
  std::ifstream statm("/proc/self/statm");
  std::size_t pages = 0, resident = 0;
  statm >> pages >> resident;
  return resident * static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
}

}  // namespace

TEST_CASE("with a secret, no frame a stranger sends stops the rendezvous or earns it a proof") {
  RankZero rank_zero(3, ring_once, with_secret);
  // Half a hello, and a hello that waits for a proof, stay open until the handshake's deadline.
  for (const RawSocket& open : cohort::testing::attack_rendezvous(rank_zero.port)) {
    CHECK(cohort::testing::closed_in_silence(open));
  }
  const auto errors = join_and_ring(rank_zero.port, 3);
  CHECK(errors[1] == "");
  CHECK(errors[2] == "");
  CHECK(rank_zero.finish() == "");
}

TEST_CASE(
    "with a secret, 2000 idle connections under a limit of 1024 descriptors do not keep "
    "the ranks from meeting") {
  const DescriptorLimit limit(1024);
  RankZero rank_zero(3, ring_once, with_secret);

  // The flood comes from a child process with a higher limit of its own.
  {
    const cohort::testing::IdleFlood flood(rank_zero.port, 2000);
    CHECK(flood.connected() == 2000);
    const auto errors = join_and_ring(rank_zero.port, 3);
    CHECK(errors[1] == "");
    CHECK(errors[2] == "");
    CHECK(rank_zero.finish() == "");
  }
}

TEST_CASE(
    "with a secret, 3000 connects and disconnects leave descriptors, memory and the log "
    "bounded") {
  CapturedStderr log;
  RankZero rank_zero(2, ring_once, with_secret);
  const auto churn = [&](int times) {
    for (int i = 0; i < times; ++i) {
      RawSocket stranger = connect_raw(rank_zero.port);
      if (i % 2 == 0) write_all(stranger, std::as_bytes(std::span("GET / HTTP/1.0\r\n\r\n")));
    }
  };
  churn(200);  // warm up: the rank's buffers and this process's allocator reach their size
  std::this_thread::sleep_for(milliseconds(200));
  const std::size_t descriptors = open_descriptors();
  const std::size_t memory = resident_bytes();
  const auto start = Clock::now();
  churn(3000);
  std::this_thread::sleep_for(milliseconds(200));  // rank 0 drops the last ones
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  CHECK(open_descriptors() == descriptors);
  CHECK(resident_bytes() < memory + (std::size_t{256} << 10));

  const auto errors = join_and_ring(rank_zero.port, 2);
  CHECK(errors[1] == "");
  CHECK(rank_zero.finish() == "");
  const std::string logged = log.finish();
  const auto lines = std::count(logged.begin(), logged.end(), '\n');
  CAPTURE(logged);
  CHECK(lines <= 3 + static_cast<long>(seconds) + 2);  // a burst, then one a second
}
