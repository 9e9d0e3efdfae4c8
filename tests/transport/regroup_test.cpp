// tcp::regroup: ranks of a mesh that lost one (ended, or stopped with its listener still
// accepting) form the next membership epoch's mesh among themselves, as threads of this process
// on 127.0.0.1, under a secret; a rank of a later epoch is refused, and one of an earlier epoch
// held off, without failing the rendezvous. tcp::renumber: the members of a mesh take another
// order as the next epoch, rank 0 keeping its place.
#include <doctest/doctest.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cohort/transport/tcp/regroup.hpp>
#include <cstdint>
#include <future>
#include <latch>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "tcp_peers.hpp"

using namespace tcp_test;  // NOLINT: the helpers are this file's vocabulary

namespace {

// `size` ranks meet; rank `lost` is lost (`how`) and the others regroup with at least min_size
// ranks. Returns, by old rank, the members each saw (empty for the lost rank) and its new rank,
// or what it threw.
struct Outcome {
  std::vector<int> members;
  int rank = -1;
  int size = 0;
  std::string error;
};
enum class Loss {
  kEnds,   // its Tcp ends: the process died, and its listener refuses
  kHangs,  // it holds its Tcp and answers nothing: a process stopped or hung, whose kernel still
           // accepts connections on its listener
};
std::vector<Outcome> lose_one(int size, int lost, int min_size, Loss how = Loss::kEnds) {
  std::vector<Outcome> outcomes(static_cast<std::size_t>(size));
  // The survivors keep their old meshes until each has regrouped or failed to, so that none
  // ends before the others' roll call counts it.
  std::latch regrouped(size - 1);
  const auto errors = run_ranks(
      size,
      [&](tcp::Tcp& transport) {
        if (transport.rank() == lost) {
          if (how == Loss::kHangs) regrouped.wait();
          return;
        }
        Outcome& outcome = outcomes[static_cast<std::size_t>(transport.rank())];
        // A hung rank's connections stay up: the survivors regroup as after a timeout.
        if (how == Loss::kEnds) wait_for_loss_of(transport, lost);
        std::optional<tcp::Regrouped> next;
        try {
          next.emplace(tcp::regroup(
              transport, {.min_size = min_size, .probe_timeout = std::chrono::seconds(2)}));
        } catch (const cohort::CommError& error) {
          outcome.error = error.what();
        }
        regrouped.arrive_and_wait();
        if (!next) return;
        tcp::Tcp& mesh = next->transport;
        outcome.members = next->members;
        outcome.rank = mesh.rank();
        outcome.size = mesh.size();
        CHECK(mesh.options().epoch == 1);
        ring_once(mesh);  // the new mesh carries data
      },
      elastic);
  require_no_errors(errors);
  return outcomes;
}

}  // namespace

TEST_CASE("the ranks left after one ends regroup as the next epoch, in the order of old ranks") {
  for (const int lost : {2, 0}) {
    CAPTURE(lost);
    const auto outcomes = lose_one(4, lost, 2);
    std::vector<int> survivors;
    for (int rank = 0; rank < 4; ++rank) {
      if (rank != lost) survivors.push_back(rank);
    }
    for (const int rank : survivors) {
      const Outcome& outcome = outcomes[static_cast<std::size_t>(rank)];
      CAPTURE(rank);
      CHECK(outcome.error == "");
      CHECK(outcome.members == survivors);
      CHECK(outcome.size == 3);
      CHECK(outcome.rank ==
            static_cast<int>(std::ranges::find(survivors, rank) - survivors.begin()));
    }
  }
}

TEST_CASE(
    "a rank that is stopped or hung, its kernel still accepting on its listener, is counted out "
    "after probe_timeout, rank 0 too") {
  for (const int lost : {1, 0}) {
    CAPTURE(lost);
    const auto outcomes = lose_one(3, lost, 2, Loss::kHangs);
    const std::vector<int> survivors = lost == 0 ? std::vector{1, 2} : std::vector{0, 2};
    for (const int rank : survivors) {
      const Outcome& outcome = outcomes[static_cast<std::size_t>(rank)];
      CAPTURE(rank);
      CHECK(outcome.error == "");
      CHECK(outcome.members == survivors);
      CHECK(outcome.size == 2);
    }
  }
}

TEST_CASE(
    "a rank that answered the roll call and ends before the next epoch's mesh stands: the others "
    "call the roll again and regroup without it") {
  constexpr int kLost = 2;  // ends at once
  constexpr int kLate = 3;  // answers the first roll call, then ends
  std::vector<Outcome> outcomes(4);
  std::latch regrouped(2);
  const auto errors = run_ranks(
      4,
      [&](tcp::Tcp& transport) {
        const int rank = transport.rank();
        if (rank == kLost) return;
        wait_for_loss_of(transport, kLost);
        if (rank == kLate) {
          const std::vector<bool> answered = tcp::RollCall(transport).call(std::chrono::seconds(1));
          CHECK(answered == std::vector<bool>{true, true, false, true});
          return;
        }
        Outcome& outcome = outcomes[static_cast<std::size_t>(rank)];
        std::optional<tcp::Regrouped> next;
        try {
          next.emplace(
              tcp::regroup(transport, {.min_size = 2, .probe_timeout = std::chrono::seconds(1)}));
        } catch (const cohort::CommError& error) {
          outcome.error = error.what();
        }
        regrouped.arrive_and_wait();
        if (!next) return;
        outcome.members = next->members;
        outcome.size = next->transport.size();
        ring_once(next->transport);
      },
      elastic);
  require_no_errors(errors);
  for (const int rank : {0, 1}) {
    CAPTURE(rank);
    const Outcome& outcome = outcomes[static_cast<std::size_t>(rank)];
    CHECK(outcome.error == "");
    CHECK(outcome.members == std::vector{0, 1});
    CHECK(outcome.size == 2);
  }
}

TEST_CASE("fewer ranks left than min_size is an error naming who answered and who did not") {
  const auto outcomes = lose_one(3, 1, 3);
  for (const int rank : {0, 2}) {
    CAPTURE(rank);
    CHECK(outcomes[static_cast<std::size_t>(rank)].error ==
          "rank " + std::to_string(rank) +
              ": regroup: 2 of 3 ranks answer (ranks 0, 2; rank 1 ended, left or did not answer "
              "within 2000 ms), fewer than the 3 the job needs");
  }
}

namespace {

// Ranks 0 and 1 of membership epoch 1 meet while another rank 1, of epoch `epoch` and with
// `connect_timeout`, comes to the same rendezvous (`first`: and is done before the real rank 1
// starts). Returns what the other one threw.
std::string another_epoch_at_rendezvous(std::uint32_t epoch,
                                        std::chrono::milliseconds connect_timeout, bool first) {
  std::promise<std::uint16_t> port_promise;
  auto port = port_promise.get_future().share();
  const auto rank_of_epoch = [&](int rank, std::uint32_t of_epoch) {
    tcp::Options options = options_for(rank, 2);
    elastic(options);
    options.epoch = of_epoch;
    return options;
  };
  std::string error;
  std::thread other([&] {
    tcp::Options options = rank_of_epoch(1, epoch);
    options.connect_timeout = connect_timeout;
    options.rendezvous_port = port.get();
    try {
      tcp::Tcp transport(options);
    } catch (const cohort::CommError& failure) {
      error = failure.what();
    }
  });
  std::thread current([&] {
    if (first) other.join();
    tcp::Options options = rank_of_epoch(1, 1);
    options.rendezvous_port = port.get();
    tcp::Tcp transport(options);
    CHECK(transport.options().epoch == 1);
  });
  tcp::Listener listener(rank_of_epoch(0, 1));
  port_promise.set_value(listener.rendezvous_port());
  tcp::Tcp transport(std::move(listener));
  current.join();
  if (!first) other.join();
  return error;
}

}  // namespace

TEST_CASE("a rank of a later membership epoch is refused, and the epoch's mesh still forms") {
  // A rank that regrouped once more, without rank 0.
  CHECK(another_epoch_at_rendezvous(2, std::chrono::seconds(10), true) ==
        "rank 1: rendezvous: rank 0 is of membership epoch 1 of this job, rank 1 of epoch 2: the "
        "job regrouped without rank 0");
}

TEST_CASE(
    "a rank of an earlier membership epoch (a process started again) is held off without a word: "
    "it knocks again until its own deadline, and the epoch's mesh forms meanwhile") {
  CHECK(contains(another_epoch_at_rendezvous(0, std::chrono::milliseconds(1500), false),
                 "rank 1: rendezvous: timed out after 1500 ms: rank 0 never answered"));
}

TEST_CASE("the members take the order they give as the next epoch, rank 0 keeping its place") {
  // Old rank r is new rank order[r], as MultiWorkerMirrored orders by host the ranks of 2 hosts
  // whose second rank of host 0 came last (a worker that joined).
  const std::vector<int> order{0, 2, 3, 1};
  const auto errors = run_ranks(
      4,
      [&](tcp::Tcp& mesh) {
        const int old_rank = mesh.rank();
        tcp::Tcp next = tcp::renumber(mesh, order[static_cast<std::size_t>(old_rank)],
                                      std::chrono::seconds(10));
        CHECK(next.rank() == order[static_cast<std::size_t>(old_rank)]);
        CHECK(next.size() == 4);
        CHECK(next.options().epoch == 1);
        // Each tells its right-hand neighbour in the new order who it was: the process there is
        // the one the order put there.
        const int right = (next.rank() + 1) % 4;
        const int left = (next.rank() + 3) % 4;
        std::array<std::byte, 1> out{static_cast<std::byte>(old_rank)};
        std::array<std::byte, 1> in{};
        const Send send{right, {kCollective, 0, 0}, out};
        const Receive receive{left, {kCollective, 0, 0}, in};
        next.transfer({&send, 1}, {&receive, 1});
        CHECK(order[static_cast<std::size_t>(in[0])] == left);
        ring_once(next);
      },
      elastic);
  require_no_errors(errors);
}
