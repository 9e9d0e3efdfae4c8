// Definitions for cohort/cluster/binding.hpp (core/compilation.hpp says where they compile).
#pragma once

#include "cohort/cluster/binding.hpp"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "cohort/cluster/cluster.hpp"
#include "cohort/cluster/environment.hpp"

namespace cohort::cluster {

namespace detail {

COHORT_DECL std::optional<std::string> numeric_text(const sockaddr* address) {
  char text[INET6_ADDRSTRLEN] = {};
  const void* raw = nullptr;
  if (address->sa_family == AF_INET) {
    raw = &reinterpret_cast<const sockaddr_in*>(address)->sin_addr;
  } else if (address->sa_family == AF_INET6) {
    raw = &reinterpret_cast<const sockaddr_in6*>(address)->sin6_addr;
  } else {
    return std::nullopt;
  }
  if (::inet_ntop(address->sa_family, raw, text, sizeof text) == nullptr) return std::nullopt;
  return std::string(text);
}

COHORT_DECL bool is_ipv6(std::string_view address) {
  return address.find(':') != std::string_view::npos;
}

COHORT_DECL bool is_loopback_address(std::string_view address) {
  in_addr v4{};
  in6_addr v6{};
  const std::string text(address);
  if (::inet_pton(AF_INET, text.c_str(), &v4) == 1) {
    return (ntohl(v4.s_addr) >> 24) == 127;
  }
  if (::inet_pton(AF_INET6, text.c_str(), &v6) == 1) {
    if (IN6_IS_ADDR_LOOPBACK(&v6)) return true;
    return IN6_IS_ADDR_V4MAPPED(&v6) && v6.s6_addr[12] == 127;
  }
  return false;
}

// A host as the cluster description writes it that means this machine whatever the resolver
// says: a loopback address or "localhost". Other names count as not loopback even where they
// resolve to it (/etc/hosts maps a host's own name to 127.0.1.1 on Debian): they name a host.
COHORT_DECL bool names_loopback(std::string_view host) {
  return host == "localhost" || host.ends_with(".localhost") || is_loopback_address(host);
}

// The own entry of a TF_CONFIG cluster ("host", "TF_CONFIG worker[1]"), if the spec lists one.
COHORT_DECL std::optional<std::pair<std::string, std::string>> listed_own_host(const Spec& spec) {
  const bool serves = spec.role == Role::kParameterServer;
  const auto& list = serves ? spec.parameter_servers : spec.workers;
  const auto index = static_cast<std::size_t>(spec.rank);
  if (spec.role == Role::kEvaluator || index >= list.size()) return std::nullopt;
  const std::string name = spec.source + " " + std::string(role_name(spec.role)) + "[" +
                           std::to_string(spec.task_index) + "]";
  return std::pair{parse_host_port(name, list[index]).host, name};
}

COHORT_DECL bool cluster_is_loopback(const Spec& spec) {
  if (!names_loopback(spec.master_address)) return false;
  for (const auto* list : {&spec.workers, &spec.parameter_servers}) {
    for (const std::string& entry : *list) {
      if (!names_loopback(parse_host_port("cluster list", entry).host)) return false;
    }
  }
  return true;
}

}  // namespace detail

COHORT_DECL bool Binding::loopback() const { return detail::is_loopback_address(address); }

[[gnu::cold]] COHORT_DECL Probe system_probe() {
  Probe probe;
  probe.resolve = [](const std::string& host) -> std::optional<std::string> {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* result = nullptr;
    if (::getaddrinfo(host.c_str(), nullptr, &hints, &result) != 0 || result == nullptr) {
      return std::nullopt;
    }
    // The first IPv4 answer where there is one: the listeners and the route agree on a family.
    const addrinfo* chosen = result;
    for (const addrinfo* entry = result; entry != nullptr; entry = entry->ai_next) {
      if (entry->ai_family == AF_INET) {
        chosen = entry;
        break;
      }
    }
    std::optional<std::string> text = detail::numeric_text(chosen->ai_addr);
    ::freeaddrinfo(result);
    return text;
  };
  probe.route = [](const std::string& address, std::uint16_t port) -> std::optional<std::string> {
    sockaddr_storage target{};
    socklen_t length = 0;
    auto* v4 = reinterpret_cast<sockaddr_in*>(&target);
    auto* v6 = reinterpret_cast<sockaddr_in6*>(&target);
    if (::inet_pton(AF_INET, address.c_str(), &v4->sin_addr) == 1) {
      v4->sin_family = AF_INET;
      v4->sin_port = htons(port);
      length = sizeof(sockaddr_in);
    } else if (::inet_pton(AF_INET6, address.c_str(), &v6->sin6_addr) == 1) {
      v6->sin6_family = AF_INET6;
      v6->sin6_port = htons(port);
      length = sizeof(sockaddr_in6);
    } else {
      return std::nullopt;
    }
    const int socket = ::socket(target.ss_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (socket < 0) return std::nullopt;
    // Connecting a UDP socket picks the route and the source address; nothing is sent.
    std::optional<std::string> own;
    sockaddr_storage local{};
    socklen_t local_length = sizeof local;
    if (::connect(socket, reinterpret_cast<const sockaddr*>(&target), length) == 0 &&
        ::getsockname(socket, reinterpret_cast<sockaddr*>(&local), &local_length) == 0) {
      own = detail::numeric_text(reinterpret_cast<const sockaddr*>(&local));
    }
    ::close(socket);
    return own;
  };
  probe.is_local = [](const std::string& address) {
    ifaddrs* interfaces = nullptr;
    if (::getifaddrs(&interfaces) != 0) return false;
    bool found = false;
    for (const ifaddrs* entry = interfaces; entry != nullptr && !found; entry = entry->ifa_next) {
      if (entry->ifa_addr == nullptr) continue;
      found = detail::numeric_text(entry->ifa_addr) == address;
    }
    ::freeifaddrs(interfaces);
    return found;
  };
  return probe;
}

[[gnu::cold]] COHORT_DECL Binding decide_binding(const Spec& spec, std::string_view given,
                                                 std::string_view given_name,
                                                 const Environment& environment,
                                                 const Probe& probe) {
  Binding binding;
  // The own address first: local ranks use it whatever decides the binding.
  std::optional<std::string> own;
  std::string own_origin;
  if (const auto listed = detail::listed_own_host(spec)) {
    own = probe.resolve(listed->first);
    own_origin = "own address in " + listed->second;
    if (!own) own_origin = listed->second + " '" + listed->first + "' does not resolve";
  } else {
    const std::optional<std::string> master = probe.resolve(spec.master_address);
    if (master) own = probe.route(*master, spec.master_port);
    own_origin = "own address on the route to the master " + spec.master_address;
    if (!master) {
      own_origin = "the master " + spec.master_address + " does not resolve";
    } else if (!own) {
      own_origin = "no route to the master " + spec.master_address;
    }
  }
  if (own) binding.own = *own;

  const std::optional<std::string> variable = environment(variable::kBindAddress);
  if (!given.empty()) {
    binding.address = std::string(given);
    binding.origin = std::string(given_name);
  } else if (variable && !variable->empty()) {
    binding.address = *variable;
    binding.origin = std::string(variable::kBindAddress);
  } else if (detail::cluster_is_loopback(spec)) {
    const std::optional<std::string> master = probe.resolve(spec.master_address);
    binding.address = master && detail::is_loopback_address(*master) ? *master : "127.0.0.1";
    binding.origin = "every address of the cluster is loopback";
  } else if (own && !detail::is_loopback_address(*own) && probe.is_local(*own)) {
    binding.address = *own;
    binding.origin = own_origin;
  } else {
    const bool v6 = own ? detail::is_ipv6(*own) : detail::is_ipv6(spec.master_address);
    binding.address = v6 ? "::" : "0.0.0.0";
    binding.wildcard = true;
    if (!own) {
      binding.origin = "every interface: " + own_origin;
    } else if (detail::is_loopback_address(*own)) {
      binding.origin = "every interface: " + own_origin + " is loopback " + *own +
                       " while the cluster spans hosts";
    } else {
      binding.origin = "every interface: " + own_origin + " is " + *own +
                       ", not an address of this host (a service address?)";
    }
  }
  return binding;
}

[[gnu::cold]] COHORT_DECL Binding choose_binding(const Spec& spec, std::string_view given,
                                                 std::string_view given_name,
                                                 const Environment& environment) {
  return decide_binding(spec, given, given_name, environment, system_probe());
}

[[gnu::cold]] COHORT_DECL std::optional<std::string> rendezvous_address_here(
    const Spec& spec, const Binding& binding, const Probe& probe) {
  const std::optional<std::string> master = probe.resolve(spec.master_address);
  if (!master || !(detail::is_loopback_address(*master) || probe.is_local(*master))) {
    return std::nullopt;
  }
  const bool every_interface =
      binding.wildcard || binding.address == "0.0.0.0" || binding.address == "::";
  return every_interface ? binding.address : *master;
}

[[gnu::cold]] COHORT_DECL std::string describe(const Binding& binding) {
  return "listening on " + binding.address + " (" + binding.origin + ")";
}

}  // namespace cohort::cluster
