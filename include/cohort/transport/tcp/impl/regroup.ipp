// The definitions of regroup.hpp (core/compilation.hpp).
#pragma once

#include "cohort/transport/tcp/regroup.hpp"

#include <algorithm>
#include <cstdio>
#include <string>
#include <utility>

#include "cohort/core/error.hpp"
#include "cohort/core/options.hpp"
#include "cohort/transport/tcp/impl/roll_call.ipp"
#include "cohort/transport/tcp/impl/tcp.ipp"
#include "cohort/transport/tcp/rendezvous.hpp"

namespace cohort::transport::tcp {

namespace detail {

// The mesh of `old`'s next membership epoch, `next` giving this rank's place and the size, met at
// `host` on the listening socket `old` shares: `old` hands the socket over once the new mesh
// stands, and keeps listening where its rendezvous fails.
[[gnu::cold]] COHORT_DECL Tcp next_epoch(Tcp& old, Options next, const Address& host) {
  next.epoch = old.options().epoch + 1;
  next.rendezvous_host = host.host;
  next.rendezvous_port = host.port;
  next.door_hosts.clear();  // the job's hosts are where its door is, not where its members meet
  Tcp mesh(old.listener(std::move(next)));
  old.hand_listener_over();
  return mesh;
}

// grow's and renumber's: the next epoch meets at rank 0's listener, the job's rendezvous address,
// within `timeout` (or connect_timeout, if shorter).
[[gnu::cold]] COHORT_DECL Tcp next_epoch_at_rank_0(Tcp& old, Options next,
                                                   std::chrono::milliseconds timeout) {
  next.connect_timeout = std::min(next.connect_timeout, timeout);
  const Address rank_0 = old.addresses().front();
  return next_epoch(old, std::move(next), rank_0);
}

}  // namespace detail

COHORT_DECL Regrouped regroup(Tcp& failed, RegroupOptions options) {
  const Options& old = failed.options();
  const std::vector<Address>& table = failed.addresses();
  const auto refuse = [&](const std::string& why) {
    throw CommError({.rank = old.rank, .operation = "regroup", .detail = why});
  };
  if (options.probe_timeout.count() <= 0) {
    options::reject("probe_timeout", std::to_string(options.probe_timeout.count()) + " ms",
                    "must be positive");
  }
  if (table.size() != static_cast<std::size_t>(old.size) || old.size < 2) {
    refuse("the mesh never formed, so there is nobody to regroup with");
  }
  // A rank that answered the roll call may still be lost before the next epoch's mesh stands (it
  // ended, or its host went, a moment later): that rendezvous then fails on every rank, within
  // its deadline, and the roll is called again from `failed`, which still listens. Each call
  // after the first follows a failure; as many as the ranks bound them.
  for (int call = 1;; ++call) {
    const std::vector<bool> answered = RollCall(failed).call(options.probe_timeout);
    std::vector<int> members;
    std::vector<int> gone;
    for (int rank = 0; rank < old.size; ++rank) {
      (answered[static_cast<std::size_t>(rank)] ? members : gone).push_back(rank);
    }
    if (static_cast<int>(members.size()) < options.min_size) {
      refuse(std::to_string(members.size()) + " of " + std::to_string(old.size) +
             " ranks answer (" + detail::rank_list(members) + "; " + detail::rank_list(gone) +
             " ended, left or did not answer within " +
             std::to_string(options.probe_timeout.count()) + " ms), fewer than the " +
             std::to_string(options.min_size) + " the job needs");
    }
    Options next = old;
    next.rank = static_cast<int>(std::ranges::find(members, old.rank) - members.begin());
    next.size = static_cast<int>(members.size());
    // Every member answered the roll call: each comes within the roll call's own bound.
    next.connect_timeout = std::min(next.connect_timeout, 3 * options.probe_timeout);
    try {
      Tcp transport = detail::next_epoch(failed, std::move(next),
                                         table[static_cast<std::size_t>(members.front())]);
      return {std::move(transport), std::move(members)};
    } catch (const CommError& lost) {
      if (call == old.size) throw;
      std::fprintf(stderr, "cohort: rank %d: regrouping again after: %s\n", old.rank,
                   lost.what());
    }
  }
}

COHORT_DECL Tcp grow(Tcp& mesh, int joiners, std::chrono::milliseconds timeout) {
  Options next = mesh.options();
  next.size += joiners;
  return detail::next_epoch_at_rank_0(mesh, std::move(next), timeout);
}

COHORT_DECL Tcp renumber(Tcp& mesh, int rank, std::chrono::milliseconds timeout) {
  Options next = mesh.options();
  COHORT_ASSERT(rank >= 0 && rank < next.size && (rank == 0) == (next.rank == 0));
  next.rank = rank;
  return detail::next_epoch_at_rank_0(mesh, std::move(next), timeout);
}

}  // namespace cohort::transport::tcp
