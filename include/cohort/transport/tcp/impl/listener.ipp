// The definitions of listener.hpp (core/compilation.hpp).
#pragma once

#include "cohort/transport/tcp/listener.hpp"

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <utility>

#include "cohort/core/error.hpp"
#include "cohort/transport/tcp/asio.hpp"

namespace cohort::transport::tcp {

namespace detail {

// Whether a rank meets nobody: a job of one process, unless it is elastic (its rank 0 keeps the
// job's door, so that it grows; a process that joins names a job of 2 or more: validate).
COHORT_DECL bool alone(const Options& options) {
  return options.size == 1 && !options.keep_listening;
}

// Opens, binds and listens at `endpoint`: the acceptor, or null with `ec` set when a step failed.
COHORT_DECL std::unique_ptr<Acceptor> listen_at(asio::io_context& io,
                                                const asio::ip::tcp::endpoint& endpoint,
                                                boost::system::error_code& ec) {
  auto acceptor = std::make_unique<Acceptor>(io);
  acceptor->open(endpoint.protocol(), ec);
  // Lets a restarted rank 0 bind its port while connections of the previous run linger in
  // TIME_WAIT; a port another process listens on stays refused.
  if (!ec) acceptor->set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) acceptor->bind(endpoint, ec);
  if (!ec) acceptor->listen(asio::socket_base::max_listen_connections, ec);
  if (ec) acceptor.reset();
  return acceptor;
}

// What a rank that cannot listen at `endpoint` throws; `setting` names the options that chose it.
COHORT_DECL CommError cannot_listen(int rank, const asio::ip::tcp::endpoint& endpoint,
                                    const std::string& setting, const boost::system::error_code& ec) {
  return CommError(
      {.rank = rank, .detail = "cannot listen on " + endpoint_text(endpoint) + setting + ": " +
                               ec.message()});
}

}  // namespace detail

COHORT_DECL Listener::Listener(Options options)
    : options_(std::move(options)), started_(std::chrono::steady_clock::now()) {
  detail::validate(options_);
  boost::system::error_code ec;
  const auto address = boost::asio::ip::make_address(options_.bind_address, ec);
  if (ec) {
    options::reject("bind_address", detail::quoted(options_.bind_address),
                    "must be a numeric IPv4 or IPv6 address");
  }
  io_ = std::make_unique<boost::asio::io_context>(1);
  if (detail::alone(options_)) return;
  // The rank 0 that starts the job at the rendezvous port; the others at the first free port of
  // their range, if any.
  const bool hosts = options_.rank == 0 && !options_.joins_running_job;
  const bool ranged = !hosts && options_.listen_port_first != 0;
  const std::uint16_t first = hosts    ? options_.rendezvous_port
                              : ranged ? options_.listen_port_first
                                       : 0;
  const std::uint16_t last = ranged ? options_.listen_port_last : first;
  for (std::uint32_t port = first; port <= last; ++port) {
    const boost::asio::ip::tcp::endpoint endpoint(address, static_cast<std::uint16_t>(port));
    acceptor_ = detail::listen_at(*io_, endpoint, ec);
    if (acceptor_) port_ = acceptor_->local_endpoint(ec).port();
    if (!ec) return;
    acceptor_.reset();
    const bool busy = ec == boost::asio::error::address_in_use;
    if (busy && port < last) continue;
    std::string setting = hosts ? " (bind_address, rendezvous_port)" : "";
    if (ranged && busy) {
      setting = " (every port of listen_port_first-listen_port_last, " + std::to_string(first) +
                "-" + std::to_string(last) + ", is taken)";
    }
    throw detail::cannot_listen(options_.rank, endpoint, setting, ec);
  }
}

COHORT_DECL Listener::Listener(Options options, const Address& at)
    : options_(std::move(options)), started_(std::chrono::steady_clock::now()) {
  detail::validate(options_);
  boost::system::error_code ec;
  const auto address = boost::asio::ip::make_address(at.host, ec);
  if (ec) {
    throw CommError({.rank = options_.rank,
                     .detail = "cannot listen on '" + at.host + "': not a numeric address"});
  }
  io_ = std::make_unique<boost::asio::io_context>(1);
  const boost::asio::ip::tcp::endpoint endpoint(address, at.port);
  acceptor_ = detail::listen_at(*io_, endpoint, ec);
  if (!acceptor_) throw detail::cannot_listen(options_.rank, endpoint, "", ec);
  port_ = at.port;
}

COHORT_DECL Listener::Listener(Options options, detail::Acceptor& listening)
    : options_(std::move(options)), started_(std::chrono::steady_clock::now()) {
  detail::validate(options_);
  io_ = std::make_unique<boost::asio::io_context>(1);
  boost::system::error_code ec;
  const auto endpoint = listening.local_endpoint(ec);
  const int descriptor = ec ? -1 : ::dup(listening.native_handle());
  if (descriptor >= 0) {
    acceptor_ = std::make_unique<detail::Acceptor>(*io_);
    acceptor_->assign(endpoint.protocol(), descriptor, ec);
    if (ec) ::close(descriptor);
  }
  if (descriptor < 0 || ec) {
    throw CommError({.rank = options_.rank,
                     .operation = "regroup",
                     .detail = "cannot keep listening: " +
                               (ec ? ec.message() : std::string(std::strerror(errno)))});
  }
  port_ = endpoint.port();
}

COHORT_DECL Listener::Listener(Listener&&) noexcept = default;
COHORT_DECL Listener::~Listener() = default;

}  // namespace cohort::transport::tcp
