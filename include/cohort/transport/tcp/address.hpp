// tcp::Address: where a rank accepts its mesh connections. Rank 0 sends every rank the table of
// all of them at the rendezvous (rendezvous.hpp), and the ranks that regroup after a failure find
// each other there (regroup.hpp).
#pragma once

#include <cstdint>
#include <string>

namespace cohort::transport::tcp {

struct Address {
  std::string host{};  // numeric, except rank 0's where the job was given its name
  std::uint16_t port = 0;
  friend bool operator==(const Address&, const Address&) = default;
};

}  // namespace cohort::transport::tcp
