// Definitions for cohort/cluster/environment.hpp (core/compilation.hpp says where they compile).
#pragma once

#include "cohort/cluster/environment.hpp"

#include <netdb.h>
#include <sys/socket.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>

#include "cohort/core/error.hpp"

namespace cohort::cluster {

COHORT_DECL Environment process_environment() {
  return [](std::string_view name) -> std::optional<std::string> {
    const char* value = std::getenv(std::string(name).c_str());
    if (value == nullptr) return std::nullopt;
    return std::string(value);
  };
}

COHORT_DECL Environment environment_from(Variables variables) {
  return [variables = std::move(variables)](std::string_view name) -> std::optional<std::string> {
    const auto found = variables.find(name);
    if (found == variables.end()) return std::nullopt;
    return found->second;
  };
}

namespace detail {

[[noreturn]] COHORT_DECL void reject_text(std::string_view name, std::string_view value,
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

[[noreturn]] COHORT_DECL void reject_number(std::string_view name, long long value,
                                            std::string_view requirement) {
  throw ConfigError(std::string(name) + " = " + std::to_string(value) + ": " +
                    std::string(requirement));
}

COHORT_DECL bool is_host_character(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
         c == '.' || c == '_';
}

COHORT_DECL bool is_ipv6_character(char c) {
  return (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F') || (c >= '0' && c <= '9') || c == ':' ||
         c == '.' || c == '%' || is_host_character(c);  // '%' and a name: a scope (fe80::1%eth0)
}

}  // namespace detail

COHORT_DECL int parse_integer(std::string_view name, std::string_view value) {
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

COHORT_DECL std::uint16_t require_port(std::string_view name, long long port) {
  if (port < 1 || port > 65535)
    detail::reject_number(name, port, "out of range: a port lies in [1, 65535]");
  return static_cast<std::uint16_t>(port);
}

COHORT_DECL std::uint16_t parse_port(std::string_view name, std::string_view value) {
  return require_port(name, parse_integer(name, value));
}

COHORT_DECL bool parse_switch(std::string_view name, std::string_view value) {
  if (value != "0" && value != "1") detail::reject_text(name, value, "expected 0 or 1");
  return value == "1";
}

COHORT_DECL std::chrono::milliseconds parse_duration(std::string_view name,
                                                     std::string_view value) {
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

COHORT_DECL PortRange parse_port_range(std::string_view name, std::string_view value) {
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
COHORT_DECL std::string_view host_problem(std::string_view host) {
  if (host.empty()) return "empty host name";
  const bool ipv6 = host.find(':') != std::string_view::npos;
  for (const char c : host) {
    if (ipv6 ? !is_ipv6_character(c) : !is_host_character(c)) return "not a host name or address";
  }
  return {};
}

COHORT_DECL std::string_view strip_brackets(std::string_view host) {
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    return host.substr(1, host.size() - 2);
  }
  return host;
}

}  // namespace detail

COHORT_DECL std::string parse_host(std::string_view name, std::string_view value) {
  const std::string_view host = detail::strip_brackets(value);
  if (const std::string_view problem = detail::host_problem(host); !problem.empty()) {
    detail::reject_text(name, value, problem);
  }
  return std::string(host);
}

COHORT_DECL HostPort parse_host_port(std::string_view name, std::string_view value) {
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

COHORT_DECL std::string format_host_port(std::string_view host, std::uint16_t port) {
  const bool ipv6 = host.find(':') != std::string_view::npos;
  std::string text;
  if (ipv6) text += '[';
  text += host;
  if (ipv6) text += ']';
  text += ':';
  text += std::to_string(port);
  return text;
}

COHORT_DECL void check_resolvable(std::string_view name, std::string_view host) {
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
