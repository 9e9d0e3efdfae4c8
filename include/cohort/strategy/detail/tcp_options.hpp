// The TCP transport's options for a strategy's process, and what the process learns once the
// transport is up:
//   who it is     the cluster description (cluster/cluster.hpp)
//   where it      the strategy's Options::bind_address, else COHORT_BIND_ADDRESS, else the cluster
//   listens       description (cluster/binding.hpp: the own address, loopback for a loopback
//                 cluster, the wildcard where the own address is not this host's)
//   the secret    the strategy's Options::secret, else COHORT_SECRET
//   encryption    COHORT_ENCRYPT (0 or 1; 1 requires the secret)
//   its ports     the strategy's Options::listen_ports, else COHORT_PORT_RANGE (LOW-HIGH), else
//                 any free port (rank 0 listens at the master port whatever they say)
//   deadlines     the strategy's Options::connect_timeout and timeout; where the program leaves
//                 them at their defaults, COHORT_CONNECT_TIMEOUT and COHORT_TIMEOUT
//                 (with_environment, applied by every strategy's constructor)
//   listening     kept after the rendezvous where the strategy's Options::elastic is enabled, for
//                 a regroup (transport/tcp/regroup.hpp)
//   local ranks   where the launcher gives none, the ranks that share an own address
//                 (learn_local_ranks, after the rendezvous)
#pragma once

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "cohort/cluster/binding.hpp"
#include "cohort/cluster/cluster.hpp"
#include "cohort/cluster/environment.hpp"
#include "cohort/core/error.hpp"
#include "cohort/strategy/detail/environment_options.hpp"
#include "cohort/transport/tcp/options.hpp"

namespace cohort::strategy::detail {

// The variable's value, or fallback when it is unset or empty.
inline std::string environment_or(const char* variable, const std::string& fallback) {
  const char* value = std::getenv(variable);
  return value != nullptr && *value != '\0' ? value : fallback;
}

inline std::string given_or_environment(const std::string& given, const char* variable,
                                        const char* fallback) {
  return given.empty() ? environment_or(variable, fallback) : given;
}

// What a strategy's process hands its transport, and where it listens and why.
struct TcpSetup {
  transport::tcp::Options options;
  cluster::Binding binding;
};

// StrategyOptions has bind_address, secret, listen_ports, connect_timeout and timeout, and elastic
// where the strategy regroups.
template <class StrategyOptions>
[[gnu::cold]] TcpSetup tcp_setup(const cluster::Spec& spec, int rank, int size,
                                 const StrategyOptions& options) {
  cluster::Binding binding = cluster::choose_binding(spec, options.bind_address);
  const std::string ports = given_or_environment(
      options.listen_ports, std::string(cluster::variable::kPortRange).c_str(), "");
  const cluster::PortRange range =
      ports.empty()
          ? cluster::PortRange{}
          : cluster::parse_port_range(
                options.listen_ports.empty() ? cluster::variable::kPortRange : "listen_ports",
                ports);
  transport::tcp::Options tcp{
      .rank = rank,
      .size = size,
      .job_id = spec.job_id.empty() ? "cohort" : spec.job_id,
      .rendezvous_host = spec.master_address,
      .rendezvous_port = spec.master_port,
      .bind_address = binding.address,
      .listen_port_first = range.first,
      .listen_port_last = range.last,
      .secret = given_or_environment(options.secret, "COHORT_SECRET", ""),
      .connect_timeout = options.connect_timeout,
      .operation_timeout = options.timeout,
  };
  if constexpr (requires { options.elastic.enabled(); }) {
    tcp.keep_listening = options.elastic.enabled();
    tcp.joins_running_job = options.elastic.joins_running_job;
    if (tcp.keep_listening) tcp.door_hosts = spec.hosts;
  }
  const std::string encrypt = environment_or(std::string(cluster::variable::kEncrypt).c_str(), "");
  if (!encrypt.empty()) {
    tcp.encrypt = cluster::parse_switch(cluster::variable::kEncrypt, encrypt);
    if (tcp.encrypt && tcp.secret.empty()) {
      cluster::detail::reject_text(cluster::variable::kEncrypt, encrypt,
                                   "requires a secret: set COHORT_SECRET (or the strategy's "
                                   "Options::secret) to the same value on every rank");
    }
  }
  return {std::move(tcp), std::move(binding)};
}

template <class StrategyOptions>
transport::tcp::Options tcp_options(const cluster::Spec& spec, int rank, int size,
                                    const StrategyOptions& options) {
  return tcp_setup(spec, rank, size, options).options;
}

// A deadline as the start-up line gives it: whole seconds where it is some, else milliseconds.
inline std::string deadline_text(std::chrono::milliseconds deadline) {
  return deadline.count() % 1000 == 0 ? std::to_string(deadline.count() / 1000) + " s"
                                      : std::to_string(deadline.count()) + " ms";
}

// The start-up line, "cohort: <what>, listening on <address> (<why>); <deadlines>", on stderr;
// and one warning line where this process listens beyond loopback without a secret. The
// deadlines name both settings, since a user who sets "the timeout" (COHORT_TIMEOUT, of every
// transfer) may not know that the rendezvous has its own (COHORT_CONNECT_TIMEOUT), longer because
// a launcher may start the processes far apart.
[[gnu::cold]] inline void announce(const std::string& what, const TcpSetup& setup) {
  std::fprintf(stderr,
               "cohort: %s, %s; %s within %s (connect_timeout or %s), then "
               "each transfer within %s (timeout or %s)\n",
               what.c_str(), cluster::describe(setup.binding).c_str(),
               setup.options.joins_running_job
                   ? "joins the running job through its door (COHORT_JOIN)"
                   : "meets the others",
               deadline_text(setup.options.connect_timeout).c_str(),
               std::string(cluster::variable::kConnectTimeout).c_str(),
               deadline_text(setup.options.operation_timeout).c_str(),
               std::string(cluster::variable::kTimeout).c_str());
  if (setup.options.size > 1 && !setup.binding.loopback() && setup.options.secret.empty()) {
    std::fprintf(stderr,
                 "cohort: warning: listening on %s without a secret: any host that reaches it "
                 "can join or disturb the job; set COHORT_SECRET to the same value on every rank "
                 "(docs/launching.md, \"Secret\")\n",
                 setup.binding.address.c_str());
  }
}

// Local ranks from the rendezvous. Every process of the mesh calls this once, right after the
// rendezvous and before anything else runs over `all` (a collective over the whole mesh, with
// all_gather of std::int64_t). `mesh_rank` is this process's rank in it, `group` its role's
// number (ranks count their local ranks among the ranks of their group: workers, servers).
// Ranks that share an own address (binding.own; the host name where it is unknown) share a host.
// Where spec.local_given is false, the returned Spec takes this rank's place among them (and a
// line on stderr says so); where it
// is true, the launcher's values stand, and a launcher that disagrees with what the rendezvous
// saw, for any rank, is a ConfigError on every rank. Loopback clusters are not checked: there
// several ranks may stand for several hosts on purpose (tests).
template <class All>
[[gnu::cold]] cluster::Spec learn_local_ranks(All& all, cluster::Spec spec,
                                              const cluster::Binding& binding, int mesh_rank,
                                              int group) {
  constexpr std::size_t kKeyWords = 8;  // 64 bytes: an IPv6 address in text fits
  constexpr std::size_t kWords = kKeyWords + 2;
  const int size = all.size();
  if (size == 1) return spec;
  std::string key = binding.own;
  if (key.empty()) {
    char name[256] = {};
    ::gethostname(name, sizeof name - 1);
    key = std::string("host ") + name;
  }
  key.resize(kKeyWords * sizeof(std::int64_t), '\0');
  std::vector<std::int64_t> mine(kWords, 0);
  std::memcpy(mine.data(), key.data(), key.size());
  mine[kKeyWords] = group;
  mine[kKeyWords + 1] =
      spec.local_given ? (std::int64_t{spec.local_rank} << 32) | spec.local_size : -1;
  std::vector<std::int64_t> everyone(kWords * static_cast<std::size_t>(size));
  all.template all_gather<std::int64_t>(std::span<const std::int64_t>(mine), everyone);

  const auto word = [&](int rank, std::size_t index) {
    return everyone[static_cast<std::size_t>(rank) * kWords + index];
  };
  const auto same_host = [&](int a, int b) {
    for (std::size_t i = 0; i <= kKeyWords; ++i) {
      if (word(a, i) != word(b, i)) return false;
    }
    return true;
  };
  const auto address_of = [&](int rank) {
    std::string text(kKeyWords * sizeof(std::int64_t), '\0');
    std::memcpy(text.data(), &everyone[static_cast<std::size_t>(rank) * kWords], text.size());
    return std::string(text.c_str());
  };
  struct Place {
    int rank = 0;
    int size = 0;
  };
  const auto learned = [&](int rank) {
    Place place;
    for (int other = 0; other < size; ++other) {
      if (!same_host(rank, other)) continue;
      if (other < rank) ++place.rank;
      ++place.size;
    }
    return place;
  };
  if (!spec.local_given) {
    const Place place = learned(mesh_rank);
    spec.local_rank = place.rank;
    spec.local_size = place.size;
    spec.local_given = true;
    const std::string where = "ranks of its role at " + address_of(mesh_rank);
    std::fprintf(stderr, "cohort: rank %d is local rank %d of %d, from the rendezvous (%s)\n",
                 spec.rank, spec.local_rank, spec.local_size, where.c_str());
    return spec;
  }
  if (cluster::detail::is_loopback_address(binding.own)) return spec;
  for (int rank = 0; rank < size; ++rank) {
    const std::int64_t given = word(rank, kKeyWords + 1);
    const Place place = learned(rank);
    if (given < 0 || (given >> 32 == place.rank && (given & 0xffffffff) == place.size)) continue;
    throw ConfigError("local ranks: mesh rank " + std::to_string(rank) + " was given local rank " +
                      std::to_string(given >> 32) + " of " + std::to_string(given & 0xffffffff) +
                      " (" + spec.source + "), but at the rendezvous " +
                      std::to_string(place.size) + " rank(s) of its role share its address " +
                      address_of(rank) + ", where it is local rank " + std::to_string(place.rank) +
                      ". Correct or unset the launcher's local variables (docs/launching.md, "
                      "\"Local ranks\")");
  }
  return spec;
}

}  // namespace cohort::strategy::detail
