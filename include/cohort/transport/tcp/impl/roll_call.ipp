// The definitions of roll_call.hpp (core/compilation.hpp).
#pragma once

#include "cohort/transport/tcp/roll_call.hpp"

#include "cohort/transport/tcp/asio.hpp"
#include "cohort/transport/tcp/impl/tcp.ipp"
#include "cohort/transport/tcp/rendezvous.hpp"

namespace cohort::transport::tcp {

COHORT_DECL RollCall::RollCall(const Tcp& failed)
    : table_(failed.addresses()),
      listener_(failed.listener(failed.options())),
      rendezvous_(std::make_unique<detail::Rendezvous>(
          detail::Rendezvous::RollCallMode{}, listener_.options(), *listener_.io_,
          *listener_.acceptor_, listener_.port())) {}

COHORT_DECL RollCall::~RollCall() = default;

COHORT_DECL std::vector<bool> RollCall::call(std::chrono::milliseconds timeout) {
  return rendezvous_->call_roll(table_, timeout);
}

}  // namespace cohort::transport::tcp
