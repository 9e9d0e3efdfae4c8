// Frames under a secret carry a MAC (frame_mac.hpp): a relay on the path between two ranks that
// changes a data frame and recomputes its checksum, as anyone can, is caught by the receiver,
// which names the sender. Without a secret the same change goes through: the checksum guards
// against corruption, not against an attacker. Bounded by the transport's timeouts.
#include <doctest/doctest.h>
#include <sys/socket.h>

#include <chrono>
#include <cohort/transport/tcp/tcp.hpp>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "tcp_peers.hpp"

using namespace tcp_test;  // NOLINT: the helpers are this file's vocabulary

namespace {

// Reads whole frames from `from` and writes them to `to`; the first data frame has its first
// payload byte flipped and its checksum recomputed. Ends when either side closes.
void forward_tampering(const RawSocket& from, const RawSocket& to) {
  bool tampered = false;
  for (;;) {
    std::vector<std::byte> frame(tcp::kHeaderBytes);
    if (!read_all(from, frame)) break;
    const tcp::FrameHeader header = tcp::decode_header(frame.data());
    frame.resize(tcp::kHeaderBytes + header.length + tcp::kTrailerBytes);
    if (!read_all(from, std::span(frame).subspan(tcp::kHeaderBytes))) break;
    if (!tampered && header.header.type == kCollective && header.length > 0) {
      const auto payload = std::span(frame).subspan(tcp::kHeaderBytes, header.length);
      payload[0] ^= std::byte{0x40};
      tcp::detail::store_le(frame.data() + tcp::kHeaderBytes + header.length,
                            tcp::checksum(tcp::checksum_seed(frame.data()), payload));
      tampered = true;
    }
    if (::send(to.fd(), frame.data(), frame.size(), MSG_NOSIGNAL) !=
        static_cast<ssize_t>(frame.size())) {
      break;
    }
  }
  ::shutdown(to.fd(), SHUT_WR);
}

// Passes bytes from `from` to `to` unchanged until either side closes.
void forward(const RawSocket& from, const RawSocket& to) {
  std::vector<std::byte> buffer(64 << 10);
  for (;;) {
    const ssize_t got = ::recv(from.fd(), buffer.data(), buffer.size(), 0);
    if (got <= 0) break;
    if (::send(to.fd(), buffer.data(), static_cast<std::size_t>(got), MSG_NOSIGNAL) != got) break;
  }
  ::shutdown(to.fd(), SHUT_WR);
}

// Rank 1 sends one 1000-byte frame to rank 0 through a tampering relay; returns what rank 0
// received, or threw.
struct Relayed {
  std::vector<std::byte> received;
  std::string rank_0_error;
};

Relayed send_through_relay(const std::string& secret) {
  const auto configure = [secret](tcp::Options& options) { options.secret = secret; };
  Relayed result;
  result.received.resize(1000);
  RankZero rank_zero(
      2,
      [&](tcp::Tcp& transport) {
        const Receive receive{1, {kCollective, 0, 0}, result.received};
        transport.transfer({}, {&receive, 1});
      },
      configure);
  std::uint16_t relay_port = 0;
  const RawSocket relay = listen_raw(relay_port);
  std::thread relay_thread([&] {
    const RawSocket from_rank_1(::accept(relay.fd(), nullptr, nullptr));
    const RawSocket to_rank_0 = connect_raw(rank_zero.port);
    std::thread back([&] { forward(to_rank_0, from_rank_1); });
    forward_tampering(from_rank_1, to_rank_0);
    back.join();
  });
  std::string rank_1_error;
  try {
    tcp::Options options = options_for(1, 2);
    configure(options);
    options.rendezvous_port = relay_port;
    tcp::Tcp transport(options);
    const auto payload = filled(1, 0, 1000);
    const Send send{0, {kCollective, 0, 0}, payload};
    transport.transfer({&send, 1}, {});
    std::this_thread::sleep_for(milliseconds(200));  // rank 0 reads before this end closes
  } catch (...) {
    rank_1_error = message_of(std::current_exception());
  }
  CHECK(rank_1_error == "");
  result.rank_0_error = rank_zero.finish();
  relay_thread.join();
  return result;
}

}  // namespace

TEST_CASE(
    "under a secret, a frame changed on the path is refused naming its sender; without "
    "one, the recomputed checksum lets it through") {
  const Relayed keyed = send_through_relay("s3cret");
  CAPTURE(keyed.rank_0_error);
  CHECK(
      contains(keyed.rank_0_error,
               "rank 0: the frame from rank 1 (type 1, sequence 0, tag 0x0, 1000 bytes) fails its "
               "MAC: it was changed on the way, or rank 1 did not send it"));

  const Relayed unkeyed = send_through_relay("");
  CHECK(unkeyed.rank_0_error == "");
  auto changed = filled(1, 0, 1000);
  changed[0] ^= std::byte{0x40};
  CHECK(unkeyed.received == changed);
}

TEST_CASE("under a secret, frames of every length pass between 3 ranks with their contents") {
  require_no_errors(run_ranks(
      3,
      [](tcp::Tcp& transport) {
        const int right = (transport.rank() + 1) % 3, left = (transport.rank() + 2) % 3;
        for (std::uint64_t round = 0; round < 2; ++round) {
          for (const std::size_t length : kLengths) {
            auto out = filled(transport.rank(), round, length);
            std::vector<std::byte> in(length);
            const Send send{right, {kCollective, round, length}, out};
            const Receive receive{left, {kCollective, round, length}, in};
            transport.transfer({&send, 1}, {&receive, 1});
            CHECK(holds(in, left, round));
          }
        }
      },
      [](tcp::Options& options) { options.secret = "s3cret"; }));
}
