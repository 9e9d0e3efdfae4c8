// JobDoor: where a process started for a running elastic job asks to join it (transport/tcp/
// door.hpp), kept by the job's chief, the rank 0 of each membership. The rank 0 that started the
// job opens it on the listener it met the others on, at the job's rendezvous address. A later
// chief (the first was lost) binds that address once, where it is of its host; else the job's
// rendezvous port on its own host, where a process that joins looks next among the job's hosts
// (cluster::Spec::hosts); else it opens the door on its own listener (every rank of an elastic job
// keeps listening). It says where, either way. MultiWorkerMirrored and ParameterServer<Sync> keep
// one each:
//
//   door.started(rank == 0);          // whether this process is the rank 0 that started the job
//   door.open(mesh, spec, binding);   // each membership, once it is up: on its rank 0
//   door.regrouped(first == 0);       // after a regroup: the new rank 0's rank before it
//   door.joiners(workers, elastic, started_workers);   // at a vote: whom the job takes in
//   door.welcome(joiners);            // then every process grows the mesh, and opens again
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>

#include "cohort/cluster/binding.hpp"
#include "cohort/cluster/cluster.hpp"
#include "cohort/core/error.hpp"
#include "cohort/strategy/elastic.hpp"
#include "cohort/transport/tcp/door.hpp"
#include "cohort/transport/tcp/listener.hpp"
#include "cohort/transport/tcp/tcp.hpp"

namespace cohort::strategy::detail {

class JobDoor {
 public:
  // At the start: whether this process is the rank 0 that started the job, listening at its
  // address.
  void started(bool first_chief) { first_chief_ = first_chief; }

  // After a regroup: whether the rank 0 that started the job is the new membership's rank 0.
  void regrouped(bool first_chief_stays) { first_chief_ = first_chief_ && first_chief_stays; }

  // The door of `mesh`'s membership, where this process is its rank 0.
  [[gnu::cold]] void open(const transport::tcp::Tcp& mesh, const cluster::Spec& spec,
                          const cluster::Binding& binding) {
    door_.reset();
    if (mesh.rank() != 0) return;
    if (first_chief_) {
      door_ = std::make_unique<transport::tcp::Door>(mesh);
      return;
    }
    if (!tried_rendezvous_address_) hold_rendezvous_address(mesh, spec, binding);
    if (held_rendezvous_address_) {
      door_ = std::make_unique<transport::tcp::Door>(mesh, *held_rendezvous_address_);
    } else if (on_own_listener_) {
      door_ = std::make_unique<transport::tcp::Door>(mesh);
    }
  }

  // Before the membership changes: a process knocking meanwhile waits in the held socket's queue.
  void close() { door_.reset(); }

  // The processes that proved themselves and wait for a place; 0 where no door is open here.
  std::size_t waiting() { return door_ ? door_->waiting() : 0; }

  // Of those, the ones a job of `workers` takes in now: up to elastic.max_workers, or the
  // `started` workers it started with. The door is polled also while the job is full.
  std::size_t joiners(std::size_t workers, const Elastic& elastic, std::size_t started) {
    const std::size_t waiting_now = waiting();
    const std::size_t most = elastic.max_workers != 0 ? elastic.max_workers : started;
    return workers >= most ? 0 : std::min(waiting_now, most - workers);
  }

  // Tells the first `joiners` waiting their places, and closes (every process then grows).
  [[gnu::cold]] void welcome(std::size_t joiners) {
    if (door_) door_->welcome(joiners);
    door_.reset();
  }

 private:
  // Binds the job's rendezvous address, once, and says whether it could; where that address is
  // another host's, the job's rendezvous port on this host (hold_own_host_port).
  [[gnu::cold]] void hold_rendezvous_address(const transport::tcp::Tcp& mesh,
                                             const cluster::Spec& spec,
                                             const cluster::Binding& binding) {
    tried_rendezvous_address_ = true;
    const std::string address = spec.master_address + ":" + std::to_string(spec.master_port);
    const std::optional<std::string> here =
        cluster::rendezvous_address_here(spec, binding, cluster::system_probe());
    if (!here) {
      hold_own_host_port(mesh, spec, binding, address);
      return;
    }
    try {
      held_rendezvous_address_.emplace(mesh.options(),
                                       transport::tcp::Address{*here, spec.master_port});
      std::fprintf(stderr,
                   "cohort: rank 0: keeps the job's door at %s, where its first rank 0 was\n",
                   address.c_str());
    } catch (const CommError& failure) {
      std::fprintf(stderr, "cohort: rank 0: the job takes no process in from now on: %s\n",
                   failure.what());
    }
  }

  // The door of a chief on another host than the job's rendezvous `address`: at the job's
  // rendezvous port on this host where it is free, else on this process's own listener.
  [[gnu::cold]] void hold_own_host_port(const transport::tcp::Tcp& mesh, const cluster::Spec& spec,
                                        const cluster::Binding& binding,
                                        const std::string& address) {
    const transport::tcp::Address& own = mesh.addresses()[static_cast<std::size_t>(mesh.rank())];
    const std::string door = "cohort: rank 0: the job's rendezvous address " + address +
                             ", where its first rank 0 was, is another host's: its door is at " +
                             own.host + ":";
    try {
      held_rendezvous_address_.emplace(mesh.options(),
                                       transport::tcp::Address{binding.address, spec.master_port});
      std::fprintf(stderr,
                   "%s%u from now on, the job's rendezvous port on this host, where a process "
                   "that joins (COHORT_JOIN=1) finds it among the job's hosts\n",
                   door.c_str(), static_cast<unsigned>(spec.master_port));
    } catch (const CommError& failure) {
      on_own_listener_ = true;
      std::fprintf(stderr,
                   "%s%u from now on, on this rank's own listener (%s), where a process that joins "
                   "finds it only when told (COHORT_MASTER_ADDR, COHORT_MASTER_PORT, "
                   "COHORT_JOIN=1)\n",
                   door.c_str(), static_cast<unsigned>(own.port), failure.what());
    }
  }

  bool first_chief_ = false;
  // A later chief's socket at the job's rendezvous address, kept while the membership changes so
  // that a process knocking there waits in its queue meanwhile.
  std::optional<transport::tcp::Listener> held_rendezvous_address_;
  bool tried_rendezvous_address_ = false;
  bool on_own_listener_ = false;  // where that address is another host's
  std::unique_ptr<transport::tcp::Door> door_;
};

}  // namespace cohort::strategy::detail
