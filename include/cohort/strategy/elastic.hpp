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
//
// The job also grows back, up to max_workers: a process started for it with the same settings (a
// worker its launcher started again, a new host) finds the job running at its rendezvous address
// (transport/tcp/door.hpp), which rank 0 keeps while it is a member; at the next vote (about every
// 0.1 s, trainer/vote.hpp) the job takes it in at the step boundary, and it joins the fit with the
// newest state, from where its program's fit begins. Where rank 0 is lost, the next rank 0 keeps
// the door at the job's rendezvous address if that address is of its host (on one host, always);
// otherwise the job goes on but takes nobody in. A process started for the job knows it joins by
// joins_running_job (COHORT_JOIN=1): a worker started again as rank 0 must not start a job of its
// own.
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
  // The most workers the job grows to when processes started for it ask to join (door.hpp): 0,
  // the number it started with, so that a worker started again takes its place.
  std::size_t max_workers = 0;
  // How long the roll call waits for a worker's process to answer: one stopped or hung, or a host
  // cut off, is counted out after this, and every worker that regroups comes to the roll call
  // within it of the others (one still in a step's compute when the others fail comes late). Also
  // how long the job waits for the processes it takes in to meet it: one that left after the vote
  // is counted out after this, and the members go on without it.
  std::chrono::milliseconds probe_timeout{std::chrono::seconds(2)};
  // Whether this process joins the running job through its door rather than starting it with the
  // others: a worker started again after a loss (COHORT_JOIN=1, which cohort-run sets on the ranks
  // it starts again). Its rank, 0 included, is only where it was: the door gives it its place.
  bool joins_running_job = false;

  bool enabled() const { return min_workers > 0; }
};

// One change of a job's membership, as every worker that goes on sees it.
struct MembershipChange {
  std::uint64_t step = 0;  // the first step of the new membership
  std::size_t workers_before = 0;
  std::size_t workers_after = 0;
  std::vector<int> lost{};  // the ranks, before the change, of the workers lost
  std::string cause{};      // this process's failure that began it
  std::size_t joined = 0;   // the workers taken in
  // The state was rebuilt from what the lost membership kept of it (strategy/detail/
  // kept_stripes.hpp: stripes in shared memory every 16 steps, or each worker's own copy over TCP
  // and by host, keep_schedule.hpp), rather than sent by the worker that held the newest, and the
  // steps since computed again.
  bool from_kept_state = false;
  // From the change's start (the failure noticed, or the vote that took workers in) to the newest
  // state held by every replica: the fit stood still this long, the transfer of the state included.
  double seconds = 0.0;
};

}  // namespace cohort::strategy
