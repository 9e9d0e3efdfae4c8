// Open MPI's MPI_Allreduce (float, sum), measured as cohort-bench measures (peer_sweep.hpp).
//
//   mpirun -np 4 --mca btl self,vader peer_mpi_allreduce -b 4 -e 64M -f 4 --label vader
//
// Out-of-place is MPI's own MPI_Allreduce(send, receive); in-place passes MPI_IN_PLACE. Open MPI
// picks the algorithm (tuned collectives: recursive doubling for small messages, a ring or
// Rabenseifner's reduce-scatter + all-gather for large ones); the btl (--mca btl) picks the wire:
// vader is shared memory, tcp is loopback sockets like cohort's tcp backend.
#include <mpi.h>
#include <unistd.h>

#include <span>
#include <string>

#include "machine.hpp"
#include "peer_sweep.hpp"

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  const cohort::peers::Flags flags = cohort::peers::parse_flags(argc, argv);
  cohort::peers::PeerOps ops;
  MPI_Comm_rank(MPI_COMM_WORLD, &ops.rank);
  MPI_Comm_size(MPI_COMM_WORLD, &ops.size);
  ops.barrier = [] { MPI_Barrier(MPI_COMM_WORLD); };
  ops.prepare_in_place = [](std::span<float> buffer) {
    return [buffer] {
      MPI_Allreduce(MPI_IN_PLACE, buffer.data(), static_cast<int>(buffer.size()), MPI_FLOAT,
                    MPI_SUM, MPI_COMM_WORLD);
    };
  };
  ops.prepare_out_of_place = [](std::span<const float> input, std::span<float> output) {
    return [input, output] {
      MPI_Allreduce(input.data(), output.data(), static_cast<int>(output.size()), MPI_FLOAT,
                    MPI_SUM, MPI_COMM_WORLD);
    };
  };
  ops.max = [](std::span<double> values) {
    MPI_Allreduce(MPI_IN_PLACE, values.data(), static_cast<int>(values.size()), MPI_DOUBLE, MPI_MAX,
                  MPI_COMM_WORLD);
  };
  ops.sum = [](std::span<double> values) {
    MPI_Allreduce(MPI_IN_PLACE, values.data(), static_cast<int>(values.size()), MPI_DOUBLE, MPI_SUM,
                  MPI_COMM_WORLD);
  };

  char version[MPI_MAX_LIBRARY_VERSION_STRING] = {};
  int length = 0;
  MPI_Get_library_version(version, &length);
  std::string library(version, static_cast<std::size_t>(length));
  library = library.substr(0, library.find_first_of(",\n"));

  cohort::bench::RunInfo run;
  run.tool = "peer_mpi_allreduce";
  run.backend = "openmpi";
  run.algorithm = flags.label.empty() ? "default" : flags.label;
  run.details = "MPI_Allreduce, " + library;
  run.launcher = "mpirun";
  run.machine = cohort::bench::this_machine();
  // Every rank's pid and host, for the header, as cohort-bench prints them.
  long pid = static_cast<long>(::getpid());
  std::vector<long> pids(static_cast<std::size_t>(ops.size));
  MPI_Gather(&pid, 1, MPI_LONG, pids.data(), 1, MPI_LONG, 0, MPI_COMM_WORLD);
  for (int r = 0; r < ops.size; ++r) {
    run.rank_info.push_back({r, pids[static_cast<std::size_t>(r)], run.machine.hostname});
  }
  const int status = cohort::peers::run(flags, ops, run);
  MPI_Finalize();
  return status;
}
