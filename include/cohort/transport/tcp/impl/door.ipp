// The definitions of door.hpp (core/compilation.hpp).
#pragma once

#include "cohort/transport/tcp/door.hpp"

#include "cohort/transport/tcp/asio.hpp"
#include "cohort/transport/tcp/impl/tcp.ipp"
#include "cohort/transport/tcp/rendezvous.hpp"

namespace cohort::transport::tcp {

COHORT_DECL Door::Door(const Tcp& mesh)
    : options_(mesh.options()),
      listener_(mesh.listener(options_)),
      rendezvous_(std::make_unique<detail::Rendezvous>(detail::Rendezvous::DoorMode{}, options_,
                                                       *listener_.io_, *listener_.acceptor_,
                                                       listener_.port())) {}

COHORT_DECL Door::~Door() { rendezvous_->close_door(); }

COHORT_DECL std::size_t Door::waiting() { return rendezvous_->poll_door(); }

COHORT_DECL std::size_t Door::welcome(std::size_t count) {
  const int size = options_.size + static_cast<int>(count);
  return rendezvous_->welcome(count, options_.size, size, options_.epoch + 1);
}

}  // namespace cohort::transport::tcp
