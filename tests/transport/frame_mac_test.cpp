// Frames under a secret carry a MAC (frame_mac.hpp): a relay on the path between two ranks that
// changes a data frame and recomputes its checksum, as anyone can, is caught by the receiver,
// which names the sender. Without a secret the same change goes through: the checksum guards
// against corruption, not against an attacker. With encryption the relay sees ciphertext, and a
// change is caught the same way. Bounded by the transport's timeouts.
#include <doctest/doctest.h>
#include <openssl/evp.h>
#include <sys/socket.h>

#include <chrono>
#include <cohort/transport/tcp/frame.hpp>
#include <cohort/transport/tcp/tcp.hpp>
#include <cstdint>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "tcp_peers.hpp"

using namespace tcp_test;  // NOLINT: the helpers are this file's vocabulary

namespace {

// Reads whole frames from `from` and writes them to `to`, keeping the payload of the first data
// frame as it travelled; with `tamper`, that frame has its first payload byte flipped and its
// checksum recomputed. Ends when either side closes.
void forward_frames(const RawSocket& from, const RawSocket& to, bool tamper,
                    std::vector<std::byte>& first_payload) {
  bool seen = false;
  for (;;) {
    std::vector<std::byte> frame(tcp::kHeaderBytes);
    if (!read_all(from, frame)) break;
    const tcp::FrameHeader header = tcp::decode_header(frame.data());
    frame.resize(tcp::kHeaderBytes + header.length + tcp::kTrailerBytes);
    if (!read_all(from, std::span(frame).subspan(tcp::kHeaderBytes))) break;
    if (!seen && header.header.type == kCollective && header.length > 0) {
      const auto payload = std::span(frame).subspan(tcp::kHeaderBytes, header.length);
      first_payload.assign(payload.begin(), payload.end());
      if (tamper) {
        payload[0] ^= std::byte{0x40};
        tcp::detail::store_le(frame.data() + tcp::kHeaderBytes + header.length,
                              tcp::checksum(tcp::checksum_seed(frame.data()), payload));
      }
      seen = true;
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

// Rank 1 sends one frame of `length` bytes to rank 0 through a relay; what rank 0 received, or
// threw, and what the relay saw of the payload.
struct Relayed {
  std::vector<std::byte> received;
  std::string rank_0_error;
  std::vector<std::byte> on_the_wire;
};

struct Relay {
  std::string secret{};
  bool encrypt = false;
  bool tamper = true;
  std::size_t length = 1000;
};

Relayed send_through_relay(const Relay& relay_options) {
  const auto configure = [relay_options](tcp::Options& options) {
    options.secret = relay_options.secret;
    options.encrypt = relay_options.encrypt;
  };
  Relayed result;
  result.received.resize(relay_options.length);
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
    forward_frames(from_rank_1, to_rank_0, relay_options.tamper, result.on_the_wire);
    back.join();
  });
  std::string rank_1_error;
  try {
    tcp::Options options = options_for(1, 2);
    configure(options);
    options.rendezvous_port = relay_port;
    tcp::Tcp transport(options);
    const auto payload = filled(1, 0, relay_options.length);
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

// How many bytes of `a` equal those of `b` at the same place.
std::size_t same_bytes(const std::vector<std::byte>& a, const std::vector<std::byte>& b) {
  std::size_t same = 0;
  for (std::size_t i = 0; i < std::min(a.size(), b.size()); ++i) same += a[i] == b[i] ? 1 : 0;
  return same;
}

// GMAC through OpenSSL's EVP as documented: AES-256-GCM, a 12-byte nonce of 4 zero bytes and
// the frame's index (little-endian), `data` as additional data; the tag's first 8 bytes.
std::uint64_t reference_gmac(const tcp::SessionKey& key, std::uint64_t frame,
                             std::span<const std::byte> data) {
  std::array<unsigned char, 12> nonce{};
  for (std::size_t i = 0; i < 8; ++i) nonce[4 + i] = static_cast<unsigned char>(frame >> (8 * i));
  EVP_CIPHER_CTX* context = EVP_CIPHER_CTX_new();
  REQUIRE(EVP_EncryptInit_ex(context, EVP_aes_256_gcm(), nullptr,
                             reinterpret_cast<const unsigned char*>(key.data()),
                             nonce.data()) == 1);
  int ignored = 0;
  if (!data.empty()) {
    REQUIRE(EVP_EncryptUpdate(context, nullptr, &ignored,
                              reinterpret_cast<const unsigned char*>(data.data()),
                              static_cast<int>(data.size())) == 1);
  }
  std::array<std::byte, 16> tag{};
  REQUIRE(EVP_EncryptFinal_ex(context, nullptr, &ignored) == 1);
  REQUIRE(EVP_CIPHER_CTX_ctrl(context, EVP_CTRL_GCM_GET_TAG, 16, tag.data()) == 1);
  EVP_CIPHER_CTX_free(context);
  return tcp::detail::load_le<std::uint64_t>(tag.data());
}

}  // namespace

TEST_CASE("a frame's MAC is GMAC as OpenSSL computes it, whole or in pieces of any length") {
  std::mt19937_64 random(7);
  tcp::SessionKey key{};
  for (auto& byte : key) byte = static_cast<std::byte>(random());
  tcp::FrameMac sender(key, tcp::FrameMac::Side::kSend, false);
  tcp::FrameMac receiver(key, tcp::FrameMac::Side::kReceive, false);
  std::vector<std::size_t> lengths;
  for (std::size_t length = 0; length <= 1100; ++length) lengths.push_back(length);
  for (int i = 0; i < 40; ++i) lengths.push_back(random() % 20000);
  lengths.push_back((std::size_t{1} << 20) + 9);
  std::uint64_t frame = 0;
  for (const std::size_t length : lengths) {
    CAPTURE(length);
    std::vector<std::byte> data(tcp::kHeaderBytes + length);
    for (auto& byte : data) byte = static_cast<std::byte>(random());
    const auto header =
        std::span<const std::byte, tcp::kHeaderBytes>(data.data(), tcp::kHeaderBytes);
    const auto payload = std::span<const std::byte>(data).subspan(tcp::kHeaderBytes);
    const std::uint64_t expected = reference_gmac(key, frame++, data);
    sender.begin(header);
    sender.update(payload);
    CHECK(sender.finish() == expected);
    // In pieces of random lengths, as reads return them.
    receiver.begin(header);
    for (std::size_t at = 0; at < length;) {
      const std::size_t piece = std::min<std::size_t>(length - at, 1 + random() % 700);
      receiver.update(payload.subspan(at, piece));
      at += piece;
    }
    CHECK(receiver.verify(expected));
  }
}

TEST_CASE(
    "under a secret, a frame changed on the path is refused naming its sender; without "
    "one, the recomputed checksum lets it through") {
  const Relayed keyed = send_through_relay({.secret = "s3cret"});
  CAPTURE(keyed.rank_0_error);
  CHECK(
      contains(keyed.rank_0_error,
               "rank 0: the frame from rank 1 (type 1, sequence 0, tag 0x0, 1000 bytes) fails its "
               "MAC: it was changed on the way, or rank 1 did not send it"));

  const Relayed unkeyed = send_through_relay({});
  CHECK(unkeyed.rank_0_error == "");
  auto changed = filled(1, 0, 1000);
  changed[0] ^= std::byte{0x40};
  CHECK(unkeyed.received == changed);
}

TEST_CASE(
    "with encryption, payloads cross the wire as ciphertext and arrive as sent; with a MAC "
    "only, as they are") {
  for (const std::size_t length : {std::size_t{1000}, (std::size_t{1} << 20) + 7}) {
    CAPTURE(length);
    const auto plain = filled(1, 0, length);
    const Relayed encrypted = send_through_relay(
        {.secret = "s3cret", .encrypt = true, .tamper = false, .length = length});
    CHECK(encrypted.rank_0_error == "");
    CHECK(encrypted.received == plain);
    REQUIRE(encrypted.on_the_wire.size() == length);
    // Ciphertext matches the plaintext at about one byte in 256.
    CHECK(same_bytes(encrypted.on_the_wire, plain) < length / 64);

    const Relayed authenticated =
        send_through_relay({.secret = "s3cret", .tamper = false, .length = length});
    CHECK(authenticated.rank_0_error == "");
    CHECK(authenticated.received == plain);
    CHECK(authenticated.on_the_wire == plain);
  }
}

TEST_CASE("with encryption, a frame changed on the path is refused naming its sender") {
  const Relayed tampered = send_through_relay({.secret = "s3cret", .encrypt = true});
  CAPTURE(tampered.rank_0_error);
  CHECK(
      contains(tampered.rank_0_error,
               "rank 0: the frame from rank 1 (type 1, sequence 0, tag 0x0, 1000 bytes) fails its "
               "MAC: it was changed on the way, or rank 1 did not send it"));
}

TEST_CASE("encryption requires a secret, and every rank must agree on it") {
  tcp::Options options = options_for(0, 2);
  options.encrypt = true;
  const std::string refused = [&] {
    try {
      tcp::Listener listener(options);
    } catch (const cohort::ConfigError& error) {
      return std::string(error.what());
    }
    return std::string("(no error)");
  }();
  CHECK(contains(refused, "encrypt = true: requires a secret"));

  // The connecting side finds the difference; it tells no reason to a peer that has not yet
  // proved the secret, so the other side only sees it leave.
  const auto errors = run_ranks(
      2, [](tcp::Tcp&) {},
      [](tcp::Options& options) {
        options.secret = "s3cret";
        options.encrypt = options.rank == 1;
        options.connect_timeout = std::chrono::seconds(3);
      });
  CAPTURE(message_of(errors[0]));
  CHECK(message_of(errors[0]) != "");
  CHECK(contains(message_of(errors[1]),
                 "rank 1: rendezvous: rank 0 has encrypt = false, rank 1 has encrypt = true; "
                 "every rank must agree"));
}

namespace {

// Frames of every length around a ring of 3 ranks, twice, under the options `configure` sets:
// each arrives with its contents, and the caller's payload is left as it was.
void pass_frames_around(const std::function<void(tcp::Options&)>& configure) {
  require_no_errors(run_ranks(
      3,
      [](tcp::Tcp& transport) {
        const int right = (transport.rank() + 1) % 3, left = (transport.rank() + 2) % 3;
        for (std::uint64_t round = 0; round < 2; ++round) {
          for (const std::size_t length : kLengths) {
            auto out = filled(transport.rank(), round, length);
            const auto sent = out;
            std::vector<std::byte> in(length);
            const Send send{right, {kCollective, round, length}, out};
            const Receive receive{left, {kCollective, round, length}, in};
            transport.transfer({&send, 1}, {&receive, 1});
            CHECK(holds(in, left, round));
            CHECK(out == sent);
          }
        }
      },
      configure));
}

}  // namespace

TEST_CASE("under a secret, frames of every length pass between 3 ranks with their contents") {
  pass_frames_around([](tcp::Options& options) { options.secret = "s3cret"; });
}

TEST_CASE("with encryption, frames of every length pass between 3 ranks with their contents") {
  pass_frames_around([](tcp::Options& options) {
    options.secret = "s3cret";
    options.encrypt = true;
  });
}
