// A synchronous parameter-server job that takes processes in (ParameterServer, strategy::Grows):
// at the step boundary where the workers' vote counted them, every worker ends the segment (its
// kDone says kAdmit, protocol.hpp), and the chief tells every server how many the job takes in:
//
//   chief     order_admission: an AdmitOrder frame (tag::kAdmitOrder) to every server
//   server    await_admission: once its fit's segment ended with kAdmit, the count
//
// Then every process, the ones taken in too, forms the grown mesh (transport/tcp/regroup.hpp,
// tcp::grow). A server thus never grows a mesh the workers do not: it waits for the chief's word,
// within its transport's timeout, and a chief lost before it comes fails the server's transfer.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "cohort/strategy/parameter_server/protocol.hpp"
#include "cohort/transport/transport.hpp"

namespace cohort::strategy::ps {

template <transport::Transport Tr>
void order_admission(Tr& transport, const std::vector<int>& servers, std::uint64_t count) {
  std::vector<transport::Send> sends;
  for (const int server : servers) {
    sends.push_back({server, header(tag::kAdmitOrder), std::as_bytes(std::span(&count, 1))});
  }
  transport.transfer(sends, {});
}

template <transport::Transport Tr>
std::uint64_t await_admission(Tr& transport) {
  std::uint64_t count = 0;
  const transport::Receive receive{0, header(tag::kAdmitOrder),
                                   std::as_writable_bytes(std::span(&count, 1))};
  transport.transfer({}, std::span(&receive, 1));
  return count;
}

}  // namespace cohort::strategy::ps
