// Runs one body per local replica on its own thread, the calling thread being the first, and
// turns a failure of any replica into a prompt failure of all: the failing replica aborts its
// communicator (which releases the others' collectives), and once every thread has returned the
// cause is rethrown: the first failure recorded, unless it is a CommError whose peer() is
// another replica that failed too (a collective abandoned because that replica aborted), in
// which case that replica's own. The abort comes before its replica's failure is recorded (the
// Trainer aborts as the step unwinds), so the others' consequences can be recorded first.
// Shared by every strategy that runs replicas as threads.
#pragma once

#include <cstddef>
#include <exception>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "cohort/core/error.hpp"
#include "cohort/core/options.hpp"
#include "cohort/core/reduction_tree.hpp"

namespace cohort::strategy::detail {

// The replica threads of one worker process of a job of several: a power of two, so that they
// fold a whole subtree of the reduction and the job's result is the tree over all replicas.
inline void require_local_replicas(std::size_t local_replicas) {
  options::require_positive("local_replicas", local_replicas);
  if (!tree::is_subtree(0, local_replicas)) {
    options::reject("local_replicas", local_replicas,
                    "must be a power of two, so that each worker's replicas form one subtree of "
                    "the reduction (core/reduction_tree.hpp)");
  }
}

// make_replica(local_index) builds the replica handed to body, on the replica's own thread (a GPU
// replica sets its device there); the replica has communicator().abort().
template <class MakeReplica, class Body>
void run_replica_threads(std::size_t count, MakeReplica&& make_replica, Body& body) {
  std::vector<std::exception_ptr> failures(count);
  std::vector<std::size_t> recorded;  // the replicas that failed, in the order they recorded it
  std::mutex mutex;
  const auto record = [&](std::size_t local_index) {
    const std::lock_guard lock(mutex);
    failures[local_index] = std::current_exception();
    recorded.push_back(local_index);
  };
  auto replica_main = [&](std::size_t local_index) {
    try {
      auto replica = make_replica(local_index);
      try {
        body(replica);
      } catch (...) {
        record(local_index);
        replica.communicator().abort(what_of(std::current_exception()));
      }
    } catch (...) {
      // The replica could not be built (its device, or its communicator's set-up): it has no
      // communicator to abort, so the others fail when their set-up or first collective times out.
      record(local_index);
    }
  };
  {
    std::vector<std::jthread> threads;
    threads.reserve(count - 1);
    for (std::size_t local_index = 1; local_index < count; ++local_index) {
      threads.emplace_back(replica_main, local_index);
    }
    // The calling thread is the first replica: one thread fewer, and the chief's output stays
    // on the user's thread.
    replica_main(0);
  }
  if (recorded.empty()) return;
  // Whether replica i's failure names another replica that failed as its peer.
  const auto consequence = [&](std::size_t i) {
    try {
      std::rethrow_exception(failures[i]);
    } catch (const CommError& error) {
      const int peer = error.peer();
      return peer >= 0 && static_cast<std::size_t>(peer) < count &&
             static_cast<std::size_t>(peer) != i && failures[static_cast<std::size_t>(peer)];
    } catch (...) {
    }
    return false;
  };
  for (const std::size_t i : recorded) {
    if (!consequence(i)) std::rethrow_exception(failures[i]);
  }
  std::rethrow_exception(failures[recorded.front()]);
}

}  // namespace cohort::strategy::detail
