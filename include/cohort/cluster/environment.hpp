// The environment the cluster resolver reads, and the parsers of its values.
//
// Environment is a function from a variable's name to its value (nullopt when it is not set), so
// that tests pass a map and programs pass process_environment(). Every parser here throws a
// ConfigError that names the variable and the value it was given, in the form
//
//   RANK = "two": not an integer
//   MASTER_PORT = 70000: out of range: a port lies in [1, 65535]
//
// The variable names cohort's own launcher sets (cohort-run, or a user by hand) are constants of
// namespace variable, so that the launcher and the resolver cannot spell them differently.
#pragma once

#include <netdb.h>
#include <sys/socket.h>

#include <algorithm>
#include <array>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>

#include "cohort/core/error.hpp"

namespace cohort::cluster {

// The value of a variable, or nullopt when it is not set. The resolver treats a variable set to
// the empty string as not set, so `export RANK=` clears it.
using Environment = std::function<std::optional<std::string>(std::string_view name)>;

// The variables of this process, read with getenv at each call.
inline Environment process_environment() {
  return [](std::string_view name) -> std::optional<std::string> {
    const char* value = std::getenv(std::string(name).c_str());
    if (value == nullptr) return std::nullopt;
    return std::string(value);
  };
}

using Variables = std::map<std::string, std::string, std::less<>>;

// A fixed set of variables, for tests and for programs that take their description from a file.
inline Environment environment_from(Variables variables) {
  return [variables = std::move(variables)](std::string_view name) -> std::optional<std::string> {
    const auto found = variables.find(name);
    if (found == variables.end()) return std::nullopt;
    return found->second;
  };
}

// The variables cohort's own launch description uses (docs/launching.md).
namespace variable {
inline constexpr std::string_view kRank = "COHORT_RANK";
inline constexpr std::string_view kWorldSize = "COHORT_WORLD_SIZE";
inline constexpr std::string_view kLocalRank = "COHORT_LOCAL_RANK";
inline constexpr std::string_view kLocalWorldSize = "COHORT_LOCAL_WORLD_SIZE";
inline constexpr std::string_view kMasterAddr = "COHORT_MASTER_ADDR";
inline constexpr std::string_view kMasterPort = "COHORT_MASTER_PORT";
inline constexpr std::string_view kJobId = "COHORT_JOB_ID";
inline constexpr std::string_view kBindAddress = "COHORT_BIND_ADDRESS";
inline constexpr std::string_view kSecret = "COHORT_SECRET";
inline constexpr std::string_view kEncrypt = "COHORT_ENCRYPT";
inline constexpr std::string_view kTimeout = "COHORT_TIMEOUT";
inline constexpr std::string_view kConnectTimeout = "COHORT_CONNECT_TIMEOUT";
inline constexpr std::string_view kPortRange = "COHORT_PORT_RANGE";
// Roles of a parameter-server job (strategy/parameter_server.hpp). COHORT_ROLE is "worker" (the
// default), "chief" or "ps"; COHORT_RANK and COHORT_WORLD_SIZE then count the processes of that
// role only (chief and workers together), as TF_CONFIG's task index does. A worker learns the
// number of servers from COHORT_PS_COUNT, a server the number of workers from
// COHORT_WORKER_COUNT. cohort-run --ps N sets all three.
inline constexpr std::string_view kRole = "COHORT_ROLE";
inline constexpr std::string_view kPsCount = "COHORT_PS_COUNT";
inline constexpr std::string_view kWorkerCount = "COHORT_WORKER_COUNT";
// The variables above: what describes a rank's place in a job. The other COHORT_* variables
// are settings every rank shares (and COHORT_TRACE):
//   COHORT_BIND_ADDRESS     where this process listens (cluster/binding.hpp chooses without it)
//   COHORT_SECRET           the job's shared secret (transport/tcp/options.hpp)
//   COHORT_ENCRYPT          1: data frames travel encrypted (tcp::Options::encrypt; requires
//                           the secret); 0 or unset: they do not (parse_switch)
//   COHORT_TIMEOUT          a strategy's Options::timeout, where the program leaves its default
//   COHORT_CONNECT_TIMEOUT  a strategy's Options::connect_timeout, likewise
//   COHORT_PORT_RANGE       LOW-HIGH: the ports the ranks other than 0 and the servers listen in,
//                           for a firewall (parse_port_range); unset, any free port
// The two timeouts are durations (parse_duration): "30" or "30s", "500ms", "5min".
inline constexpr std::array kCohortDescription = {
    kRank,       kWorldSize, kLocalRank, kLocalWorldSize, kMasterAddr,
    kMasterPort, kJobId,     kRole,      kPsCount,        kWorkerCount};

// The variables by which other launchers (torchrun, Open MPI, the TensorFlow training operator)
// give a rank and a world size. A launcher that defines its children's world itself, as
// cohort-run does, removes them from the children's environment: they describe the launch around
// it, and the resolver would refuse the disagreement.
inline constexpr std::array<std::string_view, 9> kOtherLaunchers = {
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "OMPI_COMM_WORLD_RANK",
    "OMPI_COMM_WORLD_SIZE",
    "OMPI_COMM_WORLD_LOCAL_RANK",
    "OMPI_COMM_WORLD_LOCAL_SIZE",
    "TF_CONFIG",
};
}  // namespace variable

// The port rendezvous uses when no source gives one: torchrun's default.
inline constexpr std::uint16_t kDefaultMasterPort = 29500;

namespace detail {

// "name = "value": requirement", the value quoted (and shortened) since it is raw text.
[[noreturn]] inline void reject_text(std::string_view name, std::string_view value,
                                     std::string_view requirement) {
  constexpr std::size_t kShown = 200;
  std::string message(name);
  message += " = \"";
  message += value.substr(0, kShown);
  if (value.size() > kShown) message += "...";
  message += "\": ";
  message += requirement;
  throw ConfigError(message);
}

[[noreturn]] inline void reject_number(std::string_view name, long long value,
                                       std::string_view requirement) {
  throw ConfigError(std::string(name) + " = " + std::to_string(value) + ": " +
                    std::string(requirement));
}

inline bool is_host_character(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
         c == '.' || c == '_';
}

inline bool is_ipv6_character(char c) {
  return (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F') || (c >= '0' && c <= '9') || c == ':' ||
         c == '.' || c == '%' || is_host_character(c);  // '%' and a name: a scope (fe80::1%eth0)
}

}  // namespace detail

// An integer in decimal, nothing before or after it.
inline int parse_integer(std::string_view name, std::string_view value) {
  long long parsed = 0;
  const auto [end, error] = std::from_chars(value.data(), value.data() + value.size(), parsed);
  if (value.empty() || error == std::errc::invalid_argument || end != value.data() + value.size()) {
    detail::reject_text(name, value, "not an integer");
  }
  if (error == std::errc::result_out_of_range || parsed < std::numeric_limits<int>::min() ||
      parsed > std::numeric_limits<int>::max()) {
    detail::reject_text(name, value, "out of range for an int");
  }
  return static_cast<int>(parsed);
}

// A TCP port for a listener others connect to: 1 to 65535.
inline std::uint16_t require_port(std::string_view name, long long port) {
  if (port < 1 || port > 65535)
    detail::reject_number(name, port, "out of range: a port lies in [1, 65535]");
  return static_cast<std::uint16_t>(port);
}

inline std::uint16_t parse_port(std::string_view name, std::string_view value) {
  return require_port(name, parse_integer(name, value));
}

// A switch: "0" (off) or "1" (on).
inline bool parse_switch(std::string_view name, std::string_view value) {
  if (value != "0" && value != "1") detail::reject_text(name, value, "expected 0 or 1");
  return value == "1";
}

// A duration: a decimal number of seconds ("30", "2.5"), or a number with a unit: "ms", "s",
// "min" ("500ms", "30s", "5min"). Positive and at most a week; rounded to milliseconds, and at
// least 1 ms.
inline std::chrono::milliseconds parse_duration(std::string_view name, std::string_view value) {
  constexpr std::string_view kForm = "expected a duration: seconds (30, 2.5) or 500ms, 30s, 5min";
  std::string_view number = value;
  double scale = 1000.0;  // milliseconds per unit
  for (const auto& [suffix, unit] :
       {std::pair<std::string_view, double>{"ms", 1.0}, {"min", 60'000.0}, {"s", 1000.0}}) {
    if (number.ends_with(suffix)) {
      number.remove_suffix(suffix.size());
      scale = unit;
      break;
    }
  }
  while (!number.empty() && number.back() == ' ') number.remove_suffix(1);
  double parsed = 0.0;
  const auto [end, error] = std::from_chars(number.data(), number.data() + number.size(), parsed);
  if (number.empty() || error != std::errc{} || end != number.data() + number.size() ||
      !(parsed == parsed)) {
    detail::reject_text(name, value, kForm);
  }
  const double milliseconds = parsed * scale;
  if (!(milliseconds > 0.0)) detail::reject_text(name, value, "must be greater than 0");
  if (milliseconds > 7 * 24 * 3600e3) detail::reject_text(name, value, "must be at most a week");
  return std::chrono::milliseconds(std::max<long long>(1, std::llround(milliseconds)));
}

// The ports LOW-HIGH of COHORT_PORT_RANGE (or a strategy's Options::listen_ports), "29510-29599";
// a ConfigError naming `name` for anything else.
struct PortRange {
  std::uint16_t first = 0;
  std::uint16_t last = 0;
};
inline PortRange parse_port_range(std::string_view name, std::string_view value) {
  constexpr std::string_view kForm = "expected LOW-HIGH, two ports in [1, 65535], LOW <= HIGH";
  const std::size_t dash = value.find('-');
  if (dash == std::string_view::npos) detail::reject_text(name, value, kForm);
  const auto port = [&](std::string_view text) {
    unsigned number = 0;
    const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), number);
    if (text.empty() || error != std::errc{} || end != text.data() + text.size() || number == 0 ||
        number > 65535) {
      detail::reject_text(name, value, kForm);
    }
    return static_cast<std::uint16_t>(number);
  };
  const PortRange range{port(value.substr(0, dash)), port(value.substr(dash + 1))};
  if (range.first > range.last) detail::reject_text(name, value, kForm);
  return range;
}

namespace detail {

// What is wrong with a host name or address without brackets, or "" if nothing.
inline std::string_view host_problem(std::string_view host) {
  if (host.empty()) return "empty host name";
  const bool ipv6 = host.find(':') != std::string_view::npos;
  for (const char c : host) {
    if (ipv6 ? !is_ipv6_character(c) : !is_host_character(c)) return "not a host name or address";
  }
  return {};
}

inline std::string_view strip_brackets(std::string_view host) {
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    return host.substr(1, host.size() - 2);
  }
  return host;
}

}  // namespace detail

// A host name, an IPv4 address, or an IPv6 address (with or without brackets). Returns the host
// without brackets. Checks the spelling only; check_resolvable asks the resolver.
inline std::string parse_host(std::string_view name, std::string_view value) {
  const std::string_view host = detail::strip_brackets(value);
  if (const std::string_view problem = detail::host_problem(host); !problem.empty()) {
    detail::reject_text(name, value, problem);
  }
  return std::string(host);
}

struct HostPort {
  std::string host;  // without brackets
  std::uint16_t port = 0;

  friend bool operator==(const HostPort&, const HostPort&) = default;
};

// "host:port", "10.0.0.1:2222" or "[fd00::1]:2222" (IPv6 addresses need the brackets).
inline HostPort parse_host_port(std::string_view name, std::string_view value) {
  const std::size_t colon = value.rfind(':');
  if (colon == std::string_view::npos || colon + 1 == value.size()) {
    detail::reject_text(name, value, "expected host:port");
  }
  const std::string_view host = value.substr(0, colon);
  if (host.find(':') != std::string_view::npos && !(host.starts_with('[') && host.ends_with(']'))) {
    detail::reject_text(name, value, "expected host:port; write an IPv6 address in brackets");
  }
  const std::string_view port_text = value.substr(colon + 1);
  int port = 0;
  const auto [end, error] =
      std::from_chars(port_text.data(), port_text.data() + port_text.size(), port);
  if (error != std::errc{} || end != port_text.data() + port_text.size()) {
    detail::reject_text(name, value, "expected host:port with a numeric port");
  }
  if (port < 1 || port > 65535) {
    detail::reject_text(name, value, "port out of range: a port lies in [1, 65535]");
  }
  const std::string_view bare = detail::strip_brackets(host);
  if (const std::string_view problem = detail::host_problem(bare); !problem.empty()) {
    detail::reject_text(name, value, problem);
  }
  return {std::string(bare), static_cast<std::uint16_t>(port)};
}

// "host:port", with brackets around an IPv6 address.
inline std::string format_host_port(std::string_view host, std::uint16_t port) {
  const bool ipv6 = host.find(':') != std::string_view::npos;
  std::string text;
  if (ipv6) text += '[';
  text += host;
  if (ipv6) text += ']';
  text += ':';
  text += std::to_string(port);
  return text;
}

// Asks the system resolver (getaddrinfo: /etc/hosts, DNS) whether host has an address; throws a
// ConfigError naming `name` and the host if not. Blocks for as long as the resolver takes.
inline void check_resolvable(std::string_view name, std::string_view host) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* result = nullptr;
  const int code = ::getaddrinfo(std::string(host).c_str(), nullptr, &hints, &result);
  if (result != nullptr) ::freeaddrinfo(result);
  if (code != 0) {
    detail::reject_text(name, host, std::string("does not resolve: ") + ::gai_strerror(code));
  }
}

}  // namespace cohort::cluster
