// strategy::Elastic: a job that goes on when a worker is lost, and the record of each change.
//
// Between-graph replication isolates each worker in its process; with Elastic it also survives
// one's loss. When a worker's process ends (killed, crashed, its model failed, its host cut off
// past the probe), the others abandon the step in flight, regroup as a job of one worker fewer
// (transport/tcp/regroup.hpp: a roll call, then a rendezvous of the next membership epoch under
// the same secret), take the newest state any of them holds, and retry the step with its
// micro-batches dealt over fewer replicas (core/sharding.hpp, Deal). The global batch, data order
// and reduction tree do not depend on the replica count, so the parameters are the bits of a job
// that never lost anyone (trainer/elastic.hpp).
//
//   cohort::strategy::MultiWorkerMirrored<> strategy({.elastic = {.min_workers = 2}});
//   // or COHORT_MIN_WORKERS=2 in every worker's environment
//
// Below min_workers the job stops as a job without Elastic does, every process with a CommError
// that names the ranks that answered and the ones that did not.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace cohort::strategy {

struct Elastic {
  // The fewest workers the job goes on with after a loss; 0: not elastic, a lost worker stops
  // the job.
  std::size_t min_workers = 0;
  // How long the roll call waits for a worker's listener to answer: a host cut off is counted
  // out after this.
  std::chrono::milliseconds probe_timeout{std::chrono::seconds(2)};

  bool enabled() const { return min_workers > 0; }
};

// One change of a job's membership, as every worker that goes on sees it.
struct MembershipChange {
  std::uint64_t step = 0;  // the step the job retried first with its new membership
  std::size_t workers_before = 0;
  std::size_t workers_after = 0;
  std::vector<int> lost{};  // the ranks, before the change, of the workers lost
  std::string cause{};      // this process's failure that began it
};

}  // namespace cohort::strategy
