// The definitions of door.hpp (core/compilation.hpp).
#pragma once

#include "cohort/transport/tcp/door.hpp"

#include <utility>

#include "cohort/transport/tcp/asio.hpp"
#include "cohort/transport/tcp/impl/tcp.ipp"
#include "cohort/transport/tcp/rendezvous.hpp"

namespace cohort::transport::tcp {

COHORT_DECL Door::Door(const Tcp& mesh) : Door(mesh.listener(mesh.options()), mesh) {}

COHORT_DECL Door::Door(const Tcp& mesh, const Listener& held)
    : Door(Listener(mesh.options(), *held.acceptor_), mesh) {}

COHORT_DECL Door::Door(Listener listener, const Tcp& mesh)
    : options_(mesh.options()),
      grown_at_(mesh.addresses().front()),
      listener_(std::move(listener)),
      rendezvous_(std::make_unique<detail::Rendezvous>(detail::Rendezvous::DoorMode{}, options_,
                                                       *listener_.io_, *listener_.acceptor_,
                                                       listener_.port(), mesh.addresses())) {}

COHORT_DECL Door::~Door() { rendezvous_->close_door(); }

COHORT_DECL std::size_t Door::waiting() { return rendezvous_->poll_door(); }

COHORT_DECL std::size_t Door::welcome(std::size_t count) {
  const int size = options_.size + static_cast<int>(count);
  return rendezvous_->welcome(count, options_.size, size, options_.epoch + 1, grown_at_);
}

}  // namespace cohort::transport::tcp
