// One rank of the process tests of the collectives over TCP. Who it is comes from the launcher's
// variables (cluster::resolve).
//   collective_rank exact ALGORITHM     every operation, exact sums, over the lengths
//   collective_rank mismatch            rank 0 calls all_reduce, the others broadcast and wait
//   collective_rank loop                all-reduces 4 MiB until killed (fault tests)
// Exits 0 on success, 1 with "error: ..." on stderr otherwise.
#include <chrono>
#include <cohort/cluster/cluster.hpp>
#include <cohort/collective/deterministic.hpp>
#include <cohort/collective/ring.hpp>
#include <cohort/transport/tcp/tcp.hpp>
#include <cstdint>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "collective_checks.hpp"

namespace {

cohort::transport::tcp::Tcp connect() {
  const cohort::cluster::Spec spec = cohort::cluster::resolve();
  return cohort::transport::tcp::Tcp({.rank = spec.rank,
                                      .size = spec.size,
                                      .job_id = spec.job_id.empty() ? "test" : spec.job_id,
                                      .rendezvous_host = spec.master_address,
                                      .rendezvous_port = spec.master_port,
                                      .connect_timeout = std::chrono::seconds(20),
                                      .operation_timeout = std::chrono::seconds(10)});
}

template <class Communicator>
void exact(Communicator& c) {
  for (std::size_t length :
       {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{4099}, std::size_t{1} << 22}) {
    cohort::testing::check_collectives<float>(c, length);
    cohort::testing::check_collectives<std::int64_t>(c, std::min<std::size_t>(length, 4099));
  }
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  try {
    if (mode == "exact" && argc == 3 && std::string(argv[2]) == "ring") {
      cohort::collective::Ring communicator(connect());
      exact(communicator);
    } else if (mode == "exact" && argc == 3 && std::string(argv[2]) == "deterministic") {
      cohort::collective::Deterministic communicator(connect());
      exact(communicator);
    } else if (mode == "mismatch") {
      cohort::collective::Deterministic communicator(connect());
      std::vector<float> buffer(7, 1.0f);
      if (communicator.rank() == 0) {
        communicator.all_reduce(std::span<float>(buffer), cohort::ReduceOp::kSum);
      } else {
        // Sends and waits, so that rank 0 is the one that finds the mismatch (the launcher
        // then stops this rank).
        communicator.broadcast(std::span<float>(buffer), 1);
        std::this_thread::sleep_for(std::chrono::seconds(20));
      }
    } else if (mode == "loop") {
      cohort::collective::Deterministic communicator(connect());
      std::vector<float> buffer(std::size_t{1} << 20, 1.0f);
      while (true) communicator.all_reduce(std::span<float>(buffer), cohort::ReduceOp::kMax);
    } else {
      std::fprintf(stderr, "usage: collective_rank exact ring|deterministic | mismatch | loop\n");
      return 64;
    }
    return 0;
  } catch (const std::exception& error) {
    std::fprintf(stderr, "error: %s\n", error.what());
    return 1;
  }
}
