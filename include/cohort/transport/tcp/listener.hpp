// tcp::Listener: the first half of a Tcp. It validates the options and binds this rank's listening
// socket, without waiting for anyone; the rendezvous (rendezvous.hpp) then accepts on it. Tests
// use it to learn the port rank 0 got when it asked for port 0:
//
//   tcp::Listener listener({.rank = 0, .size = 3, .rendezvous_port = 0});
//   port.set_value(listener.rendezvous_port());   // hand it to the other ranks
//   tcp::Tcp transport(std::move(listener));       // the rendezvous
//
// Throws ConfigError for a bad option and CommError when the address cannot be bound (a busy
// port), naming address and port. connect_timeout counts from the construction.
#pragma once

// clang-format off
// First: Boost 1.74's awaitable.hpp uses std::exchange without including <utility>.
#include <utility>
// clang-format on

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/address.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "cohort/core/error.hpp"
#include "cohort/transport/tcp/options.hpp"

namespace cohort::transport::tcp {

class Tcp;

namespace detail {

namespace asio = boost::asio;

// The rendezvous runs on one private io_context, so its sockets, timers and coroutines name that
// context's executor rather than the type-erased asio::any_io_executor: the same operations,
// without instantiating the type erasure's machinery in every program that uses the transport.
using Executor = asio::io_context::executor_type;
using Socket = asio::basic_stream_socket<asio::ip::tcp, Executor>;
using Acceptor = asio::basic_socket_acceptor<asio::ip::tcp, Executor>;
template <class T>
using Awaitable = asio::awaitable<T, Executor>;
inline constexpr asio::use_awaitable_t<Executor> use_awaitable;

// "127.0.0.1:29500", "[::1]:29500".
inline std::string endpoint_text(const asio::ip::tcp::endpoint& endpoint) {
  const auto address = endpoint.address();
  const std::string host = address.is_v6() ? "[" + address.to_string() + "]" : address.to_string();
  return host + ":" + std::to_string(endpoint.port());
}

}  // namespace detail

class Listener {
 public:
  [[gnu::cold]] explicit Listener(Options options)
      : options_(std::move(options)), started_(std::chrono::steady_clock::now()) {
    detail::validate(options_);
    boost::system::error_code ec;
    const auto address = boost::asio::ip::make_address(options_.bind_address, ec);
    if (ec) {
      options::reject("bind_address", detail::quoted(options_.bind_address),
                      "must be a numeric IPv4 or IPv6 address");
    }
    io_ = std::make_unique<boost::asio::io_context>(1);
    if (options_.size == 1) return;  // nobody to meet
    // Rank 0 at the rendezvous port; the others at the first free port of their range, if any.
    const bool ranged = options_.rank != 0 && options_.listen_port_first != 0;
    const std::uint16_t first = options_.rank == 0 ? options_.rendezvous_port
                                : ranged           ? options_.listen_port_first
                                                   : 0;
    const std::uint16_t last = ranged ? options_.listen_port_last : first;
    for (std::uint32_t port = first; port <= last; ++port) {
      const boost::asio::ip::tcp::endpoint endpoint(address, static_cast<std::uint16_t>(port));
      if (bind(endpoint, ec)) return;
      const bool busy = ec == boost::asio::error::address_in_use;
      if (busy && port < last) continue;
      std::string setting = options_.rank == 0 ? " (bind_address, rendezvous_port)" : "";
      if (ranged && busy) {
        setting = " (every port of listen_port_first-listen_port_last, " + std::to_string(first) +
                  "-" + std::to_string(last) + ", is taken)";
      }
      throw CommError({.rank = options_.rank,
                       .detail = "cannot listen on " + detail::endpoint_text(endpoint) + setting +
                                 ": " + ec.message()});
    }
  }

  Listener(Listener&&) noexcept = default;
  Listener& operator=(Listener&&) = delete;
  ~Listener() = default;  // acceptor_ is declared after io_, so it goes first, as it must

  int rank() const noexcept { return options_.rank; }
  const Options& options() const noexcept { return options_; }
  // Where rank 0 listens: the port it bound for rank 0 (the real one when it asked for 0), the
  // configured one for the other ranks.
  std::uint16_t rendezvous_port() const noexcept {
    return options_.rank == 0 && acceptor_ ? port_ : options_.rendezvous_port;
  }
  // This rank's own listening port (rank 0: the rendezvous port).
  std::uint16_t port() const noexcept { return port_; }

 private:
  friend class Tcp;

  // Opens, binds and listens at `endpoint`; false with `ec` set when a step failed.
  bool bind(const boost::asio::ip::tcp::endpoint& endpoint, boost::system::error_code& ec) {
    acceptor_ = std::make_unique<detail::Acceptor>(*io_);
    acceptor_->open(endpoint.protocol(), ec);
    // Lets a restarted rank 0 bind its port while connections of the previous run linger in
    // TIME_WAIT; a port another process listens on stays refused.
    if (!ec) acceptor_->set_option(boost::asio::socket_base::reuse_address(true), ec);
    if (!ec) acceptor_->bind(endpoint, ec);
    if (!ec) acceptor_->listen(boost::asio::socket_base::max_listen_connections, ec);
    if (!ec) port_ = acceptor_->local_endpoint(ec).port();
    if (ec) acceptor_.reset();
    return !ec;
  }

  Options options_;
  std::chrono::steady_clock::time_point started_;
  std::unique_ptr<boost::asio::io_context> io_;
  std::unique_ptr<detail::Acceptor> acceptor_;  // null when size == 1
  std::uint16_t port_ = 0;
};

}  // namespace cohort::transport::tcp
