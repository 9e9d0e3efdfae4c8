// The definitions of regroup.hpp (core/compilation.hpp).
#pragma once

#include "cohort/transport/tcp/regroup.hpp"

#include <algorithm>
#include <array>
#include <chrono>
#include <boost/asio/connect.hpp>
#include <cstddef>
#include <memory>
#include <string>
#include <utility>

#include "cohort/core/error.hpp"
#include "cohort/core/options.hpp"
#include "cohort/transport/tcp/asio.hpp"
#include "cohort/transport/tcp/impl/tcp.ipp"
#include "cohort/transport/tcp/rendezvous.hpp"

namespace cohort::transport::tcp {

namespace detail {

// A process that ends stops listening only when the kernel gets round to closing its sockets,
// after its connections have already failed: a probe right after that failure may still be
// accepted, and is reset a moment later. On a 2-core host, between a SIGKILL's reset connection
// and the reset of a probe accepted meanwhile, at most 4 ms passed idle and 10 ms beside two busy
// loops (200 kills each); a probe that survives kSettle after the last one connected answers.
inline constexpr std::chrono::milliseconds kSettle{200};

// The roll call: for each rank of `table`, whether its listener accepts a connection within
// `timeout` that is not reset within kSettle (this rank's own, `self`, counts as answering). The
// connections close then; the ranks' next rendezvous drops them unlogged.
[[gnu::cold]] COHORT_DECL std::vector<bool> answering(const std::vector<Address>& table, int self,
                                                      std::chrono::milliseconds timeout) {
  asio::io_context io(1);
  const std::size_t size = table.size();
  std::vector<char> connected(size, 0);
  std::vector<char> reset(size, 0);
  std::size_t unanswered = 0;
  asio::ip::basic_resolver<asio::ip::tcp, Executor> resolver(io.get_executor());
  std::vector<std::unique_ptr<Socket>> probes;
  std::array<std::byte, 1> unused{};
  for (std::size_t rank = 0; rank < size; ++rank) {
    if (rank == static_cast<std::size_t>(self)) continue;
    const Address& address = table[rank];
    ErrorCode ec;
    std::vector<asio::ip::tcp::endpoint> endpoints;
    if (const auto numeric = asio::ip::make_address(address.host, ec); !ec) {
      endpoints.emplace_back(numeric, address.port);
    } else {  // rank 0's, where the job named its host
      for (const auto& entry : resolver.resolve(address.host, std::to_string(address.port), ec)) {
        endpoints.push_back(entry.endpoint());
      }
    }
    Socket& probe = *probes.emplace_back(std::make_unique<Socket>(io));
    ++unanswered;
    asio::async_connect(
        probe, endpoints, [&, rank](const ErrorCode& error, const auto& /*endpoint*/) {
          --unanswered;
          if (error) return;
          connected[rank] = 1;
          probe.async_read_some(asio::buffer(unused),
                                [&, rank](const ErrorCode&, std::size_t) { reset[rank] = 1; });
        });
  }
  const auto deadline = Clock::now() + timeout;
  while (unanswered > 0 && io.run_one_until(deadline) > 0) {
  }
  io.run_for(kSettle);
  std::vector<bool> answered(size, false);
  for (std::size_t rank = 0; rank < size; ++rank) answered[rank] = connected[rank] && !reset[rank];
  answered[static_cast<std::size_t>(self)] = true;
  return answered;
}

// The mesh of `old`'s next membership epoch, `next` giving this rank's place and the size, met at
// `host` on the listening socket `old` shares: `old` hands the socket over once the new mesh
// stands, and keeps listening where its rendezvous fails.
[[gnu::cold]] COHORT_DECL Tcp next_epoch(Tcp& old, Options next, const Address& host) {
  next.epoch = old.options().epoch + 1;
  next.rendezvous_host = host.host;
  next.rendezvous_port = host.port;
  Tcp mesh(old.listener(std::move(next)));
  old.hand_listener_over();
  return mesh;
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
  const std::vector<bool> answered = detail::answering(table, old.rank, options.probe_timeout);
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
  Tcp transport = detail::next_epoch(failed, std::move(next),
                                     table[static_cast<std::size_t>(members.front())]);
  return {std::move(transport), std::move(members)};
}

COHORT_DECL Tcp grow(Tcp& mesh, int joiners, std::chrono::milliseconds timeout) {
  Options next = mesh.options();
  next.size += joiners;
  next.connect_timeout = std::min(next.connect_timeout, timeout);
  return detail::next_epoch(mesh, std::move(next), mesh.addresses().front());
}

}  // namespace cohort::transport::tcp
