// tcp::Door and tcp::grow: a process started for a running job (here a thread of this process,
// on 127.0.0.1, under a secret) meets rank 0's door instead of a rendezvous, waits there until
// the members take it in, and joins the mesh of the next epoch in the place the door gave it; a
// stranger is refused at the door, and the door goes on; a newcomer that never comes fails the
// grow within its timeout, and the members regroup from the mesh they had; once the rank 0 that
// started the job is lost, the next one keeps the door at the job's rendezvous address, where a
// process started again as rank 0 joins; where that address is another host's, it keeps the door
// at the same port of its own host, where a process that joins finds it among the job's hosts,
// and where a rank 0 started again as at the job's start finds it and joins, also one started
// before the door opened again, which asks again while it waits (one whose others never come
// times out naming the hosts where no door answered);
// a process that joins finds no door at a job that starts;
// a flood of idle connections at the door is held to max_pending_connections, and a process
// started for the job still comes in.
#include <arpa/inet.h>
#include <doctest/doctest.h>
#include <poll.h>
#include <sys/socket.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cohort/transport/tcp/door.hpp>
#include <cohort/transport/tcp/regroup.hpp>
#include <cstdint>
#include <exception>
#include <filesystem>
#include <functional>
#include <future>
#include <iterator>
#include <latch>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "tcp_peers.hpp"

using namespace tcp_test;  // NOLINT: the helpers are this file's vocabulary

namespace {

// Polls `door` until `count` processes wait there, for 10 s at most.
bool wait_at(tcp::Door& door, std::size_t count) {
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  while (door.waiting() < count) {
    if (Clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

// Every member of `mesh` together: rank 0 takes in the one process waiting at its `door` (empty on
// the others), closes the door as the strategy does, and tells the others by `admitted`, which
// they wait for (`grow`); then the mesh of the next epoch, grown by it.
tcp::Tcp grown_by_one(tcp::Tcp& mesh, std::optional<tcp::Door>& door, std::promise<void>& admitted,
                      const std::shared_future<void>& grow) {
  if (door) {
    REQUIRE(wait_at(*door, 1));
    CHECK(door->welcome(1) == 1);
    door.reset();
    admitted.set_value();
  } else {
    grow.wait();
  }
  return tcp::grow(mesh, 1, std::chrono::seconds(10));
}

// Once `joining` (the newcomer's thread) ends: no member failed, and the newcomer is rank 2 of
// the grown mesh of 3, in epoch 1.
void require_joined_as_third(std::thread& joining, const std::vector<std::exception_ptr>& errors,
                             const std::optional<tcp::Tcp>& joiner) {
  joining.join();
  require_no_errors(errors);
  REQUIRE(joiner.has_value());
  CHECK(joiner->rank() == 2);
  CHECK(joiner->size() == 3);
  CHECK(joiner->options().epoch == 1);
}

// A process started again as rank `rank` of the job's first `size`, at the job's rendezvous port.
tcp::Options started_again(int rank, int size, std::uint16_t port, const std::string& secret) {
  tcp::Options options = options_for(rank, size);
  elastic(options);
  options.secret = secret;
  options.rendezvous_port = port;
  return options;
}

}  // namespace

TEST_CASE(
    "a process started for a running job waits at rank 0's door, is taken in, and joins the mesh "
    "of the next epoch after the members") {
  std::promise<std::uint16_t> port_promise;
  std::shared_future<std::uint16_t> port = port_promise.get_future().share();
  std::promise<void> admitted;  // rank 0 tells rank 1 that the job grows by one
  std::shared_future<void> grow = admitted.get_future().share();
  std::optional<tcp::Tcp> joiner;
  std::thread joining([&] {
    // It claims rank 1 of 2, as the worker it replaces was; the door places it.
    joiner.emplace(started_again(1, 2, port.get(), kSecret));
    ring_once(*joiner);
  });
  const auto errors = run_ranks(
      2,
      [&](tcp::Tcp& mesh) {
        std::optional<tcp::Door> door;
        if (mesh.rank() == 0) {
          port_promise.set_value(mesh.rendezvous_port());
          door.emplace(mesh);
        }
        tcp::Tcp next = grown_by_one(mesh, door, admitted, grow);
        CHECK(next.size() == 3);
        CHECK(next.rank() == mesh.rank());
        CHECK(next.options().epoch == 1);
        ring_once(next);
      },
      elastic);
  require_joined_as_third(joining, errors, joiner);
}

TEST_CASE("a stranger without the secret is refused at the door, and the door goes on") {
  std::promise<std::uint16_t> port_promise;
  std::shared_future<std::uint16_t> port = port_promise.get_future().share();
  std::string refused;
  std::size_t waiting_after_stranger = 99;
  const auto errors = run_ranks(
      2,
      [&](tcp::Tcp& mesh) {
        if (mesh.rank() != 0) return;
        tcp::Door door(mesh);
        port_promise.set_value(mesh.rendezvous_port());
        std::atomic<bool> done = false;
        std::thread stranger([&] {
          try {
            tcp::Tcp transport(started_again(1, 2, port.get(), "not the secret"));
          } catch (const cohort::CommError& error) {
            refused = error.what();
          }
          done = true;
        });
        while (!done) {
          door.waiting();
          std::this_thread::sleep_for(std::chrono::milliseconds(5));
        }
        stranger.join();
        waiting_after_stranger = door.waiting();
      },
      elastic);
  require_no_errors(errors);
  CHECK(waiting_after_stranger == 0);
  CHECK(contains(refused, "rank 1: rendezvous: authentication failed with rank 0"));
}

TEST_CASE(
    "a newcomer that never comes after its welcome fails the grow on every member within its "
    "timeout, and the members regroup from the mesh they had") {
  std::vector<std::string> failures(2);
  const auto errors = run_ranks(
      2,
      [&](tcp::Tcp& mesh) {
        try {
          tcp::grow(mesh, 1, std::chrono::seconds(1));  // the vote counted one; it is gone
        } catch (const cohort::CommError& error) {
          failures[static_cast<std::size_t>(mesh.rank())] = error.what();
        }
        tcp::Regrouped next =
            tcp::regroup(mesh, {.min_size = 2, .probe_timeout = std::chrono::seconds(2)});
        CHECK(next.members == std::vector<int>{0, 1});
        CHECK(next.transport.rank() == mesh.rank());
        ring_once(next.transport);
      },
      elastic);
  require_no_errors(errors);
  CHECK(contains(failures[0], "rank 0: rendezvous: timed out after 1000 ms"));
  CHECK(contains(failures[1], "rank 1: rendezvous"));
}

namespace {

// A program that is no cohort rank, at `host`:`port` while it lives: it reads what each connection
// sends first, answers with a line of another protocol and closes it.
class Stranger {
 public:
  Stranger(const char* host, std::uint16_t port) {
    RawSocket listening(::socket(AF_INET, SOCK_STREAM, 0));
    sockaddr_in address = loopback(port);
    REQUIRE(::inet_pton(AF_INET, host, &address.sin_addr) == 1);
    REQUIRE(::bind(listening.fd(), reinterpret_cast<const sockaddr*>(&address), sizeof address) ==
            0);
    REQUIRE(::listen(listening.fd(), 8) == 0);
    thread_ = std::thread([this, listening = std::move(listening)] { answer(listening); });
  }
  Stranger(const Stranger&) = delete;
  Stranger& operator=(const Stranger&) = delete;
  ~Stranger() {
    stop_ = true;
    thread_.join();
  }

 private:
  void answer(const RawSocket& listening) const {
    while (!stop_) {
      pollfd ready{.fd = listening.fd(), .events = POLLIN, .revents = 0};
      if (::poll(&ready, 1, 20) != 1) continue;
      const RawSocket connection(::accept(listening.fd(), nullptr, nullptr));
      std::array<char, 4096> request{};
      if (::recv(connection.fd(), request.data(), request.size(), 0) <= 0) continue;
      constexpr std::string_view kAnswer =
          "HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain\r\nContent-Length: 36\r\n"
          "\r\nThis port serves another program.\r\n";
      ::send(connection.fd(), kAnswer.data(), kAnswer.size(), MSG_NOSIGNAL);
      ::shutdown(connection.fd(), SHUT_WR);
      while (::recv(connection.fd(), request.data(), request.size(), 0) > 0) {
      }
    }
  }

  std::atomic<bool> stop_ = false;
  std::thread thread_;
};

// When the process started again comes: at once (before the survivors regrouped, as a launcher
// would), once they regrouped but 2.5 s before the door opens (as after a loss noticed late), or
// once the door is open.
enum class Comes { kAtOnce, kBeforeDoorOpens, kOnceDoorOpens };

// A job of 3 on 127.0.0.1 whose rank 0 is lost at once (`at_loss` runs on it first, with the
// job's port; its Tcp ends then, its listener with it): the others regroup, and the next rank 0
// keeps the door at the job's port of `door_host` (127.0.0.1, the job's address; another, as
// another host). A process started with `options_of(port)` when `comes` says must be taken in
// as rank 2 of epoch 2.
void require_taken_in_at_next_door(const char* door_host,
                                   const std::function<void(std::uint16_t)>& at_loss,
                                   const std::function<tcp::Options(std::uint16_t)>& options_of,
                                   Comes comes) {
  std::promise<std::uint16_t> port_promise;
  std::shared_future<std::uint16_t> port = port_promise.get_future().share();
  std::promise<void> door_open;
  std::shared_future<void> opened = door_open.get_future().share();
  std::promise<void> admitted;
  std::shared_future<void> grow = admitted.get_future().share();
  std::latch regrouped(2);
  std::promise<void> regrouped_promise;
  std::shared_future<void> survivors_regrouped = regrouped_promise.get_future().share();
  std::optional<tcp::Tcp> joiner;
  std::string joiner_error;
  std::thread joining([&] {
    if (comes == Comes::kBeforeDoorOpens) survivors_regrouped.wait();
    if (comes == Comes::kOnceDoorOpens) opened.wait();
    try {
      joiner.emplace(options_of(port.get()));
      ring_once(*joiner);
    } catch (const cohort::CommError& error) {
      joiner_error = error.what();
    }
  });
  const auto errors = run_ranks(
      3,
      [&](tcp::Tcp& mesh) {
        if (mesh.rank() == 0) {
          at_loss(mesh.rendezvous_port());
          port_promise.set_value(mesh.rendezvous_port());
          return;
        }
        wait_for_loss_of(mesh, 0);
        tcp::Regrouped next =
            tcp::regroup(mesh, {.min_size = 2, .probe_timeout = std::chrono::seconds(2)});
        regrouped.arrive_and_wait();
        REQUIRE(next.members == std::vector<int>{1, 2});
        if (next.transport.rank() == 0) {
          regrouped_promise.set_value();
          if (comes == Comes::kBeforeDoorOpens)
            std::this_thread::sleep_for(std::chrono::milliseconds(2500));
          const tcp::Listener held(next.transport.options(), {door_host, port.get()});
          tcp::Door door(next.transport, held);
          door_open.set_value();
          const bool came = wait_at(door, 1);
          CHECK(door.welcome(1) == 1);
          admitted.set_value();  // also where it did not come: the other fails its grow, bounded
          REQUIRE(came);
        } else {
          grow.wait();
        }
        tcp::Tcp grown = tcp::grow(next.transport, 1, std::chrono::seconds(10));
        CHECK(grown.size() == 3);
        CHECK(grown.options().epoch == 2);
        ring_once(grown);
      },
      elastic);
  joining.join();
  require_no_errors(errors);
  CHECK(joiner_error == "");
  REQUIRE(joiner.has_value());
  CHECK(joiner->rank() == 2);
  CHECK(joiner->size() == 3);
  CHECK(joiner->options().epoch == 2);
}

}  // namespace

TEST_CASE(
    "once the rank 0 that started the job is lost, the next rank 0 keeps the door at the job's "
    "rendezvous address, and a process started again as rank 0 joins there") {
  require_taken_in_at_next_door(
      "127.0.0.1", [](std::uint16_t /*port*/) {},
      [](std::uint16_t port) {
        tcp::Options options = started_again(0, 3, port, kSecret);
        options.joins_running_job = true;
        return options;
      },
      Comes::kAtOnce);
}

TEST_CASE(
    "once rank 0's host is lost, the next rank 0 keeps the door at the job's port on its own host, "
    "and a process started again finds it among the job's hosts, past a stranger at that port of "
    "another") {
  std::optional<Stranger> stranger;
  require_taken_in_at_next_door(
      "127.0.0.3", [&](std::uint16_t port) { stranger.emplace("127.0.0.2", port); },
      [](std::uint16_t port) {
        // The job's hosts as 127.0.0.2 (the stranger's) and 127.0.0.3
        // (the next rank 0's).
        tcp::Options options = started_again(0, 3, port, kSecret);
        options.joins_running_job = true;
        options.door_hosts = {"127.0.0.2", "127.0.0.3"};
        return options;
      },
      Comes::kAtOnce);
}

TEST_CASE(
    "a rank 0 started again as at the job's start finds its job running at a door of the job's "
    "hosts, past its own port, and joins it: once the door is open, or before, asking the hosts "
    "again while it waits") {
  for (const Comes comes : {Comes::kOnceDoorOpens, Comes::kBeforeDoorOpens}) {
    CAPTURE(comes == Comes::kBeforeDoorOpens);
    require_taken_in_at_next_door(
        "127.0.0.3", [](std::uint16_t /*port*/) {},
        [](std::uint16_t port) {
          // Neither told that it joins nor where the door is: the job's
          // hosts as 127.0.0.1 (its own, where it binds the job's port)
          // and 127.0.0.3 (the next rank 0's).
          tcp::Options options = started_again(0, 3, port, kSecret);
          options.door_hosts = {"127.0.0.1", "127.0.0.3"};
          return options;
        },
        comes);
  }
}

TEST_CASE(
    "a rank 0 of an elastic job whose other ranks never come, and at whose hosts no door answers, "
    "times out naming both") {
  tcp::Options options = options_for(0, 2);
  elastic(options);
  options.rendezvous_port = tcp::Listener(options).rendezvous_port();  // a port free just now
  options.connect_timeout = std::chrono::milliseconds(1500);
  options.door_hosts = {"127.0.0.1", "127.0.0.2"};  // its own host, and one where nobody listens
  std::string error;
  try {
    tcp::Tcp transport(options);
  } catch (const cohort::CommError& failure) {
    error = failure.what();
  }
  CHECK(contains(error,
                 "rank 0: rendezvous: timed out after 1500 ms: rank 1 never joined, nor "
                 "did a running job's door answer at port " +
                     std::to_string(options.rendezvous_port) + " of 127.0.0.1, 127.0.0.2"));
}

TEST_CASE(
    "a process that joins a running job and finds one starting at its address is refused with a "
    "sentence, and the job forms without it") {
  tcp::Options first = options_for(0, 2);
  elastic(first);
  tcp::Listener listener(first);
  const std::uint16_t port = listener.rendezvous_port();
  std::optional<tcp::Tcp> rank_0;
  std::thread starting([&] { rank_0.emplace(std::move(listener)); });
  std::string refused;
  std::thread joining([&] {
    tcp::Options options = started_again(0, 2, port, kSecret);
    options.joins_running_job = true;
    try {
      tcp::Tcp transport(options);
    } catch (const cohort::CommError& error) {
      refused = error.what();
    }
  });
  joining.join();
  tcp::Tcp rank_1(started_again(1, 2, port, kSecret));
  starting.join();
  REQUIRE(rank_0.has_value());
  std::thread ring([&] { ring_once(*rank_0); });
  ring_once(rank_1);
  ring.join();
  CHECK(contains(refused,
                 "rank 0: rendezvous: came to join a running job (joins_running_job, "
                 "COHORT_JOIN), and found the job at 127.0.0.1:" +
                     std::to_string(port) + " starting"));
}

TEST_CASE(
    "with a secret, 2000 idle connections at the door under a limit of 1024 descriptors: the door "
    "holds at most max_pending_connections of them, and a process started for the job still "
    "waits there, is taken in and joins the grown mesh") {
  const DescriptorLimit limit(1024);
  std::promise<std::uint16_t> port_promise;
  std::shared_future<std::uint16_t> port = port_promise.get_future().share();
  std::promise<void> admitted;
  std::shared_future<void> grow = admitted.get_future().share();
  std::optional<tcp::Tcp> joiner;
  std::thread joining([&] {
    joiner.emplace(started_again(1, 2, port.get(), kSecret));
    ring_once(*joiner);
  });
  std::size_t before = 0;
  std::size_t during = 0;
  const auto errors = run_ranks(
      2,
      [&](tcp::Tcp& mesh) {
        std::optional<tcp::Door> door;
        std::optional<cohort::testing::IdleFlood> flood;
        if (mesh.rank() == 0) {
          door.emplace(mesh);
          before = open_descriptors();
          flood.emplace(mesh.rendezvous_port(), 2000);
          CHECK(flood->connected() == 2000);
          // The joiner starts after the flood, so it comes last to the door.
          port_promise.set_value(mesh.rendezvous_port());
          REQUIRE(wait_at(*door, 1));
          during = open_descriptors();
        }
        tcp::Tcp next = grown_by_one(mesh, door, admitted, grow);
        CHECK(next.size() == 3);
        ring_once(next);
      },
      elastic);
  require_joined_as_third(joining, errors, joiner);
  // The flood's connections held in the door, at most the bound, and the joiner's own (its
  // listener, its connection each way, its event loop): 2000 would have passed the limit.
  CAPTURE(before);
  CAPTURE(during);
  CHECK(during <= before + static_cast<std::size_t>(tcp::Options{}.max_pending_connections) + 16);
}
