// What the TCP transport's tests share: options with short timeouts, ranks as threads of this
// process (run_ranks, RankZero), payload patterns, and the peer that speaks the wire format by
// hand over a plain POSIX socket, for malformed and hostile peers (rendezvous_attacks.hpp).
#pragma once

#include <doctest/doctest.h>
#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <cohort/transport/tcp/frame.hpp>
#include <cohort/transport/tcp/handshake.hpp>
#include <cohort/transport/tcp/tcp.hpp>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <iterator>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "captured_stderr.hpp"
#include "rendezvous_attacks.hpp"

namespace tcp_test {

namespace tcp = cohort::transport::tcp;
namespace setup_type = cohort::transport::tcp::setup_type;
using cohort::transport::Header;
using cohort::transport::HeaderMismatch;
using cohort::transport::Receive;
using cohort::transport::Send;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

inline constexpr std::uint16_t kCollective = cohort::transport::message_type::kCollective;

// Options every test starts from: short timeouts, so that a broken test fails instead of hanging.
inline tcp::Options options_for(int rank, int size) {
  return {.rank = rank,
          .size = size,
          .job_id = "tcp-test",
          .rendezvous_port = 0,  // rank 0 takes any free port; run_ranks tells the others
          .connect_timeout = std::chrono::seconds(10),
          .operation_timeout = std::chrono::seconds(10)};
}

// This process's open descriptors.
inline std::size_t open_descriptors() {
  return static_cast<std::size_t>(std::distance(
      std::filesystem::directory_iterator("/proc/self/fd"), std::filesystem::directory_iterator{}));
}

// This process's limit of open descriptors lowered to `most` while the object lives.
class DescriptorLimit {
 public:
  explicit DescriptorLimit(rlim_t most) {
    REQUIRE(::getrlimit(RLIMIT_NOFILE, &saved_) == 0);
    REQUIRE(saved_.rlim_max >= 2200);  // what the floods of these tests need in their child
    rlimit limited = saved_;
    limited.rlim_cur = most;
    REQUIRE(::setrlimit(RLIMIT_NOFILE, &limited) == 0);
  }
  DescriptorLimit(const DescriptorLimit&) = delete;
  DescriptorLimit& operator=(const DescriptorLimit&) = delete;
  ~DescriptorLimit() { ::setrlimit(RLIMIT_NOFILE, &saved_); }

 private:
  rlimit saved_{};
};

// The secret of the tests' jobs that have one.
inline constexpr char kSecret[] = "correct horse battery staple";

// A member of an elastic job: under the secret, its door kept open for newcomers.
inline void elastic(tcp::Options& options) {
  options.secret = kSecret;
  options.keep_listening = true;
}

inline std::string message_of(const std::exception_ptr& error) {
  if (!error) return "";
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& exception) {
    return exception.what();
  }
  return "unknown exception";
}

inline bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// Runs body(transport) on `size` ranks, each a thread constructing its own Tcp with
// configure(options) applied; rank 0 binds any free port and hands it to the others. Returns
// what each rank threw (null when nothing).
inline std::vector<std::exception_ptr> run_ranks(
    int size, const std::function<void(tcp::Tcp&)>& body,
    const std::function<void(tcp::Options&)>& configure = [](tcp::Options&) {},
    std::vector<int> ranks = {}) {
  if (ranks.empty()) {
    for (int rank = 0; rank < size; ++rank) ranks.push_back(rank);
  }
  std::promise<std::uint16_t> port_promise;
  std::shared_future<std::uint16_t> port = port_promise.get_future().share();
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(size));
  std::vector<std::thread> threads;
  for (const int rank : ranks) {
    threads.emplace_back([&, rank] {
      try {
        tcp::Options options = options_for(rank, size);
        configure(options);
        if (rank == 0) {
          std::optional<tcp::Listener> listener;
          try {
            listener.emplace(options);
          } catch (...) {
            port_promise.set_exception(std::current_exception());
            throw;
          }
          port_promise.set_value(listener->rendezvous_port());
          tcp::Tcp transport(std::move(*listener));
          body(transport);
        } else {
          options.rendezvous_port = port.get();
          tcp::Tcp transport(options);
          body(transport);
        }
      } catch (...) {
        errors[static_cast<std::size_t>(rank)] = std::current_exception();
      }
    });
  }
  for (auto& thread : threads) thread.join();
  return errors;
}

inline void require_no_errors(const std::vector<std::exception_ptr>& errors) {
  for (std::size_t rank = 0; rank < errors.size(); ++rank) {
    CAPTURE(rank);
    REQUIRE(message_of(errors[rank]) == "");
  }
}

inline std::byte pattern(int sender, std::uint64_t round, std::size_t length, std::size_t index) {
  return static_cast<std::byte>((sender * 131 + static_cast<int>(round) * 17 +
                                 static_cast<int>(length) + static_cast<int>(index) * 7) &
                                0xff);
}

inline std::vector<std::byte> filled(int sender, std::uint64_t round, std::size_t length) {
  std::vector<std::byte> bytes(length);
  for (std::size_t i = 0; i < length; ++i) bytes[i] = pattern(sender, round, length, i);
  return bytes;
}

inline bool holds(const std::vector<std::byte>& bytes, int sender, std::uint64_t round) {
  for (std::size_t i = 0; i < bytes.size(); ++i) {
    if (bytes[i] != pattern(sender, round, bytes.size(), i)) return false;
  }
  return true;
}

// A ring transfer over every rank of `transport`: each sends its pattern right and checks what
// came from left.
inline void ring_once(tcp::Tcp& transport) {
  const int size = transport.size();
  const int right = (transport.rank() + 1) % size, left = (transport.rank() + size - 1) % size;
  auto out = filled(transport.rank(), 0, 4099);
  std::vector<std::byte> in(4099);
  const Send send{right, {kCollective, 0, 0}, out};
  const Receive receive{left, {kCollective, 0, 0}, in};
  transport.transfer({&send, 1}, {&receive, 1});
  CHECK(holds(in, left, 0));
}

// Waits for a frame from `peer` that never comes: returns once the transfer fails, as it does
// when the peer's process ends.
inline void wait_for_loss_of(tcp::Tcp& transport, int peer) {
  std::vector<std::byte> in(8);
  const Receive receive{peer, {kCollective, 0, 1}, in};
  CHECK_THROWS_AS(transport.transfer({}, {&receive, 1}), cohort::CommError);
}

inline const std::vector<std::size_t> kLengths = {0, 1, 7, 4099, std::size_t{1} << 22};

// --- a peer speaking the wire format by hand, over a plain POSIX socket ----------------------
// (rendezvous_attacks.hpp, which the strategy's tests share)

using cohort::testing::CapturedStderr;
using cohort::testing::connect_raw;
using cohort::testing::hello_of;
using cohort::testing::listen_raw;
using cohort::testing::loopback;
using cohort::testing::RawFrame;
using cohort::testing::RawSocket;
using cohort::testing::read_all;
using cohort::testing::read_frame;
using cohort::testing::write_all;

// Joins a 2-rank job as rank 1 by hand: hello, hello, confirm, confirm, table, ready, go.
// Afterwards the test owns the connection to rank 0 and can write anything on it.
inline RawSocket join_as_rank_1(std::uint16_t port) {
  RawSocket socket = connect_raw(port);
  write_all(socket, tcp::make_frame({setup_type::kHello}, tcp::encode_hello(hello_of(1, 2))));
  REQUIRE(read_frame(socket).header.header.type == setup_type::kHello);
  write_all(socket, tcp::make_frame({setup_type::kConfirm}, {}));
  REQUIRE(read_frame(socket).header.header.type == setup_type::kConfirm);
  REQUIRE(read_frame(socket).header.header.type == setup_type::kTable);
  write_all(socket, tcp::make_frame({setup_type::kReady}, {}));
  REQUIRE(read_frame(socket).header.header.type == setup_type::kGo);
  return socket;
}

// Rank 0 as a thread: binds, reports its port, runs body on its Tcp; returns what it threw.
struct RankZero {
  explicit RankZero(
      int size, std::function<void(tcp::Tcp&)> body,
      std::function<void(tcp::Options&)> configure = [](tcp::Options&) {}) {
    std::promise<std::uint16_t> port_promise;
    auto port_future = port_promise.get_future();
    thread = std::thread([&, size, body, configure] {
      bool announced = false;
      try {
        tcp::Options options = options_for(0, size);
        configure(options);
        tcp::Listener listener(options);
        port_promise.set_value(listener.rendezvous_port());
        announced = true;
        tcp::Tcp transport(std::move(listener));
        body(transport);
      } catch (...) {
        error = std::current_exception();
        if (!announced) port_promise.set_exception(error);
      }
    });
    port = port_future.get();
  }
  std::string finish() {
    thread.join();
    return message_of(error);
  }

  std::uint16_t port = 0;
  std::exception_ptr error;
  std::thread thread;
};

}  // namespace tcp_test
