// tcp::Door: where a process started for a running elastic job asks to join it. The job's rank 0
// keeps a door open at the job's rendezvous address while the mesh runs: the rank 0 that started
// the job on the socket it listens on (Options::keep_listening), a later one (the first was lost)
// on a socket it binds there itself, where that address is its host's, else at the same port of
// its own host, where a process started again looks next (Options::door_hosts), else on its own
// listener (its address then printed for the processes started again):
//
//   tcp::Door door(mesh);                 // rank 0 that started the job, once the mesh is up
//   tcp::Listener held(mesh.options(), {"127.0.0.1", 29500});   // or, a later rank 0: bound once,
//   tcp::Door door(mesh, held);           // kept while the membership changes, a door each epoch
//   if (door.waiting() > 0) { ... }       // at a step boundary, polled: who waits for a place
//   door.welcome(count);                  // every rank then grows: tcp::grow(mesh, count)
//
// A process that comes to the rendezvous address with the job's id (a worker started again, a new
// host, Options::joins_running_job) meets the door instead of a rendezvous: the same handshake
// under the same secret, so that a stranger is refused as at a rendezvous, and a hello that says
// it is a door. The door holds the connection until the job admits it at a step boundary, then
// tells it its place (Welcome: rank, size and membership epoch of the grown mesh, and where its
// rendezvous is: rank 0's mesh listener), and the process joins the rendezvous of that epoch with
// every member (rendezvous.hpp; its Tcp's construction returns then). A process that waits while
// the door closes (the job changes its membership) knocks again until its deadline
// (connect_timeout). A door takes no step of the job: it moves only when polled, so the job pays
// a poll of its sockets per vote (trainer/vote.hpp), with at most a bounded amount of work each.
#pragma once

#include <cstddef>
#include <memory>

#include "cohort/core/compilation.hpp"
#include "cohort/transport/tcp/listener.hpp"
#include "cohort/transport/tcp/options.hpp"
#include "cohort/transport/tcp/tcp.hpp"

namespace cohort::transport::tcp {

namespace detail {
class Rendezvous;  // rendezvous.hpp
}  // namespace detail

class Door {
 public:
  // On `mesh`'s listener (rank 0's, under Options::keep_listening), in the mesh's epoch.
  [[gnu::cold]] COHORT_DECL explicit Door(const Tcp& mesh);
  // On `held`, a socket `mesh`'s rank 0 bound at the job's rendezvous address, in the mesh's
  // epoch; `held` goes on listening when the door closes.
  [[gnu::cold]] COHORT_DECL Door(const Tcp& mesh, const Listener& held);
  Door(const Door&) = delete;
  Door& operator=(const Door&) = delete;
  // Closes every connection it holds: a process still waiting knocks again.
  COHORT_DECL ~Door();

  // The processes that proved themselves and wait for a place, after what has come meanwhile.
  COHORT_DECL std::size_t waiting();

  // Tells the first `count` waiting processes their places: ranks size(), size() + 1, ... of a
  // mesh of size() + count in the next epoch, which every member then forms (tcp::grow) at rank
  // 0's mesh listener. Returns how many were told: fewer where some left since waiting() counted
  // them.
  [[gnu::cold]] COHORT_DECL std::size_t welcome(std::size_t count);

 private:
  Door(Listener listener, const Tcp& mesh);

  Options options_;
  Address grown_at_;  // where the grown mesh meets: rank 0's mesh listener
  Listener listener_;
  std::unique_ptr<detail::Rendezvous> rendezvous_;
};

}  // namespace cohort::transport::tcp

#if !defined(COHORT_SEPARATE_COMPILATION)
#include "cohort/transport/tcp/impl/door.ipp"
#endif
