// tcp::RollCall: which ranks of a failed mesh are still there, asked of their processes. Every
// rank that regroups (regroup.hpp) calls the roll on its failed Tcp, which kept listening
// (Options::keep_listening):
//
//   std::vector<bool> answered = tcp::RollCall(failed).call(2s);   // by old rank
//
// The rank connects to every other rank where it listened at the rendezvous (Tcp::addresses) and
// runs the rendezvous's handshake (handshake.hpp) under the mesh's secret, with a hello that says
// it is a roll call of the mesh's membership epoch. Only a rank calling the same roll answers it,
// so a rank counts another in only when that process itself came to the roll call: a process
// that ended, or left (Tcp::stop_listening), refuses the connection and is counted out at once;
// one stopped or hung, whose kernel still accepts, and a host cut off are counted out after the
// timeout. Meanwhile the rank answers the others' roll calls on a duplicate of its listening
// socket, and it stays until each rank it counted in has had its own answered too (for up to
// the timeout more), so that ranks that come to the roll call within the timeout of each other
// count each other in. A stranger's hello is refused as at a rendezvous: without the secret it
// cannot answer for a rank, nor be counted as one.
#pragma once

#include <chrono>
#include <memory>
#include <vector>

#include "cohort/core/compilation.hpp"
#include "cohort/transport/tcp/listener.hpp"
#include "cohort/transport/tcp/tcp.hpp"

namespace cohort::transport::tcp {

namespace detail {
class Rendezvous;  // rendezvous.hpp
}  // namespace detail

class RollCall {
 public:
  // On a duplicate of `failed`'s listening socket, under its options and addresses.
  [[gnu::cold]] COHORT_DECL explicit RollCall(const Tcp& failed);
  RollCall(const RollCall&) = delete;
  RollCall& operator=(const RollCall&) = delete;
  COHORT_DECL ~RollCall();

  // By old rank, whether that rank's process answered within `timeout` (this rank's own: true).
  // Throws CommError where this rank cannot accept on its socket.
  [[gnu::cold]] COHORT_DECL std::vector<bool> call(std::chrono::milliseconds timeout);

 private:
  std::vector<Address> table_;
  Listener listener_;
  std::unique_ptr<detail::Rendezvous> rendezvous_;
};

}  // namespace cohort::transport::tcp

#if !defined(COHORT_SEPARATE_COMPILATION)
#include "cohort/transport/tcp/impl/roll_call.ipp"
#endif
