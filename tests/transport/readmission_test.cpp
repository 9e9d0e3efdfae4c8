// Tcp::readmit: a process started again for a lost rank of a running mesh (here a thread of this
// process, on 127.0.0.1, under a secret) gets the mesh's table at rank 0's door, then takes its
// place back at the ranks it needs, which readmit it while their mesh goes on; its frames then
// cross as the lost rank's did. One that proves a wrong secret, or was told another size of the
// mesh, never waits there; one that is refused learns why.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <cohort/transport/tcp/door.hpp>
#include <cstdint>
#include <exception>
#include <future>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "tcp_peers.hpp"

using namespace tcp_test;  // NOLINT: the helpers are this file's vocabulary

namespace {

// A process started again for rank 1 of a mesh of 3, which needs rank 2 only.
tcp::Options rejoining(std::uint16_t port) {
  tcp::Options options = options_for(1, 3);
  options.secret = kSecret;
  options.rendezvous_port = port;
  options.rejoin_peers = {2};
  return options;
}

// Polls `mesh` until a process waits to take back rank `rank`'s place, for 10 s at most.
bool readmission_of(tcp::Tcp& mesh, int rank) {
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  while (Clock::now() < deadline) {
    if (mesh.readmission_waiting() == rank) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return false;
}

// One frame each way between `transport` and `peer`, each side sending its own pattern.
void exchange(tcp::Tcp& transport, int peer) {
  auto out = filled(transport.rank(), 1, 4099);
  std::vector<std::byte> in(4099);
  const Send send{peer, {kCollective, 0, 0}, out};
  const Receive receive{peer, {kCollective, 0, 0}, in};
  transport.transfer({&send, 1}, {&receive, 1});
  CHECK(holds(in, peer, 1));
}

// A mesh of 3 under the secret, each rank listening on: rank 0 keeps its door open until the
// test ends, rank 1 leaves at once (its process lost), and rank 2, which serves one peer at a
// time as a parameter server does, runs `keep(mesh)` once it has seen rank 1 go. `port` gets
// the rendezvous port, where a process started again for rank 1 knocks.
std::vector<std::exception_ptr> mesh_losing_rank_1(std::promise<std::uint16_t>& port,
                                                   const std::function<void(tcp::Tcp&)>& keep) {
  std::atomic<bool> kept = false;
  return run_ranks(
      3,
      [&](tcp::Tcp& mesh) {
        if (mesh.rank() == 0) {
          tcp::Door door(mesh);
          port.set_value(mesh.rendezvous_port());
          while (!kept.load()) {
            door.waiting();
            std::this_thread::sleep_for(std::chrono::milliseconds(5));
          }
        } else if (mesh.rank() == 2) {
          mesh.isolate_peer_failures();
          wait_for_loss_of(mesh, 1);
          try {
            keep(mesh);
          } catch (...) {
            kept.store(true);
            throw;
          }
          kept.store(true);
        }
      },
      elastic);
}

}  // namespace

TEST_CASE(
    "a process started again for a lost rank gets the table at rank 0's door and takes its place "
    "back at the rank that readmits it") {
  std::promise<std::uint16_t> port;
  std::shared_future<std::uint16_t> rendezvous = port.get_future().share();
  std::optional<tcp::Tcp> rejoined;
  std::exception_ptr rejoin_error;
  std::thread rejoiner([&] {
    try {
      rejoined.emplace(rejoining(rendezvous.get()));
      exchange(*rejoined, 2);
    } catch (...) {
      rejoin_error = std::current_exception();
    }
  });
  const auto errors = mesh_losing_rank_1(port, [](tcp::Tcp& mesh) {
    REQUIRE(readmission_of(mesh, 1));
    REQUIRE(mesh.readmit(1));
    exchange(mesh, 1);
  });
  rejoiner.join();
  require_no_errors(errors);
  REQUIRE(message_of(rejoin_error) == "");
  CHECK(rejoined->rank() == 1);
  CHECK(rejoined->size() == 3);
  CHECK(rejoined->addresses().size() == 3);
}

TEST_CASE(
    "a process with another secret or of another size never waits to be readmitted; one refused "
    "learns why") {
  std::promise<std::uint16_t> port;
  std::shared_future<std::uint16_t> rendezvous = port.get_future().share();
  const auto attempt = [&](const std::function<void(tcp::Options&)>& change) {
    tcp::Options options = rejoining(rendezvous.get());
    options.connect_timeout = std::chrono::seconds(2);
    change(options);
    try {
      tcp::Tcp rejoined(options);
    } catch (const cohort::CommError& error) {
      return std::string(error.what());
    }
    return std::string("readmitted");
  };
  std::promise<std::string> wrong_secret;
  std::promise<std::string> wrong_size;
  std::promise<std::string> refused;
  std::thread rejoiners([&] {
    wrong_secret.set_value(attempt([](tcp::Options& options) { options.secret = "guess"; }));
    wrong_size.set_value(attempt([](tcp::Options& options) { options.size = 4; }));
    refused.set_value(attempt([](tcp::Options&) {}));
  });
  const auto errors = mesh_losing_rank_1(port, [&](tcp::Tcp& mesh) {
    // Neither impostor ever waits here; the genuine process is turned away with a reason.
    REQUIRE(readmission_of(mesh, 1));
    mesh.refuse_readmission(1, "rank 1 is not lost here");
    CHECK(mesh.readmission_waiting() == -1);
  });
  rejoiners.join();
  require_no_errors(errors);
  const std::string secret_outcome = wrong_secret.get_future().get();
  const std::string size_outcome = wrong_size.get_future().get();
  const std::string refused_outcome = refused.get_future().get();
  MESSAGE(secret_outcome);
  MESSAGE(size_outcome);
  MESSAGE(refused_outcome);
  CHECK(contains(secret_outcome, "authentication failed"));
  CHECK(contains(size_outcome,
                 "rank 1 asks for its place back in membership epoch 0 of 4 ranks; the running "
                 "job is of epoch 0 of 3 ranks"));
  CHECK(contains(refused_outcome, "rank 1 is not lost here"));
}
