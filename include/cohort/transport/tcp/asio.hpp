// The Boost.Asio vocabulary of the tcp folder: the executor, socket and acceptor types that the
// listener, the rendezvous and the connections share. Included by those files' definitions only,
// so that a program that names the transport (tcp.hpp) parses no Asio where cohort is compiled
// separately (core/compilation.hpp).
#pragma once

// clang-format off
// First: Boost 1.74's awaitable.hpp uses std::exchange without including <utility>.
#include <utility>
// clang-format on

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/address.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <string>

namespace cohort::transport::tcp::detail {

namespace asio = boost::asio;

// The rendezvous runs on one private io_context, so its sockets, timers and coroutines name that
// context's executor rather than the type-erased asio::any_io_executor: the same operations,
// without instantiating the type erasure's machinery in every program that uses the transport.
using Executor = asio::io_context::executor_type;
using Socket = asio::basic_stream_socket<asio::ip::tcp, Executor>;
template <class T>
using Awaitable = asio::awaitable<T, Executor>;
inline constexpr asio::use_awaitable_t<Executor> use_awaitable;

// A class rather than an alias, so that the Listener that owns one can declare it without Asio.
struct Acceptor : asio::basic_socket_acceptor<asio::ip::tcp, Executor> {
  using basic_socket_acceptor::basic_socket_acceptor;
};

// "127.0.0.1:29500", "[::1]:29500".
inline std::string endpoint_text(const asio::ip::tcp::endpoint& endpoint) {
  const auto address = endpoint.address();
  const std::string host = address.is_v6() ? "[" + address.to_string() + "]" : address.to_string();
  return host + ":" + std::to_string(endpoint.port());
}

}  // namespace cohort::transport::tcp::detail
