// Where this process listens: the address its TCP listeners bind, chosen from the cluster
// description, and why (the start-up line prints both).
//
//   const cohort::cluster::Binding binding = cohort::cluster::choose_binding(spec, "");
//   // binding.address "10.77.0.2", binding.origin "own address in TF_CONFIG worker[1]"
//
// The first rule that applies decides:
//   1. given          the program's own choice (a strategy's Options::bind_address)
//   2. COHORT_BIND_ADDRESS
//   3. loopback       every address the cluster names is loopback (127.0.0.0/8, ::1, localhost):
//                     bind the master's loopback address (127.0.0.1 by default)
//   4. own address    this rank's address in the cluster: its own entry in TF_CONFIG's lists,
//                     else the local address of the route to the master (COHORT_MASTER_ADDR,
//                     MASTER_ADDR, the first Slurm node; a connected UDP socket gives it and sends
//                     nothing). Bound where it is an address of one of this host's interfaces.
//   5. wildcard       0.0.0.0 (:: for IPv6) where the own address is unknown, resolves to
//                     loopback while the cluster spans hosts (a host name that /etc/hosts maps to
//                     127.0.1.1), or is no address of this host (a Kubernetes service address);
//                     peers then reach this rank where rank 0 saw it connect from.
// Never a wildcard where an own address is known to be this host's. Binding.own is the own
// address found in 4 (empty if none): ranks that share it share a host (local ranks).
//
// choose_binding asks the system: the resolver, the routing table, the interfaces. decide_binding
// takes those answers as functions (Probe), for tests.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include "cohort/cluster/cluster.hpp"
#include "cohort/cluster/environment.hpp"
#include "cohort/core/compilation.hpp"

namespace cohort::cluster {

struct Binding {
  std::string address;  // numeric: what the listeners bind
  std::string origin;   // why, for the start-up line
  std::string own;      // this rank's own numeric address, "" when unknown
  bool wildcard = false;

  COHORT_DECL bool loopback() const;
};

// What decide_binding asks the system; each answer is a numeric address, or nullopt.
struct Probe {
  // The first address the resolver gives for a host name or address.
  std::function<std::optional<std::string>(const std::string& host)> resolve;
  // The local address of the route to a numeric address.
  std::function<std::optional<std::string>(const std::string& address, std::uint16_t port)> route;
  // Whether a numeric address belongs to one of this host's interfaces.
  std::function<bool(const std::string& address)> is_local;
};

namespace detail {

// A numeric loopback address: 127.0.0.0/8, ::1, or an IPv4-mapped 127.x.
COHORT_DECL bool is_loopback_address(std::string_view address);

}  // namespace detail

// The system's answers: getaddrinfo, a connected UDP socket's local address, getifaddrs.
[[gnu::cold]] COHORT_DECL Probe system_probe();

// The rules at the top of this file. `given` is the program's choice ("" for none) and
// `given_name` what to call it in the origin.
[[gnu::cold]] COHORT_DECL Binding decide_binding(const Spec& spec, std::string_view given,
                                                 std::string_view given_name,
                                                 const Environment& environment,
                                                 const Probe& probe);

[[gnu::cold]] COHORT_DECL Binding choose_binding(
    const Spec& spec, std::string_view given, std::string_view given_name = "Options::bind_address",
    const Environment& environment = process_environment());

// Where this process, bound as `binding` says, can listen at the job's rendezvous address
// (spec.master_address) once the rank 0 that bound it first is lost, so that an elastic job keeps
// its door there (strategy/elastic.hpp): every interface where this process binds them all, else
// the master's address itself. nullopt where that address is another host's, or does not resolve.
[[gnu::cold]] COHORT_DECL std::optional<std::string> rendezvous_address_here(const Spec& spec,
                                                                             const Binding& binding,
                                                                             const Probe& probe);

// "listening on 10.77.0.2 (own address in TF_CONFIG worker[1])", for the start-up line.
[[gnu::cold]] COHORT_DECL std::string describe(const Binding& binding);

}  // namespace cohort::cluster

#if !defined(COHORT_SEPARATE_COMPILATION)
#include "cohort/cluster/impl/binding.ipp"
#endif
