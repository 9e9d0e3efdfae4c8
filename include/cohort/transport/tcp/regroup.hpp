// tcp::regroup, tcp::grow and tcp::renumber: a mesh's next membership epoch, without a restart.
// regroup: the ranks of a mesh that failed, as a mesh of their own. Every rank that goes on calls
// it on its failed Tcp, which kept listening (Options::keep_listening):
//
//   tcp::Regrouped next = tcp::regroup(failed, {.min_size = 2, .probe_timeout = 2s});
//   // next.transport: the new mesh; next.members[r]: the old rank of its rank r
//
//   1. The roll call (roll_call.hpp): the rank asks every other rank's process, where it
//      listened at the rendezvous, whether it regroups too, and answers theirs. A process that
//      ended or left (Tcp::stop_listening, before it told anyone) refuses the connection; one that
//      is stopped or hung, or whose host is cut off, is not heard within probe_timeout. Ranks that
//      come to the roll call within probe_timeout of each other see the same answers.
//   2. The members are the ranks that answered, in the order of their old ranks: rank r of the
//      new mesh is the r-th of them, and the first, the lowest old rank alive, hosts the
//      rendezvous on the socket it listened on. Fewer than min_size is a CommError naming who
//      answered and who did not.
//   3. The rendezvous (rendezvous.hpp) of the next membership epoch (Options::epoch + 1), under
//      the same secret and authentication: a rank of the old epoch is held off (it knocks again,
//      and may join through rank 0's door once the mesh is up: door.hpp), a rank of a later one
//      refused, and no frame of the old mesh crosses into the new one. It has 3 x probe_timeout:
//      every member answered the roll call just before. Where it fails (a member lost since it
//      answered), it fails on every rank, and the roll is called again, from 1.
//
// The old Tcp shares its listening socket with the new one (Tcp::listener) and hands it over once
// the new mesh stands; it may be destroyed once this returns, and its connections are not used
// again.
#pragma once

#include <chrono>
#include <vector>

#include "cohort/core/compilation.hpp"
#include "cohort/transport/tcp/roll_call.hpp"
#include "cohort/transport/tcp/tcp.hpp"

namespace cohort::transport::tcp {

struct RegroupOptions {
  int min_size = 1;  // fewer ranks alive: CommError, and no new mesh
  // How long the roll call waits for a rank's process to answer: a process stopped or hung, or a
  // host cut off, is counted out after this, and every rank that regroups must come to the roll
  // call within it of the others. Given by the caller (strategy::Elastic holds the job's); not
  // positive: ConfigError.
  std::chrono::milliseconds probe_timeout{0};
};

struct Regrouped {
  Tcp transport;
  std::vector<int> members;  // by new rank: the old rank
};

[[gnu::cold]] COHORT_DECL Regrouped regroup(Tcp& failed, RegroupOptions options);

// Every member of `mesh`, when its rank 0's door (door.hpp) took `joiners` processes in: the mesh
// of the next epoch, one rank more for each, who come after the members in the order the door
// welcomed them. Rank 0 hosts its rendezvous where it listened, the job's rendezvous address,
// where the joiners came. Every rank has reached it within `timeout` (or connect_timeout, if
// shorter), or it fails on every rank with a CommError: a newcomer that left after its welcome
// costs the members that long. The members can then regroup from `mesh`, which still listens.
[[gnu::cold]] COHORT_DECL Tcp grow(Tcp& mesh, int joiners, std::chrono::milliseconds timeout);

// Every member of `mesh`, each with its `rank` in an order they all computed alike in which rank 0
// keeps its place (MultiWorkerMirrored's ranks in the order of their hosts, after a grow put a
// process last): the same processes as the mesh of the next epoch, in that order. The rendezvous
// and its bounds are grow's.
[[gnu::cold]] COHORT_DECL Tcp renumber(Tcp& mesh, int rank, std::chrono::milliseconds timeout);

}  // namespace cohort::transport::tcp

#if !defined(COHORT_SEPARATE_COMPILATION)
#include "cohort/transport/tcp/impl/regroup.ipp"
#endif
