// One rank of the process tests of the collectives over TCP. Who it is comes from the launcher's
// variables (cluster::resolve).
//   collective_rank exact ALGORITHM     every operation, exact sums, over the lengths,
//                                       and deterministic's canonical bits; ALGORITHM: ring,
//                                       deterministic, or shared (deterministic with its
//                                       all-reduce through shared memory)
//   collective_rank mismatch [shared]   rank 0 calls all_reduce, the others broadcast and wait
//   collective_rank loop [shared]       all-reduces 4 MiB until killed (fault tests)
// Exits 0 on success, 1 with "error: ..." on stderr otherwise.
#include <chrono>
#include <cohort/cluster/cluster.hpp>
#include <cohort/collective/deterministic.hpp>
#include <cohort/collective/ring.hpp>
#include <cohort/transport/tcp/tcp.hpp>
#include <cstdint>
#include <cstdio>
#include <stdexcept>
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

// Deterministic over TCP, its all-reduce through shared memory where `shared` says so (or an
// error: the test's processes share a host).
cohort::collective::Deterministic<cohort::transport::tcp::Tcp> deterministic(bool shared) {
  cohort::collective::Deterministic communicator(connect());
  if (shared &&
      !communicator.share_host_memory(true, communicator.transport().options().spin).shared) {
    throw std::runtime_error("the ranks did not share memory");
  }
  return communicator;
}

template <class Communicator>
void exact(Communicator& c) {
  for (std::size_t length :
       {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{4099}, std::size_t{1} << 22}) {
    cohort::testing::check_collectives<float>(c, length);
    cohort::testing::check_collectives<std::int64_t>(c, std::min<std::size_t>(length, 4099));
  }
}

// The canonical tree's bits on every rank, for a buffer long enough to be cut into segments that
// are reduced while others travel.
void canonical_bits(cohort::collective::Deterministic<cohort::transport::tcp::Tcp>& c) {
  for (const std::size_t length : {std::size_t{300'000}, std::size_t{1} << 22}) {
    const auto inputs = cohort::testing::cancelling_inputs(c.size(), length, 7);
    const std::vector<float> expected = cohort::testing::canonical_sum(inputs);
    const auto& input = inputs[static_cast<std::size_t>(c.rank())];
    auto buffer = input;
    c.all_reduce(std::span<float>(buffer), cohort::ReduceOp::kSum);
    if (buffer != expected) throw std::runtime_error("bits differ from the canonical tree");
    std::vector<float> output(length);
    c.all_reduce(std::span<const float>(input), std::span<float>(output), cohort::ReduceOp::kSum);
    if (output != expected) {
      throw std::runtime_error("bits differ from the canonical tree out of place");
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  const bool shared = argc == 3 && std::string(argv[2]) == "shared";
  try {
    if (mode == "exact" && argc == 3 && std::string(argv[2]) == "ring") {
      cohort::collective::Ring communicator(connect());
      exact(communicator);
    } else if (mode == "exact" && argc == 3 &&
               (std::string(argv[2]) == "deterministic" || shared)) {
      auto communicator = deterministic(shared);
      exact(communicator);
      canonical_bits(communicator);
    } else if (mode == "mismatch") {
      auto communicator = deterministic(shared);
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
      auto communicator = deterministic(shared);
      std::vector<float> buffer(std::size_t{1} << 20, 1.0f);
      while (true) communicator.all_reduce(std::span<float>(buffer), cohort::ReduceOp::kMax);
    } else {
      std::fprintf(stderr,
                   "usage: collective_rank exact ring|deterministic|shared | mismatch [shared] | "
                   "loop [shared]\n");
      return 64;
    }
    return 0;
  } catch (const std::exception& error) {
    std::fprintf(stderr, "error: %s\n", error.what());
    return 1;
  }
}
