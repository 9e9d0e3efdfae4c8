// MultiWorkerMirrored<device::Cuda>: synchronous training over worker processes with GPUs, each
// process driving one GPU or several. For cohort::cuda users who also link cohort::tcp.
//
//   cohort::strategy::MultiWorkerMirrored<cohort::device::Cuda> strategy({});
//   cohort::strategy::MultiWorkerMirrored<cohort::device::Cuda> strategy({.local_replicas = 8});
//
// Every process of the job runs the same program (started by any launcher, as for
// MultiWorkerMirrored<>: cluster/cluster.hpp, docs/launching.md) and drives local_replicas GPUs,
// a replica thread each: those at indices local_rank * local_replicas to
// local_rank * local_replicas + local_replicas - 1 among the GPUs that CUDA_VISIBLE_DEVICES leaves
// visible to it (local_rank comes from LOCAL_RANK, OMPI_COMM_WORLD_LOCAL_RANK, SLURM_LOCALID or
// COHORT_LOCAL_RANK; where none is set, from the rendezvous: the ranks sharing an address). So one
// process per GPU (the default, local_replicas = 1, as torchrun starts them) and one process per
// host with all its GPUs both work. Every process drives as many GPUs (a ConfigError otherwise, on
// every process).
//
// Construction checks the GPUs (a ConfigError naming local_rank when this process lacks one of
// them), makes each replica's stream, and does the TCP rendezvous of MultiWorkerMirrored<> (the
// GPUs after it where the local rank comes from the rendezvous). Each
// fit then makes one NCCL communicator over every replica of every process (replica
// rank * local_replicas + i is NCCL rank rank * local_replicas + i): rank 0's ncclUniqueId travels
// over cohort's own TCP communicator (collective::nccl_unique_id), and the gradients are
// all-reduced by collective::NcclCommunicator in deterministic mode on each replica's stream,
// replicas in the canonical tree. So N processes of L GPUs give the bits of
// Mirrored<device::Cuda, collective::Nccl> with N * L GPUs, and of Mirrored<> on the host with
// N * L replicas, for the same seed.
//
// Options: cluster, bind_address, secret, connect_timeout and timeout, as for
// MultiWorkerMirrored<> (no bucket_bytes: NCCL carries whole buffers); connect_timeout also bounds
// each fit's NCCL set-up, timeout each collective and the end of each communicator and stream.
// local_replicas: GPUs per process (>= 1).
// CrossCollective is only the bootstrap's (it carries the unique id).
//
// A failing replica aborts its NCCL communicator and releases the other replicas of its process at
// once, with its reason; the other processes fail when NCCL reports the lost peer or when their
// collective's timeout expires (NCCL cannot carry the reason, as the TCP transport does for
// MultiWorkerMirrored<>).
//
// elastic (strategy/elastic.hpp; or COHORT_MIN_WORKERS, COHORT_MAX_WORKERS, COHORT_JOIN): the job
// goes on without a lost worker, as MultiWorkerMirrored<>'s does (detail/worker_membership.hpp).
// During each run a watch over the TCP mesh (transport/tcp/loss_watch.hpp) aborts this process's
// NCCL group as soon as another process's connections end, so that the workers left fail the
// step at once, naming the lost rank, and regroup over TCP; the next run makes the NCCL group of
// the new membership, and the Trainer takes the newest state through it (trainer/elastic.hpp).
// Every worker holds the whole state between steps (GPU workers do not share the update), so
// nothing is rebuilt. A process that joins through the job's door must be given its local rank by
// its launcher (the lost worker's GPU: cohort-run, torchrun, mpirun and Slurm give it), since the
// rendezvous would count it after the workers of its host and choose a GPU one of them drives. A
// worker whose process is stopped, or whose host is cut off, keeps its connections: the
// collective's timeout names it, as without elastic.
#pragma once

#include <nccl.h>

#include <chrono>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "cohort/cluster/cluster.hpp"
#include "cohort/collective/nccl.hpp"
#include "cohort/core/options.hpp"
#include "cohort/device/cuda.hpp"
#include "cohort/strategy/detail/local_gpu_cuda.hpp"
#include "cohort/strategy/detail/mirrored_replica.hpp"
#include "cohort/strategy/detail/replica_threads.hpp"
#include "cohort/strategy/detail/worker_membership.hpp"
#include "cohort/strategy/detail/worker_process.hpp"
#include "cohort/strategy/multi_worker_mirrored.hpp"
#include "cohort/strategy/strategy.hpp"
#include "cohort/transport/tcp/loss_watch.hpp"
#include "cohort/transport/tcp/tcp.hpp"

namespace cohort::strategy {

template <template <class> class CrossCollective, ProcessTransport Transport>
class MultiWorkerMirrored<device::Cuda, CrossCollective, Transport> {
 public:
  static constexpr std::string_view kName = "multi_worker_mirrored";
  using Device = device::Cuda;
  using Cross = CrossCollective<Transport>;
  using Communicator = collective::NcclCommunicator;
  using Replica = detail::MirroredReplica<Communicator, device::Cuda>;

  struct Options {
    cluster::Explicit cluster{};
    std::string bind_address{};
    std::string secret{};
    std::string listen_ports{};  // "LOW-HIGH" (or COHORT_PORT_RANGE); empty: any free port
    std::chrono::milliseconds connect_timeout{std::chrono::minutes(1)};
    std::chrono::milliseconds timeout{std::chrono::minutes(5)};
    std::size_t local_replicas = 1;
    Elastic elastic{};
  };

  // strategy::Regroups (strategy/elastic.hpp), over TCP.
  static constexpr bool kRegroups = std::same_as<Transport, transport::tcp::Tcp>;

  explicit MultiWorkerMirrored(Options options)
      : process_(std::move(options), {Role::kWorker, Role::kChief}, "MultiWorkerMirrored") {
    check(this->options(), cluster());
    detail::require_elastic_settings(this->options().elastic, cluster().size, kRegroups);
    if (this->options().elastic.joins_running_job && !cluster().local_given) {
      options::reject("elastic.joins_running_job", "true",
                      "needs this process's local rank from its launcher (LOCAL_RANK, "
                      "SLURM_LOCALID, OMPI_COMM_WORLD_LOCAL_RANK or COHORT_LOCAL_RANK; cohort-run "
                      "sets it): the GPU of the worker it takes the place of, where the "
                      "rendezvous would count it after the workers of its host");
    }
    started_workers_ = static_cast<std::size_t>(cluster().size);
    // The GPUs before the rendezvous where the launcher gives the local rank, so that a process
    // without them fails at once; where it gives none, the rendezvous does, and they come after.
    if (cluster().local_given) make_streams();
    const cluster::Spec& spec = cluster();
    cross_ = std::make_unique<Cross>(process_.template connect<Transport>(
        spec.rank, spec.size, cluster::describe(spec) + (streams_.empty() ? "" : ", " + gpus())));
    if constexpr (kRegroups) {
      joined_ = detail::started_membership(cross_->transport(), process_, door_);
    }
    try {
      process_.learn_local_ranks(*cross_, cluster().rank, 0);
      if (streams_.empty()) {
        make_streams();
        std::fprintf(stderr, "cohort: rank %d drives %s\n", cluster().rank, gpus().c_str());
      }
      require_same_local_replicas();
    } catch (const CommError& lost) {
      if (streams_.empty() || !construction_loss_.keep(lost, this->options().elastic)) throw;
      return;
    }
    open_door();
  }

  std::size_t replicas() const {
    return static_cast<std::size_t>(cluster().size) * local_replicas();
  }
  std::size_t local_replicas() const { return streams_.size(); }
  std::size_t first_local_replica() const {
    return static_cast<std::size_t>(cluster().rank) * local_replicas();
  }
  bool is_chief() const { return cluster().rank == 0; }
  // Trainer::save (strategy.hpp): the chief's outcome, to every process.
  std::string save_outcome(const std::filesystem::path& file,
                           std::string_view chief_failure) const {
    return detail::chief_save_outcome(*cross_, file, chief_failure);
  }
  const cluster::Spec& cluster() const { return process_.spec(); }
  const Options& options() const { return process_.options(); }

  // Local replica local_index's GPU and stream.
  device::cuda::Place place(std::size_t local_index) const {
    return streams_.at(local_index).place();
  }

  const Elastic& elastic() const requires kRegroups { return options().elastic; }

  // The workers that answer the roll call, as the job's next membership (detail/
  // worker_membership.hpp); the next run's NCCL group is theirs. Throws CommError below
  // min_workers.
  [[gnu::cold]] MembershipChange regroup(const CommError& cause) requires kRegroups {
    return detail::regroup_workers(
        cause, elastic(), door_, [this]() -> transport::tcp::Tcp& { return cross_->transport(); },
        [this](transport::tcp::Tcp next) { adopt(std::move(next)); });
  }

  // A process whose own failure ends its fit: the workers that regroup will not count it in.
  void withdraw() noexcept requires kRegroups { cross_->transport().stop_listening(); }

  // On the chief, at a vote: the processes at its door that the job takes in now, up to
  // elastic.max_workers (or the workers it started with); 0 on the others.
  std::size_t joiners_waiting() requires kRegroups {
    return door_.joiners(static_cast<std::size_t>(cluster().size), elastic(), started_workers_);
  }

  // Every process together, at the step boundary where the vote counted `joiners`.
  [[gnu::cold]] MembershipChange admit(std::size_t joiners) requires kRegroups {
    return detail::admit_workers(joiners, elastic(), door_, cross_->transport(),
                                 [this](transport::tcp::Tcp grown) { adopt(std::move(grown)); });
  }

  // Whether this process joined a running job through its door: its Trainer's first fit then
  // takes the job's newest state (trainer/elastic.hpp).
  bool joined() const requires kRegroups { return joined_; }

  template <class Body>
  void run(Body&& body) {
    construction_loss_.throw_kept();
    // A fresh NCCL group per run (a communicator that saw a failure stays aborted); every process
    // calls run once per fit, so the ids pair up.
    const ncclUniqueId id = collective::nccl_unique_id(*cross_);
    // This process's replicas fail together, at once, as Mirrored's do.
    const auto failure = std::make_shared<collective::nccl::GroupFailure>();
    {
      const std::optional<transport::tcp::LossWatch> watch = watch_for_loss(failure);
      run_replicas(id, failure, body);
    }
    // An elastic job's processes leave the run together: one that went on and ended while
    // another's replicas still ran would look lost to that one's watch.
    if constexpr (kRegroups) {
      if (elastic().enabled()) cross_->barrier();
    }
  }

 private:
  template <class Body>
  void run_replicas(const ncclUniqueId& id,
                    const std::shared_ptr<collective::nccl::GroupFailure>& failure, Body& body) {
    detail::run_replica_threads(
        local_replicas(),
        [&](std::size_t local_index) {
          const std::size_t index = first_local_replica() + local_index;
          try {
            const device::cuda::Place where = place(local_index);
            device::cuda::use(where.device);  // this thread drives that GPU from here on
            return Replica(index,
                           Communicator(id, static_cast<int>(index), static_cast<int>(replicas()),
                                        {.device = where.device,
                                         .stream = where.stream,
                                         .timeout = options().timeout,
                                         .setup_timeout = options().connect_timeout,
                                         .deterministic = true,
                                         .group = failure}),
                           where);
          } catch (...) {
            // The other replicas of this process wait in the group's set-up: release them.
            failure->raise("rank " + std::to_string(index) +
                           " aborted: " + what_of(std::current_exception()));
            throw;
          }
        },
        body);
  }

  // In an elastic job, for a run: a watch that fails this process's NCCL group (`failure`) at
  // once when another process's connections end, naming it; none otherwise.
  std::optional<transport::tcp::LossWatch> watch_for_loss(
      const std::shared_ptr<collective::nccl::GroupFailure>& failure) {
    if constexpr (kRegroups) {
      if (elastic().enabled()) {
        return std::optional<transport::tcp::LossWatch>(
            std::in_place, cross_->transport(), [failure, rank = cluster().rank](int lost) {
              failure->raise("rank " + std::to_string(lost) + " lost: its connection to rank " +
                             std::to_string(rank) + " ended (its process ended or left the job)");
            });
      }
    }
    return std::nullopt;
  }

  // The mesh of a new membership (regroup, admit): this process's rank and the job's size are
  // its, and it compares what a process that joins compares at its construction, in the same
  // order; the chief opens its door again. The GPUs stay.
  [[gnu::cold]] void adopt(transport::tcp::Tcp next) requires kRegroups {
    door_.close();
    process_.regrouped(next.rank(), next.size());
    cross_ = std::make_unique<Cross>(std::move(next));
    process_.learn_local_ranks(*cross_, cluster().rank, 0);
    require_same_local_replicas();
    open_door();
  }

  // On an elastic job's chief: its door (detail/job_door.hpp).
  [[gnu::cold]] void open_door() {
    if constexpr (kRegroups) {
      if (elastic().enabled()) door_.open(cross_->transport(), process_.spec(), process_.binding());
    }
  }

  // Validates the options and the cluster description.
  static void check(const Options& given, const cluster::Spec& spec) {
    options::require_positive("timeout", given.timeout.count());
    options::require_positive("local_replicas", given.local_replicas);
    const std::size_t total = static_cast<std::size_t>(spec.size) * given.local_replicas;
    if (total > cuda::kMaxTreeInputs) {
      options::reject("local_replicas", given.local_replicas,
                      "gives " + std::to_string(total) +
                          " GPUs in all; deterministic NCCL combines at most 64 "
                          "(cuda::kMaxTreeInputs)");
    }
  }

  // This process's GPUs (from its local rank; a ConfigError naming local_rank where one is
  // missing) and a stream on each.
  void make_streams() {
    const int count = static_cast<int>(options().local_replicas);
    const int first = detail::local_gpu(cluster(), "MultiWorkerMirrored<device::Cuda>", count);
    for (int gpu = first; gpu < first + count; ++gpu) streams_.emplace_back(gpu, options().timeout);
  }

  std::string gpus() const {
    const int first = streams_.front().place().device;
    const int count = static_cast<int>(streams_.size());
    return count == 1
               ? "GPU " + std::to_string(first)
               : "GPUs " + std::to_string(first) + " to " + std::to_string(first + count - 1);
  }

  // The NCCL group counts every process's GPUs: a process that counted otherwise would wait in
  // its set-up for ranks that never come.
  void require_same_local_replicas() {
    detail::require_same_across_processes(
        *cross_, "local_replicas", std::array{static_cast<std::int64_t>(local_replicas())},
        [](const std::array<std::int64_t, 1>& count) { return std::to_string(count[0]); },
        "every process of the job must drive as many GPUs");
  }

  detail::WorkerProcess<Options> process_;
  std::vector<device::cuda::Stream> streams_;  // local replica i's, on GPU first + i
  std::unique_ptr<Cross> cross_;
  std::size_t started_workers_ = 0;             // the job's size at the start
  bool joined_ = false;                         // joined(): through a door
  detail::ConstructionLoss construction_loss_;  // until the first run
  detail::JobDoor door_;                        // an elastic job's, on its chief
};

static_assert(Strategy<MultiWorkerMirrored<device::Cuda>>);
// Its capabilities (strategy.hpp).
static_assert(HasPlaces<MultiWorkerMirrored<device::Cuda>>);
static_assert(SpansProcesses<MultiWorkerMirrored<device::Cuda>>);
static_assert(SharesSaveOutcome<MultiWorkerMirrored<device::Cuda>>);
static_assert(ChecksGradient<MultiWorkerMirrored<device::Cuda>, float, optimizer::Sgd>);
static_assert(AbandonsStep<MultiWorkerMirrored<device::Cuda>>);
static_assert(LendsGradientStorage<MultiWorkerMirrored<device::Cuda>, float>);
static_assert(SnapshotsBetweenSteps<MultiWorkerMirrored<device::Cuda>, float>);
static_assert(Grows<MultiWorkerMirrored<device::Cuda>>);

}  // namespace cohort::strategy
