// transport::Subgroup: some ranks of a transport as a transport of their own. Frames go to the
// members' ranks in the job, wait_any answers in the subgroup's ranks, and failures come back in
// them, with texts that name the job's ranks.
#include <doctest/doctest.h>

#include <chrono>
#include <cohort/transport/loopback.hpp>
#include <cohort/transport/subgroup.hpp>
#include <cstddef>
#include <span>
#include <string>
#include <thread>
#include <vector>

// A namespace of its own, not an anonymous one: the room's files build as one unit.
namespace subgroup_test {

using cohort::transport::Header;
using cohort::transport::Loopback;
using cohort::transport::Receive;
using cohort::transport::Send;
using Subgroup = cohort::transport::Subgroup<Loopback::Endpoint>;
using namespace std::chrono_literals;

constexpr Header kHeader{cohort::transport::message_type::kCollective, 1, 7};

void send_byte(Subgroup& group, int peer, std::byte value, Header header = kHeader) {
  const Send send{peer, header, std::span(&value, 1)};
  group.transfer(std::span(&send, 1), {});
}

std::byte receive_byte(Subgroup& group, int peer) {
  std::byte value{};
  const Receive receive{peer, kHeader, std::span(&value, 1)};
  group.transfer({}, std::span(&receive, 1));
  return value;
}

// Ranks 1 and 3 of a job of 4 as a subgroup: body(group) on each, as its own thread.
template <class Body>
void odd_ranks(Body body) {
  Loopback job({.ranks = 4, .timeout = 2s});
  std::vector<std::thread> threads;
  for (const int rank : {1, 3}) {
    threads.emplace_back([&, rank] {
      auto endpoint = job.endpoint(rank);
      Subgroup group(endpoint, {1, 3});
      body(group);
    });
  }
  for (auto& thread : threads) thread.join();
}

TEST_CASE("a subgroup numbers its members from 0 and moves their frames between the job's ranks") {
  odd_ranks([](Subgroup& group) {
    CHECK(group.size() == 2);
    CHECK(group.job_rank(group.rank()) == (group.rank() == 0 ? 1 : 3));
    if (group.rank() == 1) {
      send_byte(group, 0, std::byte{42});
      return;
    }
    const int peers[] = {1};
    int ready = -1;
    for (int tries = 0; tries < 50 && ready < 0; ++tries) ready = group.wait_any(peers, 100ms);
    CHECK(ready == 1);
    CHECK(receive_byte(group, 1) == std::byte{42});
  });
}

TEST_CASE("a subgroup's failures come back in its ranks and name the job's") {
  // A frame of another header: a HeaderMismatch whose fields are the subgroup's ranks.
  odd_ranks([](Subgroup& group) {
    if (group.rank() == 1) {
      send_byte(group, 0, std::byte{1}, Header{kHeader.type, 2, kHeader.tag});
      return;
    }
    try {
      receive_byte(group, 1);
      FAIL("no mismatch");
    } catch (const cohort::transport::HeaderMismatch& mismatch) {
      CHECK(mismatch.rank() == 0);
      CHECK(mismatch.peer() == 1);
      CHECK(mismatch.received.sequence == 2);
    }
  });
  // A member that leaves: its peer's receive fails, the field the subgroup's rank, the text the
  // job's.
  odd_ranks([](Subgroup& group) {
    if (group.rank() == 1) {
      group.leave("stopped by the test");
      return;
    }
    try {
      receive_byte(group, 1);
      FAIL("no failure");
    } catch (const cohort::CommError& error) {
      CAPTURE(error.what());
      CHECK(error.rank() == 0);
      CHECK(error.peer() == 1);
      CHECK(std::string(error.detail()).find("rank 3") != std::string::npos);
    }
  });
}

}  // namespace subgroup_test
