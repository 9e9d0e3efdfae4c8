// tcp::RegroupOptions: what tcp::regroup (regroup.hpp) asks of the ranks that go on. Apart from
// the mesh, so that strategy::Elastic takes its defaults from here without the transport.
#pragma once

#include <chrono>

namespace cohort::transport::tcp {

struct RegroupOptions {
  int min_size = 1;  // fewer ranks alive: CommError, and no new mesh
  // How long the roll call waits for a rank's listener to answer: a host cut off is counted out
  // after this.
  std::chrono::milliseconds probe_timeout{std::chrono::seconds(2)};
};

}  // namespace cohort::transport::tcp
