// wait_any (transport.hpp, transport::Serving): which peer has a frame ready, for Loopback and
// Tcp; and Tcp's isolate_peer_failures, with which one peer's failure leaves the others usable.
#include <doctest/doctest.h>

#include <chrono>
#include <cohort/transport/loopback.hpp>
#include <cohort/transport/tcp/tcp.hpp>
#include <cstddef>
#include <future>
#include <optional>
#include <span>
#include <thread>
#include <vector>

namespace {

namespace tcp = cohort::transport::tcp;
using cohort::transport::Header;
using cohort::transport::Receive;
using cohort::transport::Send;
using namespace std::chrono_literals;

constexpr Header kHeader{cohort::transport::message_type::kParameterServer, 0, 7};

template <class T>
void send_byte(T& transport, int peer, std::byte value) {
  const Send send{peer, kHeader, std::span(&value, 1)};
  transport.transfer(std::span(&send, 1), {});
}

template <class T>
std::byte receive_byte(T& transport, int peer) {
  std::byte value{};
  const Receive receive{peer, kHeader, std::span(&value, 1)};
  transport.transfer({}, std::span(&receive, 1));
  return value;
}

// Rank 0 waits on ranks 1 and 2; rank 2 sends first, rank 1 later: wait_any names them in that
// order, and says -1 when nothing comes.
template <class T>
void serve_two(T& transport) {
  const int peers[] = {1, 2};
  CHECK(transport.wait_any(peers, 20ms) == -1);
  int first = -1;
  for (int tries = 0; tries < 100 && first < 0; ++tries) first = transport.wait_any(peers, 100ms);
  CHECK(first == 2);
  CHECK(receive_byte(transport, 2) == std::byte{2});
  int second = -1;
  for (int tries = 0; tries < 100 && second < 0; ++tries) second = transport.wait_any(peers, 100ms);
  CHECK(second == 1);
  CHECK(receive_byte(transport, 1) == std::byte{1});
  // Released only now: a peer that ends its connection counts as ready too.
  send_byte(transport, 1, std::byte{0});
  send_byte(transport, 2, std::byte{0});
}

template <class T>
void client(T& transport) {
  const int rank = transport.rank();
  std::this_thread::sleep_for(rank == 2 ? 150ms : 450ms);
  send_byte(transport, 0, std::byte(rank));
  receive_byte(transport, 0);
}

// Three Tcp ranks as threads of this process; body(rank, transport).
template <class Body>
void run_tcp(int size, Body body, std::chrono::milliseconds timeout = 5s) {
  std::promise<std::uint16_t> port_promise;
  auto port = port_promise.get_future().share();
  std::vector<std::thread> threads;
  for (int rank = 0; rank < size; ++rank) {
    threads.emplace_back([&, rank] {
      tcp::Options options{.rank = rank,
                           .size = size,
                           .job_id = "wait-any",
                           .rendezvous_port = 0,
                           .connect_timeout = 10s,
                           .operation_timeout = timeout};
      if (rank == 0) {
        tcp::Listener listener(options);
        port_promise.set_value(listener.rendezvous_port());
        tcp::Tcp transport(std::move(listener));
        body(rank, transport);
      } else {
        options.rendezvous_port = port.get();
        tcp::Tcp transport(options);
        body(rank, transport);
      }
    });
  }
  for (auto& thread : threads) thread.join();
}

}  // namespace

TEST_CASE("loopback wait_any names the peer whose frame came first, -1 when none") {
  cohort::transport::Loopback group({.ranks = 3, .timeout = 5s});
  std::thread one([&] {
    auto endpoint = group.endpoint(1);
    client(endpoint);
  });
  std::thread two([&] {
    auto endpoint = group.endpoint(2);
    client(endpoint);
  });
  auto endpoint = group.endpoint(0);
  serve_two(endpoint);
  one.join();
  two.join();
}

TEST_CASE("tcp wait_any names the peer whose frame came first, -1 when none") {
  run_tcp(3, [](int rank, tcp::Tcp& transport) {
    if (rank == 0) {
      serve_two(transport);
    } else {
      client(transport);
    }
  });
}

TEST_CASE("tcp wait_any reports a closed peer; with isolation the other peers go on") {
  run_tcp(3, [](int rank, tcp::Tcp& transport) {
    if (rank == 0) {
      transport.isolate_peer_failures();
      const int peers[] = {1, 2};
      int ready = -1;
      for (int tries = 0; tries < 100 && ready < 0; ++tries)
        ready = transport.wait_any(peers, 100ms);
      CHECK(ready == 1);  // rank 1 closed: its next receive fails, naming it
      bool failed = false;
      try {
        receive_byte(transport, 1);
      } catch (const cohort::CommError& error) {
        failed = true;
        CHECK(error.peer() == 1);  // a field, for the layer above to name the process
        CHECK(error.rank() == 0);
        CHECK(std::string(error.what()).find("rank 1") != std::string::npos);
      }
      CHECK(failed);
      send_byte(transport, 2, std::byte{9});  // the connection to rank 2 still works
      CHECK(receive_byte(transport, 2) == std::byte{10});
    } else if (rank == 1) {
      transport.close();
    } else {
      CHECK(receive_byte(transport, 0) == std::byte{9});
      send_byte(transport, 0, std::byte{10});
    }
  });
}

TEST_CASE("loopback wait_any reports a closed peer, whose receive fails with it as peer()") {
  cohort::transport::Loopback group({.ranks = 2, .timeout = 5s});
  auto server = group.endpoint(0);
  auto client = group.endpoint(1);
  client.leave("done here");
  const int peers[] = {1};
  CHECK(server.wait_any(peers, 100ms) == 1);
  bool failed = false;
  try {
    receive_byte(server, 1);
  } catch (const cohort::CommError& error) {
    failed = true;
    CHECK(error.peer() == 1);
    CHECK(error.rank() == 0);
    CHECK(std::string(error.what()).find("rank 1 left: 'done here'") != std::string::npos);
  }
  CHECK(failed);
}
