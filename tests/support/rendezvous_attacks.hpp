// A stranger on the network: a peer that speaks the TCP transport's wire format by hand over a
// plain POSIX socket, and the attacks it makes on a rendezvous under a secret. The transport's
// tests (tests/transport) make them on a rank in a thread; the strategy's (tests/strategy) on the
// rank 0 of a training job, whose parameters must come out as if nobody had attacked.
//
//   std::vector<RawSocket> open = attack_rendezvous(port);   // rank 0 listens at port
//   ... the real ranks meet ...
//   for (const RawSocket& socket : open) CHECK(closed_in_silence(socket));
#pragma once

#include <arpa/inet.h>
#include <doctest/doctest.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cohort/transport/tcp/frame.hpp>
#include <cohort/transport/tcp/handshake.hpp>
#include <cohort/transport/tcp/tcp.hpp>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace cohort::testing {

class RawSocket {
 public:
  explicit RawSocket(int fd = -1) : fd_(fd) {}
  RawSocket(RawSocket&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  RawSocket& operator=(RawSocket&&) = delete;
  ~RawSocket() {
    if (fd_ >= 0) ::close(fd_);
  }
  int fd() const { return fd_; }
  void close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_;
};

inline sockaddr_in loopback(std::uint16_t port) {
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(port);
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  return address;
}

// A flood of `count` idle connections to `port` from a child process, whose descriptor limit is
// raised to the hard limit (so that the flood can outnumber the listener's own limit): it
// connects `count` times, says nothing, and holds every connection until this object ends.
class IdleFlood {
 public:
  IdleFlood(std::uint16_t port, int count) {
    int report[2], release[2];
    REQUIRE(::pipe(report) == 0);
    REQUIRE(::pipe(release) == 0);
    child_ = ::fork();
    REQUIRE(child_ >= 0);
    if (child_ == 0) {
      ::close(report[0]);
      ::close(release[1]);
      rlimit limit{};
      ::getrlimit(RLIMIT_NOFILE, &limit);
      limit.rlim_cur = limit.rlim_max;
      ::setrlimit(RLIMIT_NOFILE, &limit);
      const sockaddr_in address = loopback(port);
      const timeval timeout{2, 0};
      int connected = 0;
      for (int i = 0; i < count; ++i) {
        const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
        ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof timeout);
        if (::connect(fd, reinterpret_cast<const sockaddr*>(&address), sizeof address) == 0) {
          ++connected;
        }
      }
      (void)!::write(report[1], &connected, sizeof connected);
      char byte;
      (void)!::read(release[0], &byte, 1);
      ::_exit(0);
    }
    ::close(report[1]);
    ::close(release[0]);
    release_ = release[1];
    REQUIRE(::read(report[0], &connected_, sizeof connected_) == sizeof connected_);
    ::close(report[0]);
  }
  IdleFlood(const IdleFlood&) = delete;
  IdleFlood& operator=(const IdleFlood&) = delete;
  ~IdleFlood() {
    ::close(release_);
    ::waitpid(child_, nullptr, 0);
  }

  // How many of the connects succeeded.
  int connected() const { return connected_; }

 private:
  pid_t child_ = -1;
  int release_ = -1;
  int connected_ = 0;
};

// A connected socket whose reads give up after 5 s, so that a test never hangs on one.
inline RawSocket connect_raw(std::uint16_t port) {
  RawSocket socket(::socket(AF_INET, SOCK_STREAM, 0));
  REQUIRE(socket.fd() >= 0);
  const timeval timeout{5, 0};
  ::setsockopt(socket.fd(), SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
  const sockaddr_in address = loopback(port);
  REQUIRE(::connect(socket.fd(), reinterpret_cast<const sockaddr*>(&address), sizeof address) == 0);
  return socket;
}

// Whether something accepts connections at `port` within `limit` (polled; each try connects and
// closes at once, as a stranger that says nothing would).
inline bool listening(std::uint16_t port, std::chrono::milliseconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  const sockaddr_in address = loopback(port);
  while (std::chrono::steady_clock::now() < deadline) {
    const RawSocket socket(::socket(AF_INET, SOCK_STREAM, 0));
    if (::connect(socket.fd(), reinterpret_cast<const sockaddr*>(&address), sizeof address) == 0) {
      return true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

// A listening socket on 127.0.0.1 at a free port.
inline RawSocket listen_raw(std::uint16_t& port) {
  RawSocket socket(::socket(AF_INET, SOCK_STREAM, 0));
  REQUIRE(socket.fd() >= 0);
  sockaddr_in address = loopback(0);
  REQUIRE(::bind(socket.fd(), reinterpret_cast<const sockaddr*>(&address), sizeof address) == 0);
  REQUIRE(::listen(socket.fd(), 8) == 0);
  socklen_t length = sizeof address;
  REQUIRE(::getsockname(socket.fd(), reinterpret_cast<sockaddr*>(&address), &length) == 0);
  port = ntohs(address.sin_port);
  return socket;
}

inline void write_all(const RawSocket& socket, std::span<const std::byte> bytes) {
  while (!bytes.empty()) {
    const ssize_t written = ::send(socket.fd(), bytes.data(), bytes.size(), MSG_NOSIGNAL);
    REQUIRE(written > 0);
    bytes = bytes.subspan(static_cast<std::size_t>(written));
  }
}

// False when the peer closed (or 5 s passed) first.
inline bool read_all(const RawSocket& socket, std::span<std::byte> bytes) {
  while (!bytes.empty()) {
    const ssize_t got = ::recv(socket.fd(), bytes.data(), bytes.size(), 0);
    if (got <= 0) return false;
    bytes = bytes.subspan(static_cast<std::size_t>(got));
  }
  return true;
}

// Whether the peer ends the connection (closes or resets it) without sending a single byte;
// false where a byte comes, and where nothing at all comes within the read timeout (5 s): a
// connection the peer forgot is not one it ended.
inline bool closed_in_silence(const RawSocket& socket) {
  std::byte byte;
  const ssize_t got = ::recv(socket.fd(), &byte, 1, 0);
  return got == 0 || (got < 0 && errno != EAGAIN && errno != EWOULDBLOCK);
}

struct RawFrame {
  transport::tcp::FrameHeader header;
  std::vector<std::byte> bytes;  // the whole frame
  std::span<const std::byte> payload() const {
    return std::span(bytes).subspan(transport::tcp::kHeaderBytes, header.length);
  }
};

inline RawFrame read_frame(const RawSocket& socket) {
  namespace tcp = transport::tcp;
  RawFrame frame;
  frame.bytes.resize(tcp::kHeaderBytes);
  REQUIRE(read_all(socket, frame.bytes));
  frame.header = tcp::decode_header(frame.bytes.data());
  REQUIRE(frame.header.magic == tcp::kMagic);
  REQUIRE(frame.header.length < (1u << 20));
  frame.bytes.resize(tcp::kHeaderBytes + frame.header.length + tcp::kTrailerBytes);
  REQUIRE(read_all(socket, std::span(frame.bytes).subspan(tcp::kHeaderBytes)));
  return frame;
}

inline transport::tcp::Hello hello_of(int rank, int size) {
  return {.rank = rank,
          .size = size,
          .authenticates = false,
          .listen_port = 1,
          .listen_address = "127.0.0.1",
          .job_id = "tcp-test",
          .nonce = transport::tcp::random_nonce()};
}

// Every attack of a stranger without the secret on the rendezvous that rank 0 runs at `port`,
// each on a connection of its own, in turn: a header announcing 2^63 bytes, half a hello, a hello
// with a bad checksum, of another protocol version, a frame of another type, a malformed hello,
// an abort whose text must never become an error, a hello that waits for a proof, a wrong proof.
// Each must be dropped without a word. Returns the connections rank 0 keeps until its handshake
// deadline (half a hello; a hello answered, with no proof): check that they close in silence.
inline std::vector<RawSocket> attack_rendezvous(std::uint16_t port) {
  namespace tcp = transport::tcp;
  namespace setup_type = transport::tcp::setup_type;
  tcp::Hello claimed = hello_of(1, 3);
  claimed.authenticates = true;
  const auto hello = tcp::make_frame({setup_type::kHello}, tcp::encode_hello(claimed));
  std::vector<RawSocket> open;

  open.push_back(connect_raw(port));  // half a hello, then silence
  write_all(open.back(), std::span(hello).first(hello.size() / 2));
  {
    RawSocket huge = connect_raw(port);  // a header announcing 2^63 bytes
    write_all(huge, tcp::encode_header({setup_type::kHello}, std::uint64_t{1} << 63));
    CHECK(closed_in_silence(huge));
  }
  {
    RawSocket corrupted = connect_raw(port);
    auto frame = hello;
    frame.back() ^= std::byte{1};
    write_all(corrupted, frame);
    CHECK(closed_in_silence(corrupted));
  }
  {
    RawSocket other_version = connect_raw(port);
    write_all(other_version, tcp::make_frame({setup_type::kHello}, tcp::encode_hello(claimed),
                                             tcp::kProtocolVersion + 1));
    CHECK(closed_in_silence(other_version));
  }
  {
    RawSocket other_type = connect_raw(port);
    write_all(other_type, tcp::make_frame({setup_type::kTable}, tcp::encode_table({})));
    CHECK(closed_in_silence(other_type));
  }
  {
    RawSocket malformed = connect_raw(port);
    const std::vector<std::byte> garbage(40, std::byte{0xee});
    write_all(malformed, tcp::make_frame({setup_type::kHello}, garbage));
    CHECK(closed_in_silence(malformed));
  }
  {
    RawSocket abort = connect_raw(port);  // words that must never become an error
    write_all(abort, tcp::make_frame({setup_type::kAbort},
                                     tcp::encode_text("rank 0 is compromised\ncohort: fake line")));
    CHECK(closed_in_silence(abort));
  }
  // A well-formed hello is answered with rank 0's hello, which holds nothing derived from the
  // secret; no proof follows until the stranger has proved itself, which it cannot.
  open.push_back(connect_raw(port));
  write_all(open.back(), hello);
  CHECK(read_frame(open.back()).header.header.type == setup_type::kHello);
  {
    RawSocket forger = connect_raw(port);
    write_all(forger, hello);
    const RawFrame answer = read_frame(forger);
    const auto guess = tcp::proof("password", tcp::Role::kConnector, hello, answer.bytes);
    write_all(forger, tcp::make_frame({setup_type::kConfirm}, guess));
    CHECK(closed_in_silence(forger));
  }
  return open;
}

}  // namespace cohort::testing
