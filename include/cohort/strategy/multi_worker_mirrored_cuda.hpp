// MultiWorkerMirrored<device::Cuda>: one GPU per worker process, synchronous. For cohort::cuda
// users who also link cohort::tcp.
//
//   cohort::strategy::MultiWorkerMirrored<cohort::device::Cuda> strategy({});
//
// Every process of the job runs the same program (started by any launcher, as for
// MultiWorkerMirrored<>: cluster/cluster.hpp, docs/launching.md) and drives one GPU: the one at
// index local_rank among the GPUs that CUDA_VISIBLE_DEVICES leaves visible to it (local_rank comes
// from LOCAL_RANK, OMPI_COMM_WORLD_LOCAL_RANK, SLURM_LOCALID or COHORT_LOCAL_RANK; it is the rank
// when none is set). A launcher that gives each process its own CUDA_VISIBLE_DEVICES and no local
// rank works too: every process then uses its device 0.
//
// Construction checks the GPU (a ConfigError naming local_rank when this process has no GPU at
// that index), makes the replica's stream, and does the TCP rendezvous of MultiWorkerMirrored<>.
// Each fit then makes a NCCL communicator over the processes: rank 0's ncclUniqueId travels over
// cohort's own TCP communicator (collective::nccl_unique_id), and the gradients are all-reduced by
// collective::NcclCommunicator in deterministic mode on the replica's stream, ranks in the
// canonical tree. So N processes give the bits of Mirrored<device::Cuda, collective::Nccl> with N
// GPUs, and of Mirrored<> on the host with N replicas, for the same seed.
//
// Options: cluster, bind_address, secret, connect_timeout and timeout, as for
// MultiWorkerMirrored<> (one replica per process, so no local_replicas and no bucket_bytes);
// connect_timeout also bounds each fit's NCCL set-up, timeout each collective.
// CrossCollective is only the bootstrap's (it carries the unique id).
//
// A failing worker aborts its NCCL communicator; the others fail when NCCL reports the lost peer
// or when their collective's timeout expires (NCCL cannot carry the reason, as the TCP transport
// does for MultiWorkerMirrored<>).
#pragma once

#include <nccl.h>

#include <chrono>
#include <cstddef>
#include <cstdio>
#include <memory>
#include <string>
#include <string_view>
#include <utility>

#include "cohort/cluster/cluster.hpp"
#include "cohort/collective/nccl.hpp"
#include "cohort/core/options.hpp"
#include "cohort/device/cuda.hpp"
#include "cohort/strategy/detail/local_gpu_cuda.hpp"
#include "cohort/strategy/detail/mirrored_replica.hpp"
#include "cohort/strategy/detail/replica_threads.hpp"
#include "cohort/strategy/detail/tcp_options.hpp"
#include "cohort/strategy/multi_worker_mirrored.hpp"
#include "cohort/strategy/strategy.hpp"
#include "cohort/transport/tcp/tcp.hpp"

namespace cohort::strategy {

template <template <class> class CrossCollective>
class MultiWorkerMirrored<device::Cuda, CrossCollective> {
 public:
  static constexpr std::string_view kName = "multi_worker_mirrored";
  using Device = device::Cuda;
  using Cross = CrossCollective<transport::tcp::Tcp>;
  using Communicator = collective::NcclCommunicator;
  using Replica = detail::MirroredReplica<Communicator, device::Cuda>;

  struct Options {
    cluster::Explicit cluster{};
    std::string bind_address{};
    std::string secret{};
    std::chrono::milliseconds connect_timeout{std::chrono::minutes(1)};
    std::chrono::milliseconds timeout{std::chrono::minutes(5)};
  };

  explicit MultiWorkerMirrored(Options options)
      : options_(std::move(options)),
        spec_(cluster::resolve(options_.cluster)),
        stream_(checked_device(options_, spec_)) {
    std::fprintf(stderr, "cohort: %s, GPU %d\n", cluster::describe(spec_).c_str(),
                 stream_.device());
    cross_ = std::make_unique<Cross>(
        transport::tcp::Tcp(detail::tcp_options(spec_, spec_.rank, spec_.size, options_)));
  }

  std::size_t replicas() const { return static_cast<std::size_t>(spec_.size); }
  std::size_t local_replicas() const { return 1; }
  std::size_t first_local_replica() const { return static_cast<std::size_t>(spec_.rank); }
  bool is_chief() const { return spec_.rank == 0; }
  const cluster::Spec& cluster() const { return spec_; }
  const Options& options() const { return options_; }

  // This process's one replica: its GPU and stream.
  device::cuda::Place place(std::size_t /*local_index*/) const { return stream_.place(); }

  template <class Body>
  void run(Body&& body) {
    // A fresh NCCL group per run (a communicator that saw a failure stays aborted); every process
    // calls run once per fit, so the ids pair up.
    const ncclUniqueId id = collective::nccl_unique_id(*cross_);
    detail::run_replica_threads(
        1,
        [&](std::size_t) {
          const device::cuda::Place where = place(0);
          device::cuda::use(where.device);
          return Replica(first_local_replica(),
                         Communicator(id, spec_.rank, spec_.size,
                                      {.device = where.device,
                                       .stream = where.stream,
                                       .timeout = options_.timeout,
                                       .setup_timeout = options_.connect_timeout,
                                       .deterministic = true}),
                         where);
        },
        body);
  }

 private:
  // Validates the options and the cluster description, and answers this process's GPU. The GPU
  // comes before the rendezvous: a process without one fails at once.
  static int checked_device(const Options& given, const cluster::Spec& spec) {
    options::require_positive("timeout", given.timeout.count());
    if (spec.role != "worker" && spec.role != "chief") {
      options::reject("role", spec.role,
                      "MultiWorkerMirrored runs workers and a chief only (" + spec.source + ")");
    }
    if (spec.size > static_cast<int>(cuda::kMaxTreeInputs)) {
      options::reject("size", spec.size,
                      "deterministic NCCL combines at most 64 GPUs (cuda::kMaxTreeInputs)");
    }
    return detail::local_gpu(spec, "MultiWorkerMirrored<device::Cuda>");
  }

  Options options_;
  cluster::Spec spec_;
  device::cuda::Stream stream_;  // this process's GPU's, for the replica
  std::unique_ptr<Cross> cross_;
};

static_assert(Strategy<MultiWorkerMirrored<device::Cuda>>);

}  // namespace cohort::strategy
