// transport::tcp::Tcp between two ranks, threads of this process over 127.0.0.1, beside plain
// POSIX sockets doing the same exchanges in the same run:
//
//   PingPong/<bytes>    rank 0 sends, rank 1 echoes; one iteration is one round trip, and
//                       one_way_us is half of it
//   TcpSwap/<bytes>     both ranks send and receive in one transfer (a 2-rank all-reduce's
//                       communication); swap_us is one swap
//   Stream/<bytes>      rank 0 sends one message, rank 1 receives it whole and answers with an
//                       empty acknowledgement; bytes_per_second is the one-way bandwidth
//                       (TcpStreamNoChecksum: the same with Options::checksum off)
//
//   DoorPoll/<idle>     an elastic job's rank 0 asks its door who waits (tcp::Door::waiting,
//                       once per vote of the Trainer) while <idle> connections that never speak
//                       sit there (up to max_pending_connections: a flood is held to that many);
//                       PollFloor is one poll(2) of the listening socket, the least a look can
//                       cost
//
// Baselines: Raw*Blocking is the plain blocking way (send/recv that sleep in the kernel); the
// Raw*Spinning variants poll non-blocking sockets, as Tcp does, so that the difference to them
// is what framing, checksums and the transport's bookkeeping cost. docs/transport.md has the
// figures and their ratios.
#include <arpa/inet.h>
#include <benchmark/benchmark.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cohort/transport/tcp/door.hpp>
#include <cohort/transport/tcp/tcp.hpp>
#include <cstddef>
#include <cstdint>
#include <future>
#include <memory>
#include <stdexcept>
#include <thread>
#include <utility>
#include <vector>

namespace {

namespace tcp = cohort::transport::tcp;
using cohort::transport::Header;
using cohort::transport::Receive;
using cohort::transport::Send;

constexpr std::byte kGoOn{0};
constexpr std::byte kStop{1};

// Two connected transports: ranks 0 and 1 of one job.
std::pair<std::unique_ptr<tcp::Tcp>, std::unique_ptr<tcp::Tcp>> connected_pair(bool checksum) {
  tcp::Listener listener(
      {.rank = 0, .size = 2, .job_id = "bench", .rendezvous_port = 0, .checksum = checksum});
  const std::uint16_t port = listener.rendezvous_port();
  auto peer = std::async(std::launch::async, [port, checksum] {
    return std::make_unique<tcp::Tcp>(tcp::Options{
        .rank = 1, .size = 2, .job_id = "bench", .rendezvous_port = port, .checksum = checksum});
  });
  auto root = std::make_unique<tcp::Tcp>(std::move(listener));
  return {std::move(root), peer.get()};
}

// Rank 1's side: receives `length` bytes and answers with `answer` bytes of its own (the message
// itself for a ping-pong, nothing for a stream), until a message starts with kStop.
void serve(tcp::Tcp& transport, std::size_t length, bool echo) {
  std::vector<std::byte> buffer(length);
  for (std::uint64_t sequence = 0;; ++sequence) {
    const Header header{cohort::transport::message_type::kCollective, sequence, 0};
    const Receive receive{0, header, buffer};
    transport.transfer({}, {&receive, 1});
    const Send send{0, header,
                    echo ? std::span<const std::byte>(buffer) : std::span<const std::byte>()};
    transport.transfer({&send, 1}, {});
    if (buffer[0] == kStop) return;
  }
}

void report(benchmark::State& state, std::size_t length, bool echo,
            std::chrono::steady_clock::duration elapsed) {
  state.counters["bytes"] = static_cast<double>(length);
  if (echo) {
    const double microseconds = std::chrono::duration<double, std::micro>(elapsed).count();
    state.counters["one_way_us"] =
        microseconds / (2.0 * static_cast<double>(std::max<std::int64_t>(state.iterations(), 1)));
  } else {
    state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) *
                            static_cast<std::int64_t>(length));
  }
}

void TcpExchange(benchmark::State& state, bool echo, bool checksum = true) {
  const auto length = static_cast<std::size_t>(state.range(0));
  auto [root, peer] = connected_pair(checksum);
  std::thread server([&, peer = peer.get()] { serve(*peer, length, echo); });
  std::vector<std::byte> out(length, kGoOn), in(echo ? length : 0);
  std::uint64_t sequence = 0;
  const auto exchange = [&] {
    const Header header{cohort::transport::message_type::kCollective, sequence++, 0};
    const Send send{1, header, out};
    const Receive receive{1, header, in};
    root->transfer({&send, 1}, {&receive, 1});
  };
  const auto start = std::chrono::steady_clock::now();
  for (auto _ : state) exchange();
  report(state, length, echo, std::chrono::steady_clock::now() - start);
  out[0] = kStop;
  exchange();
  server.join();
}

void TcpPingPong(benchmark::State& state) { TcpExchange(state, true); }

// Both ranks send to each other and receive from each other in one transfer, as a 2-rank
// all-reduce does; one iteration is one such swap.
void TcpSwap(benchmark::State& state) {
  const auto length = static_cast<std::size_t>(state.range(0));
  auto [root, peer] = connected_pair(true);
  const auto swap = [](tcp::Tcp& transport, std::vector<std::byte>& out, std::vector<std::byte>& in,
                       std::uint64_t sequence) {
    const Header header{cohort::transport::message_type::kCollective, sequence, 0};
    const Send send{1 - transport.rank(), header, out};
    const Receive receive{1 - transport.rank(), header, in};
    transport.transfer({&send, 1}, {&receive, 1});
  };
  std::thread server([&, peer = peer.get()] {
    std::vector<std::byte> out(length, kGoOn), in(length);
    for (std::uint64_t sequence = 0;; ++sequence) {
      swap(*peer, out, in, sequence);
      if (in[0] == kStop) return;
    }
  });
  std::vector<std::byte> out(length, kGoOn), in(length);
  std::uint64_t sequence = 0;
  const auto start = std::chrono::steady_clock::now();
  for (auto _ : state) swap(*root, out, in, sequence++);
  const double microseconds =
      std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count();
  state.counters["bytes"] = static_cast<double>(length);
  state.counters["swap_us"] =
      microseconds / static_cast<double>(std::max<std::int64_t>(state.iterations(), 1));
  out[0] = kStop;
  swap(*root, out, in, sequence);
  server.join();
}
void TcpStream(benchmark::State& state) { TcpExchange(state, false); }
void TcpStreamNoChecksum(benchmark::State& state) { TcpExchange(state, false, false); }

// --- the baseline: plain POSIX sockets ------------------------------------------------------

class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {
    if (fd_ < 0) throw std::runtime_error("socket call failed");
  }
  Fd(Fd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  int get() const { return fd_; }

 private:
  int fd_;
};

std::pair<Fd, Fd> raw_pair() {
  Fd listener(::socket(AF_INET, SOCK_STREAM, 0));
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t size = sizeof address;
  if (::bind(listener.get(), reinterpret_cast<sockaddr*>(&address), size) != 0 ||
      ::listen(listener.get(), 1) != 0 ||
      ::getsockname(listener.get(), reinterpret_cast<sockaddr*>(&address), &size) != 0) {
    throw std::runtime_error("cannot listen");
  }
  Fd client(::socket(AF_INET, SOCK_STREAM, 0));
  if (::connect(client.get(), reinterpret_cast<sockaddr*>(&address), size) != 0) {
    throw std::runtime_error("cannot connect");
  }
  Fd server(::accept(listener.get(), nullptr, nullptr));
  const int one = 1;
  for (const int fd : {client.get(), server.get()}) {
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  }
  return {std::move(client), std::move(server)};
}

// Blocking, or spinning on MSG_DONTWAIT (and yielding, as Tcp does), until every byte has moved.
void send_all(int fd, const std::byte* data, std::size_t length, bool spin) {
  while (length > 0) {
    const ssize_t sent = ::send(fd, data, length, MSG_NOSIGNAL | (spin ? MSG_DONTWAIT : 0));
    if (sent < 0 && errno == EAGAIN) std::this_thread::yield();
    if (sent < 0 && (errno == EAGAIN || errno == EINTR)) continue;
    if (sent <= 0) throw std::runtime_error("send failed");
    data += sent;
    length -= static_cast<std::size_t>(sent);
  }
}

void receive_all(int fd, std::byte* data, std::size_t length, bool spin) {
  while (length > 0) {
    const ssize_t got = ::recv(fd, data, length, spin ? MSG_DONTWAIT : 0);
    if (got < 0 && errno == EAGAIN) std::this_thread::yield();
    if (got < 0 && (errno == EAGAIN || errno == EINTR)) continue;
    if (got <= 0) throw std::runtime_error("recv failed");
    data += got;
    length -= static_cast<std::size_t>(got);
  }
}

void RawExchange(benchmark::State& state, bool echo, bool spin) {
  const auto length = static_cast<std::size_t>(state.range(0));
  auto [client, server_fd] = raw_pair();
  std::thread server([&, fd = server_fd.get()] {
    std::vector<std::byte> buffer(length);
    std::byte ack{0};
    for (;;) {
      receive_all(fd, buffer.data(), length, spin);
      if (echo) {
        send_all(fd, buffer.data(), length, spin);
      } else {
        send_all(fd, &ack, 1, spin);
      }
      if (buffer[0] == kStop) return;
    }
  });
  std::vector<std::byte> out(length, kGoOn), in(echo ? length : 1);
  const auto exchange = [&] {
    send_all(client.get(), out.data(), length, spin);
    receive_all(client.get(), in.data(), in.size(), spin);
  };
  const auto start = std::chrono::steady_clock::now();
  for (auto _ : state) exchange();
  report(state, length, echo, std::chrono::steady_clock::now() - start);
  out[0] = kStop;
  exchange();
  server.join();
}

void RawPingPongBlocking(benchmark::State& state) { RawExchange(state, true, false); }
void RawPingPongSpinning(benchmark::State& state) { RawExchange(state, true, true); }
void RawStreamBlocking(benchmark::State& state) { RawExchange(state, false, false); }
void RawStreamSpinning(benchmark::State& state) { RawExchange(state, false, true); }

void latency_sizes(benchmark::internal::Benchmark* benchmark) {
  benchmark->Arg(8)->Arg(4096)->UseRealTime();
}
void bandwidth_sizes(benchmark::internal::Benchmark* benchmark) {
  benchmark->Arg(1 << 20)->Arg(64 << 20)->UseRealTime();
}

}  // namespace

// A 2-rank elastic mesh (keep_listening, a secret) whose rank 0 has its door open, with `idle`
// connections from this process that connect and say nothing.
struct OpenDoor {
  explicit OpenDoor(int idle) {
    const auto options = [](int rank) {
      return tcp::Options{.rank = rank,
                          .size = 2,
                          .job_id = "bench-door",
                          .rendezvous_port = 0,
                          .keep_listening = true,
                          .secret = "bench-door-secret"};
    };
    tcp::Listener listener(options(0));
    port = listener.rendezvous_port();
    auto peer = std::async(std::launch::async, [&] {
      tcp::Options other = options(1);
      other.rendezvous_port = port;
      return std::make_unique<tcp::Tcp>(other);
    });
    root = std::make_unique<tcp::Tcp>(std::move(listener));
    member = peer.get();
    door = std::make_unique<tcp::Door>(*root);
    for (int i = 0; i < idle; ++i) {
      const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
      sockaddr_in address{};
      address.sin_family = AF_INET;
      address.sin_port = htons(port);
      address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      if (fd < 0 ||
          ::connect(fd, reinterpret_cast<const sockaddr*>(&address), sizeof address) != 0) {
        throw std::runtime_error("could not connect to the door");
      }
      idle_sockets.push_back(fd);
    }
    door->waiting();  // takes the idle connections in
  }
  ~OpenDoor() {
    door.reset();
    for (const int fd : idle_sockets) ::close(fd);
  }

  std::uint16_t port = 0;
  std::unique_ptr<tcp::Tcp> root;
  std::unique_ptr<tcp::Tcp> member;
  std::unique_ptr<tcp::Door> door;
  std::vector<int> idle_sockets;
};

void DoorPoll(benchmark::State& state) {
  OpenDoor open(static_cast<int>(state.range(0)));
  std::size_t waiting = 0;
  for (auto _ : state) waiting += open.door->waiting();
  if (waiting != 0) state.SkipWithError("a connection that never spoke was counted as waiting");
}

void PollFloor(benchmark::State& state) {
  const int listening = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(listening, reinterpret_cast<const sockaddr*>(&address), sizeof address);
  ::listen(listening, 16);
  pollfd entry{listening, POLLIN, 0};
  for (auto _ : state) benchmark::DoNotOptimize(::poll(&entry, 1, 0));
  ::close(listening);
}

BENCHMARK(DoorPoll)->Arg(0)->Arg(8)->Arg(64);
BENCHMARK(PollFloor);
BENCHMARK(TcpPingPong)->Apply(latency_sizes);
BENCHMARK(TcpSwap)->Apply(latency_sizes);
BENCHMARK(RawPingPongBlocking)->Apply(latency_sizes);
BENCHMARK(RawPingPongSpinning)->Apply(latency_sizes);
BENCHMARK(TcpStream)->Apply(bandwidth_sizes);
BENCHMARK(TcpStreamNoChecksum)->Apply(bandwidth_sizes);
BENCHMARK(RawStreamBlocking)->Apply(bandwidth_sizes);
BENCHMARK(RawStreamSpinning)->Apply(bandwidth_sizes);
