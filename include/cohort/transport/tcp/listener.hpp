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

#include <chrono>
#include <cstdint>
#include <memory>

#include "cohort/core/compilation.hpp"
#include "cohort/transport/tcp/address.hpp"
#include "cohort/transport/tcp/options.hpp"

namespace boost::asio {
class io_context;
}  // namespace boost::asio

namespace cohort::transport::tcp {

class Tcp;
class Door;
class RollCall;

namespace detail {
struct Acceptor;  // asio.hpp
}  // namespace detail

class Listener {
 public:
  // Once per process, so compiled for size, as the rendezvous is (rendezvous.hpp).
  [[gnu::cold]] COHORT_DECL explicit Listener(Options options);

  // Listens at `at` (a numeric address and its port) whatever the rank, under `options`' job:
  // where a later rank 0 keeps the job's door at the job's rendezvous address, once the rank 0
  // that bound it first is lost (door.hpp). Throws CommError naming the address when it cannot.
  [[gnu::cold]] COHORT_DECL Listener(Options options, const Address& at);

  COHORT_DECL Listener(Listener&&) noexcept;
  Listener& operator=(Listener&&) = delete;
  COHORT_DECL ~Listener();  // acceptor_ is declared after io_, so it goes first, as it must

  int rank() const noexcept { return options_.rank; }
  const Options& options() const noexcept { return options_; }
  // Where rank 0 listens: the port it bound for rank 0 (the real one when it asked for 0), the
  // configured one for the other ranks and a process that joins a running job.
  std::uint16_t rendezvous_port() const noexcept {
    return options_.rank == 0 && !options_.joins_running_job && acceptor_
               ? port_
               : options_.rendezvous_port;
  }
  // This rank's own listening port (rank 0: the rendezvous port).
  std::uint16_t port() const noexcept { return port_; }

 private:
  friend class Tcp;
  friend class Door;
  friend class RollCall;

  // Tcp::listener: a Listener on a duplicate of `listening`'s socket, with its own io_context.
  [[gnu::cold]] COHORT_DECL Listener(Options options, detail::Acceptor& listening);

  Options options_;
  std::chrono::steady_clock::time_point started_;
  std::unique_ptr<boost::asio::io_context> io_;
  std::unique_ptr<detail::Acceptor> acceptor_;  // null where the rank meets nobody (alone)
  std::uint16_t port_ = 0;
};

}  // namespace cohort::transport::tcp

#if !defined(COHORT_SEPARATE_COMPILATION)
#include "cohort/transport/tcp/impl/listener.ipp"
#endif
