// The membership of an elastic MultiWorkerMirrored's workers over their TCP mesh, which both its
// variants (host replicas and GPU workers: multi_worker_mirrored.hpp,
// multi_worker_mirrored_cuda.hpp) change alike, each taking up the next mesh its own way (adopt):
//
//   require_elastic_settings(elastic, workers, regroups);  // before the rendezvous
//   joined = started_membership(mesh, process, door);       // after it
//   regroup_workers(cause, elastic, door, mesh, adopt);     // a worker lost (strategy::Regroups)
//   admit_workers(joiners, elastic, door, mesh, adopt);     // workers taken in (strategy::Grows)
//   ConstructionLoss: a worker lost while the construction set up, for the first run
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <numeric>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "cohort/core/error.hpp"
#include "cohort/core/options.hpp"
#include "cohort/strategy/detail/job_door.hpp"
#include "cohort/strategy/elastic.hpp"
#include "cohort/transport/tcp/regroup.hpp"
#include "cohort/transport/tcp/tcp.hpp"

namespace cohort::strategy::detail {

// Refused before the rendezvous, on every process alike: an elastic job over a transport whose
// ranks do not regroup (`regroups` false), a process told to join a job that is not elastic, and
// more min_workers than the `workers` the job starts with.
inline void require_elastic_settings(const Elastic& elastic, int workers, bool regroups) {
  if (elastic.enabled() && !regroups) {
    options::reject("elastic.min_workers", elastic.min_workers,
                    "needs the TCP transport (transport::tcp::Tcp), whose ranks regroup");
  }
  if (elastic.joins_running_job && !elastic.enabled()) {
    options::reject("elastic.joins_running_job", "true",
                    "needs elastic.min_workers (COHORT_MIN_WORKERS): only an elastic job takes a "
                    "process in");
  }
  if (elastic.min_workers > static_cast<std::size_t>(workers)) {
    options::reject("elastic.min_workers", elastic.min_workers,
                    "exceeds the " + std::to_string(workers) + " workers the job starts with");
  }
}

// After the rendezvous: whether this process joined a running job through its door (a job starts
// at epoch 0; a later one is the place the door gave it, which its rank and the job's size
// become), and its door told whether it is the rank 0 that started the job.
template <class Process>
[[gnu::cold]] bool started_membership(const transport::tcp::Tcp& mesh, Process& process,
                                      JobDoor& door) {
  const bool joined = mesh.options().epoch > 0;
  if (joined) process.regrouped(mesh.rank(), mesh.size());
  door.started(mesh.rank() == 0);
  return joined;
}

// The workers that answer the roll call over mesh() (the current mesh, which adopt replaces), as
// the job's next membership, taken up by adopt(next). A worker lost while adopt sets it up
// (CommError) makes them call the roll again, from the mesh adopt left. Throws CommError below
// elastic.min_workers.
template <class Mesh, class Adopt>
[[gnu::cold]] MembershipChange regroup_workers(const CommError& cause, const Elastic& elastic,
                                               JobDoor& door, Mesh mesh, Adopt adopt) {
  const int before = mesh().size();
  std::fprintf(stderr, "cohort: rank %d: regrouping after: %s\n", mesh().rank(), cause.what());
  std::vector<int> members(static_cast<std::size_t>(before));  // by rank: its rank before
  std::iota(members.begin(), members.end(), 0);
  for (bool adopted = false; !adopted;) {
    transport::tcp::Regrouped next =
        transport::tcp::regroup(mesh(), {.min_size = static_cast<int>(elastic.min_workers),
                                         .probe_timeout = elastic.probe_timeout});
    std::vector<int> left;
    for (const int rank : next.members) left.push_back(members[static_cast<std::size_t>(rank)]);
    members = std::move(left);
    door.regrouped(members.front() == 0);
    try {
      adopt(std::move(next.transport));
      adopted = true;
    } catch (const CommError& lost) {
      std::fprintf(stderr, "cohort: rank %d: regrouping again after: %s\n", mesh().rank(),
                   lost.what());
    }
  }
  MembershipChange change{.workers_before = static_cast<std::size_t>(before),
                          .workers_after = members.size(),
                          .cause = cause.what()};
  for (int rank = 0; rank < before; ++rank) {
    if (std::ranges::find(members, rank) == members.end()) change.lost.push_back(rank);
  }
  return change;
}

// Every process together, at the step boundary where the vote counted `joiners`: the mesh of the
// next epoch, with them after the members (the chief tells them their places), taken up by
// adopt(grown).
template <class Adopt>
[[gnu::cold]] MembershipChange admit_workers(std::size_t joiners, const Elastic& elastic,
                                             JobDoor& door, transport::tcp::Tcp& mesh,
                                             Adopt adopt) {
  const auto before = static_cast<std::size_t>(mesh.size());
  door.welcome(joiners);
  transport::tcp::Tcp grown =
      transport::tcp::grow(mesh, static_cast<int>(joiners), elastic.probe_timeout);
  const auto after = static_cast<std::size_t>(grown.size());
  adopt(std::move(grown));
  return {.workers_before = before, .workers_after = after, .joined = joiners};
}

// A worker lost between an elastic job's rendezvous and the end of a process's construction,
// while the workers learn who shares their hosts (or set up their shared memory): kept for the
// first run (the fit's first segment, or a joiner's first agreement), which throws it, so that the
// fit goes on without that worker as after any loss. The workers that constructed without noticing
// meet it in that segment's first transfer, and every worker left meets the others at the
// regroup's roll call.
class ConstructionLoss {
 public:
  // Whether `lost` is kept: where the job is elastic; otherwise the construction rethrows it.
  [[gnu::cold]] bool keep(const CommError& lost, const Elastic& elastic) {
    if (!elastic.enabled()) return false;
    lost_ = lost;
    return true;
  }

  // At the first run: what was kept, thrown.
  void throw_kept() {
    if (!lost_) return;
    const CommError lost = std::move(*lost_);
    lost_.reset();
    throw lost;
  }

 private:
  std::optional<CommError> lost_;
};

}  // namespace cohort::strategy::detail
