// MultiWorkerMirrored: between-graph replication, one process per worker, synchronous.
//
// Every worker process runs the same program with its own copy of the model and its own replicas
// (local_replicas threads, Mirrored inside the worker). Gradients are reduced hierarchically
// (collective/hierarchical.hpp): among the local replicas, then across workers over TCP bucket by
// bucket, the cross-worker reduction of one bucket overlapping the local reduction of the next,
// then back to every local replica. With the default collective::Deterministic every sum follows
// the canonical tree over all replicas, so 2 workers x 2 local replicas, 4 workers x 1 and
// Mirrored with 4 replicas in one process give the same bits.
// With one replica per worker, the workers share the optimizer's update out, each applying it to
// its own part of the parameters, with the bits of the whole: through shared memory in stripes
// (shared_memory, below); over TCP, under collective::Deterministic, to the elements each owns of
// the all-reduce, whose second half then gathers the new parameters instead of the gradient's sums
// (detail/owned_update.hpp, the sharded update over TCP), where the gradient is large enough
// (share_update_from_bytes, below) and the wire is float.
//
//   cohort::strategy::MultiWorkerMirrored<> strategy({.local_replicas = 2});
//   cohort::strategy::MultiWorkerMirrored<cohort::device::Cpu, cohort::collective::Ring> ring(...);
//   cohort::strategy::MultiWorkerMirrored<cohort::device::Cuda> gpus({});
//       // GPUs, one or several per process: strategy/multi_worker_mirrored_cuda.hpp (cohort::cuda)
//
// Template arguments: the device of the replicas (device::Cpu here), the collective between
// processes (collective::Deterministic, the default, or collective::Ring: faster on many hosts,
// its own bits), and the transport under it (transport::tcp::Tcp, the default; any
// ProcessTransport, such as a shaped or emulated one, can stand in: detail/worker_process.hpp).
//
// Who is who comes from the launcher (cluster/cluster.hpp: explicit options, COHORT_*,
// TF_CONFIG, torchrun, Open MPI, Slurm; docs/launching.md). Construction does the rendezvous: it
// returns once every worker is connected, or throws CommError naming the missing ranks.
//
// Options:
//   local_replicas   replica threads in this process (a power of two, the same on every worker);
//                    any number of workers up to micro_batches / local_replicas is dealt the
//                    micro-batches as the reduction's tree allows (core/sharding.hpp, Deal),
//                    with the bits of one replica
//   cluster          explicit overrides of what the launcher says
//   bind_address     where this process listens; unset (and COHORT_BIND_ADDRESS unset), the
//                    cluster description decides: this rank's own address in it, loopback for a
//                    loopback cluster (cluster/binding.hpp); the start-up line says which
//   secret           shared secret authenticating every connection (or COHORT_SECRET)
//   listen_ports     "LOW-HIGH": the ports the ranks other than 0 listen in, for a firewall (or
//                    COHORT_PORT_RANGE); empty: any free port
//   connect_timeout  the rendezvous deadline (left at its default: COHORT_CONNECT_TIMEOUT)
//   timeout          how long any collective may wait; past it, the error names the rank, the
//                    operation and its sequence number (left at its default: COHORT_TIMEOUT)
//   bucket_bytes     the unit of cross-worker reduction and of overlap: a bucket of the gradient
//                    starts its all-reduce as soon as the model has made it final
//                    (core/model.hpp, gradient readiness), while the backward pass goes on.
//                    Unset: default_bucket_bytes (256 KiB up to 8 workers, measured against
//                    64 KiB to 16 MiB: docs/benchmarks.md, "Bucket size"; 32 KiB a worker from 9),
//                    or a kMostBuckets-th of a gradient larger than kMostBuckets of those, except
//                    where the workers share memory and their replica threads have every
//                    CPU: then the whole gradient, once the backward pass ends (share_host_memory
//                    below)
//   communication_priority
//                    the scheduling of the thread that moves the buckets between processes
//                    (collective/communication_thread.hpp): kAuto (the default) real-time where
//                    this process may raise it and the workers do not share memory, else
//                    normal; kNormal; kRealtime, or a ConfigError (left at its default:
//                    COHORT_COMMUNICATION_PRIORITY)
//   shared_memory    where every worker process is on this host (the same boot, network and IPC
//                    namespaces and /dev/shm), whether they all-reduce through shared memory
//                    rather than over TCP: the same bits, a fraction of the CPU time, each
//                    worker's gradient sum kept in the segment and reduced where it lies
//                    (collective/deterministic.hpp, share_host_memory and share_buffer;
//                    docs/benchmarks.md, "Processes of one host"), and with one local replica
//                    the optimizer's update shared out in stripes (detail/mirrored_replica.hpp;
//                    by host, among the workers of each host).
//                    Default true; false on any worker turns it off for all (left at its default:
//                    COHORT_SHARED_MEMORY)
//   wire             the format the gradient crosses between processes in (collective/wire.hpp):
//                    kFloat32 (the default), or kBfloat16 (kFloat16), half the bytes, every sum
//                    of the canonical tree rounded to bfloat16 (float16) wherever it is computed,
//                    so that the bits still do not depend on the replica count (float models
//                    only; left at its default: COHORT_WIRE). collective::Ring rounds its sums
//                    alike, in its own order, but sends them as floats
//   share_update_from_bytes
//                    the gradient's size from which workers of one replica each share the
//                    optimizer's update out (above); under it each applies the whole, which costs
//                    a smaller model less. Unset: kShareStripesFromBytes (256 KiB) for stripes
//                    through shared memory, kShareOverTcpFromBytes (8 MiB) over TCP; 0: at every
//                    size (left unset: COHORT_SHARE_UPDATE_FROM, in bytes). Every worker must be
//                    given the same: a difference is a ConfigError on every worker, naming both,
//                    at construction and at each change of an elastic job's membership
//   elastic          the job goes on without a lost worker, down to elastic.min_workers
//                    (strategy/elastic.hpp; or COHORT_MIN_WORKERS): the workers left regroup
//                    over TCP (transport/tcp/regroup.hpp) and the Trainer retries the step, with
//                    the bits of a job that lost nobody. Where the update is shared out, each
//                    worker also keeps the state (its stripes every 16 steps, a copy of the
//                    whole as often as 1% of the step time allows: detail/keep_schedule.hpp),
//                    from which the workers left
//                    rebuild it, so that none of it is lost with a worker, and compute the steps
//                    since again (detail/kept_stripes.hpp): through shared memory its stripes
//                    (the shared buffer per worker grows from the gradient's size to 3 x the
//                    parameters + 2 x the optimizer state), over TCP and by host a copy of the
//                    whole state in its own memory (2 x the parameters + 2 x the optimizer
//                    state). A process started for the job meanwhile joins it at a step
//                    boundary, up to elastic.max_workers (or COHORT_MAX_WORKERS; default: the
//                    workers it started with), through rank 0's door (transport/tcp/door.hpp).
//                    Default: not elastic
//
// Only the chief (worker 0) prints progress and writes checkpoints; every worker returns from
// Trainer::save once the chief's file is complete, or fails with the chief's reason
// (save_outcome). A worker that fails closes its connections, and every other worker's step
// fails within the timeout naming it, unless the job is elastic.
#pragma once

#include <algorithm>
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
#include <vector>

#include "cohort/cluster/binding.hpp"
#include "cohort/cluster/cluster.hpp"
#include "cohort/collective/communication_thread.hpp"
#include "cohort/collective/deterministic.hpp"
#include "cohort/collective/hierarchical.hpp"
#include "cohort/collective/local.hpp"
#include "cohort/collective/wire.hpp"
#include "cohort/core/error.hpp"
#include "cohort/core/options.hpp"
#include "cohort/core/sharding.hpp"
#include "cohort/device/cpu.hpp"
#include "cohort/strategy/detail/job_door.hpp"
#include "cohort/strategy/detail/kept_stripes.hpp"
#include "cohort/strategy/detail/mirrored_replica.hpp"
#include "cohort/strategy/detail/replica_threads.hpp"
#include "cohort/strategy/detail/tcp_options.hpp"
#include "cohort/strategy/detail/worker_membership.hpp"
#include "cohort/strategy/detail/worker_process.hpp"
#include "cohort/strategy/strategy.hpp"
#include "cohort/transport/tcp/regroup.hpp"
#include "cohort/transport/tcp/tcp.hpp"

// Declared only, so that the sentence below can name it without a CUDA header.
namespace cohort::device {
struct Cuda;
}

namespace cohort::strategy {

// Host replicas. MultiWorkerMirrored<device::Cuda, ...> is a specialization of its own
// (strategy/multi_worker_mirrored_cuda.hpp).
template <device::Device D = device::Cpu,
          template <class> class CrossCollective = collective::Deterministic,
          ProcessTransport Transport = transport::tcp::Tcp>
class MultiWorkerMirrored {
  static_assert(!std::same_as<D, device::Cuda>,
                "cohort: MultiWorkerMirrored<device::Cuda> (replicas on GPUs) is defined in "
                "cohort/strategy/multi_worker_mirrored_cuda.hpp (cohort::cuda): include it.");
  static_assert(std::same_as<D, device::Cpu> || std::same_as<D, device::Cuda>,
                "cohort: MultiWorkerMirrored runs host replicas on device::Cpu, or replicas on "
                "GPUs on device::Cuda.");

 public:
  static constexpr std::string_view kName = "multi_worker_mirrored";
  using Cross = CrossCollective<Transport>;
  using Communicator = collective::Hierarchical<collective::LocalCommunicator, Cross>;
  static_assert(collective::Communicator<Communicator>);

  static constexpr std::size_t kBucketBytes = std::size_t{256} << 10;
  static constexpr std::size_t kLeastChunkBytes = std::size_t{32} << 10;
  // The gradient's size from which the workers share the update where
  // Options::share_update_from_bytes is unset: in stripes through shared memory, and over TCP.
  // Over TCP the all-reduce's second half, which gathers the new parameters, can only start once
  // a bucket's update is applied, after the backward pass, where the whole update's second half
  // overlaps the backward pass; and a step runs two or three collectives where it ran one. On 2
  // workers over TCP (docs/benchmarks.md, "Where the sharded update over TCP costs") it was
  // slower at 1.6 and 3.2 MB of gradient, no faster at 6.4 and 7.5 MB, and took less time a step at
  // 80 MB. Through shared memory a model of 2.4 KB lost, 0.4 to 1.6 MB neither won nor lost, and
  // the examples' MLP, 7.5 MB, gains (docs/benchmarks.md, "Processes of one host").
  static constexpr std::size_t kShareStripesFromBytes = std::size_t{256} << 10;
  static constexpr std::size_t kShareOverTcpFromBytes = std::size_t{8} << 20;

  // The bucket where Options::bucket_bytes is unset: kBucketBytes, or more over many workers. Over
  // n workers a bucket's all-reduce cuts it into chunks of B/n, and its messages, 2 log2(n) a
  // segment where it halves and doubles and 2 (n-1) otherwise, carry one each at the least;
  // keeping chunks of at least kLeastChunkBytes keeps the messages' latency from setting the time.
  // The cost model (docs/benchmarks.md, "The cost model") puts a step of 128 hosts x 8 workers on
  // 100 Gbit/s links, flat, at 246 ms with 256 KiB buckets and 163 ms with 32 MiB. The bits do
  // not depend on the bucket.
  static constexpr std::size_t default_bucket_bytes(int workers) {
    return std::max(kBucketBytes, static_cast<std::size_t>(workers) * kLeastChunkBytes);
  }
  // The most buckets a gradient is cut into where Options::bucket_bytes is unset. 2 workers over
  // TCP trained the MLP of 20M parameters (80 MB of gradient) 1.2x as fast in buckets of 1 to
  // 4 MiB as in 306 of 256 KiB (docs/benchmarks.md, "Bucket size"); a smaller model, up to 16 MiB
  // of gradient, keeps default_bucket_bytes.
  static constexpr std::size_t kMostBuckets = 64;

  struct Options {
    std::size_t local_replicas = 1;
    cluster::Explicit cluster{};
    std::string bind_address{};
    std::string secret{};
    std::string listen_ports{};  // "LOW-HIGH" (or COHORT_PORT_RANGE); empty: any free port
    std::chrono::milliseconds connect_timeout{std::chrono::minutes(1)};
    std::chrono::milliseconds timeout{std::chrono::minutes(5)};
    std::optional<std::size_t> bucket_bytes{};
    collective::ThreadPriority communication_priority = collective::ThreadPriority::kAuto;
    bool shared_memory = true;
    collective::Wire wire = collective::Wire::kFloat32;
    std::optional<std::size_t> share_update_from_bytes{};
    Elastic elastic{};
  };

  explicit MultiWorkerMirrored(Options options)
      : process_(std::move(options), {Role::kWorker, Role::kChief}, "MultiWorkerMirrored") {
    detail::require_local_replicas(this->options().local_replicas);
    if (this->options().bucket_bytes) {
      options::require_positive("bucket_bytes", *this->options().bucket_bytes);
    }
    const cluster::Spec& spec = process_.spec();
    detail::require_elastic_settings(this->options().elastic, spec.size, kRegroups);
    started_workers_ = static_cast<std::size_t>(spec.size);
    thread_ = process_.start_communication_thread();
    cross_ = std::make_unique<Cross>(
        process_.template connect<Transport>(spec.rank, spec.size, cluster::describe(spec)));
    if constexpr (kRegroups) {
      joined_ = detail::started_membership(cross_->transport(), process_, door_);
    }
    try {
      process_.learn_local_ranks(*cross_, cluster().rank, 0);
      require_same_share_update_from();
      // A process that joined comes last in rank order: the members and it take the order of
      // their hosts, where that lets them go by host (adopt).
      if (const int rank = share_host_memory(joined_); rank >= 0) {
        if constexpr (kRegroups) adopt(renumbered(rank));
        return;
      }
    } catch (const CommError& lost) {
      if (!construction_loss_.keep(lost, this->options().elastic)) throw;
      return;
    }
    open_door();
  }

  std::size_t replicas() const {
    return static_cast<std::size_t>(cluster().size) * local_replicas();
  }
  std::size_t local_replicas() const { return options().local_replicas; }
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
  // strategy::ChoosesGradientSum: the wire's (collective/wire.hpp).
  ReduceOp gradient_sum_op() const { return collective::gradient_sum(options().wire); }
  // The unit in which the replicas all-reduce the gradient while the backward pass goes on:
  // Options::bucket_bytes; default_bucket_bytes, or a kMostBuckets-th of a larger gradient; or
  // one bucket after the backward pass (share_host_memory).
  detail::BucketSize bucket() const { return bucket_; }

  using Replica = detail::MirroredReplica<Communicator>;

  // The gradient's size from which the workers share the update: Options::share_update_from_bytes,
  // or kShareStripesFromBytes and kShareOverTcpFromBytes.
  typename Replica::ShareFrom share_update_from() const {
    if (const auto chosen = options().share_update_from_bytes) {
      return {.stripes = *chosen, .owned = *chosen};
    }
    return {.stripes = kShareStripesFromBytes, .owned = kShareOverTcpFromBytes};
  }

  // The micro-batches each replica folds (strategy::FoldsAnyDeal): the local group folds this
  // worker's replicas as nodes of their counts, which together make the worker's node, and the
  // collective between workers folds the workers as nodes of theirs. collective::Ring adds in an
  // order of its own, so it keeps its own bits under any deal.
  void use_deal(const sharding::Deal& deal) {
    const auto mine = deal.counts().subspan(first_local_replica(), local_replicas());
    local_leaf_counts_.assign(mine.begin(), mine.end());
    if constexpr (collective::FoldsNodes<Cross>) {
      cross_->set_leaf_counts({deal.worker_counts().begin(), deal.worker_counts().end()});
    }
  }

  // strategy::Regroups (strategy/elastic.hpp), over TCP.
  static constexpr bool kRegroups = std::same_as<Transport, transport::tcp::Tcp>;
  const Elastic& elastic() const requires kRegroups { return options().elastic; }

  // The workers that answer the roll call, as the job's next membership: this process's
  // collective between workers is rebuilt over them, its rank and the job's size are theirs, and
  // through shared memory where they all share this host. A worker lost while they set that up
  // (another host going, a moment later) makes them call the roll again, from the new mesh.
  // Throws CommError below min_workers.
  [[gnu::cold]] MembershipChange regroup(const CommError& cause) requires kRegroups {
    keep_lost_stripes();  // also below min_workers, where this process saves what it kept
    return detail::regroup_workers(
        cause, elastic(), door_, [this]() -> transport::tcp::Tcp& { return cross_->transport(); },
        [this](transport::tcp::Tcp next) { adopt(std::move(next)); });
  }

  // strategy::KeepsStripes (detail/kept_stripes.hpp): after a regroup, whether this process's
  // state was spread over the lost membership's stripes; the newest step it knows every worker
  // kept (-1: none); that state rebuilt from the stripes in shared memory, or from this process's
  // own copy (every process together, where any was spread); and the kept memory let go.
  static constexpr bool kKeepsStripes = kRegroups && requires(Cross & cross) {
    cross.keep_shared_buffers();
  };
  bool stripes_spread() const requires kKeepsStripes { return lost_ && lost_->kept.spread; }
  std::int64_t kept_step() const requires kKeepsStripes {
    return lost_ && lost_->kept.complete ? static_cast<std::int64_t>(*lost_->kept.complete) : -1;
  }
  template <class T>
  void rebuild_from_kept_state(std::span<T> parameters, std::span<T> optimizer_state,
                               std::uint64_t steps) const requires kKeepsStripes {
    COHORT_ASSERT(lost_.has_value());
    if (lost_->buffers) {
      detail::rebuild_from_kept_state(lost_->kept, *lost_->buffers, parameters, optimizer_state,
                                      steps);
    } else {
      detail::rebuild_from_kept_state(lost_->kept, detail::OwnCopies{lost_->kept.own}, parameters,
                                      optimizer_state, steps);
    }
  }
  void forget_stripes() requires kKeepsStripes { lost_.reset(); }

  // A process whose own failure ends its fit: the workers that regroup will not count it in.
  void withdraw() noexcept requires kRegroups { cross_->transport().stop_listening(); }

  // On the chief, at a vote: the processes at its door that the job takes in now, up to
  // elastic.max_workers (or the workers it started with); 0 on the others. The door is polled
  // also while the job is full: strangers are refused as ever, and a process that proved itself
  // waits there, a standby that the job takes in once a worker is lost (or, at its deadline,
  // learns that it waited at the door of a running job).
  std::size_t joiners_waiting() requires kRegroups {
    return door_.joiners(static_cast<std::size_t>(cluster().size), elastic(), started_workers_);
  }

  // Every process together, at the step boundary where the vote counted `joiners`: the mesh of
  // the next epoch, with them after the members (the chief tells them their places).
  [[gnu::cold]] MembershipChange admit(std::size_t joiners) requires kRegroups {
    return detail::admit_workers(
        joiners, elastic(), door_, cross_->transport(),
        [this](transport::tcp::Tcp grown) { adopt(std::move(grown), true); });
  }

  // Whether this process joined a running job through its door, rather than starting with it:
  // its Trainer's first fit then takes the job's newest state (trainer/elastic.hpp).
  bool joined() const requires kRegroups { return joined_; }

  template <class Body>
  void run(Body&& body) {
    construction_loss_.throw_kept();
    collective::Local local({.ranks = static_cast<int>(local_replicas()),
                             .timeout = options().timeout,
                             .leaf_counts = local_leaf_counts_});
    detail::run_replica_threads(
        local_replicas(),
        [&](std::size_t local_index) {
          return Replica(first_local_replica() + local_index,
                         Communicator(local.communicator(static_cast<int>(local_index)), *cross_,
                                      *thread_, configured_bucket().bytes),
                         {},
                         {.bucket = bucket_,
                          .kept = options().elastic.enabled() ? &kept_ : nullptr,
                          .gradient_sum = gradient_sum_op(),
                          .share_update_from = share_update_from()});
        },
        body);
  }

 private:
  // Where every worker is on this host, their all-reduce goes through shared memory
  // (collective/deterministic.hpp, share_host_memory). It is CPU work then, not a wait on a
  // network, so the communication thread needs no real-time priority (kAuto drops it), and where
  // the workers' replica threads have every CPU the job may use on this host, overlapping it with
  // the backward pass only moves it there, with a switch between the threads at every bucket:
  // the gradient then goes as one bucket once the backward pass ends. On 2 cores, 2 workers of
  // the examples' MLP trained 14,954 examples/s that way, 14,468 in 256 KiB buckets during the
  // backward pass and 12,819 with those at real-time priority (docs/benchmarks.md, "Processes of
  // one host"). A program that sets bucket_bytes keeps its buckets.
  // The mesh of a new membership (regroup, admit): this process's rank and the job's size are
  // its, the communication thread is new (the old one's failure stays with it), the local ranks
  // and shared memory are learned again, and the chief opens its door again. A grown mesh
  // (`reorders`) has its joiners last in rank order, so a worker started again on a host of
  // several comes apart from its host's others: where the ranks in the order of their hosts could
  // go by host, every rank takes its place in that order (tcp::renumber, rank 0 keeping its own).
  // The deal of micro-batches follows the ranks, so the bits do not change. A regrouped mesh keeps
  // its members' order, which the newest state's agreement counts on (trainer/elastic.hpp).
  [[gnu::cold]] void adopt(transport::tcp::Tcp next, bool reorders = false) requires kRegroups {
    kept_ = {};
    door_.close();
    process_.regrouped(next.rank(), next.size());
    thread_.reset();
    cross_ = std::make_unique<Cross>(std::move(next));
    thread_ = process_.start_communication_thread();
    process_.learn_local_ranks(*cross_, cluster().rank, 0);
    require_same_share_update_from();
    bucket_ = configured_bucket();
    if (const int rank = share_host_memory(reorders); rank >= 0) {
      adopt(renumbered(rank));
      return;
    }
    open_door();
  }

  // Workers that chose other sizes from which to share the update would call other collectives at
  // the first step, or in an elastic job regroup and meet the difference again at every retry:
  // each membership (construction, adopt) compares them first, and a difference is a ConfigError
  // on every worker. The construction of a process that joins and the members' adoption of the
  // mesh it joins run the same collectives in the same order.
  void require_same_share_update_from() {
    // Whether it was given, and its bytes.
    const std::optional<std::size_t> given = options().share_update_from_bytes;
    detail::require_same_across_processes(
        *cross_, "share_update_from_bytes",
        std::array{std::int64_t{given.has_value()}, static_cast<std::int64_t>(given.value_or(0))},
        [](const std::array<std::int64_t, 2>& setting) {
          return setting[0] != 0 ? std::to_string(setting[1]) + " bytes" : std::string("none");
        },
        "every worker must be given the same (or COHORT_SHARE_UPDATE_FROM)");
  }

  // The mesh again, this process at `rank` (adopt).
  [[gnu::cold]] transport::tcp::Tcp renumbered(int rank) requires kRegroups {
    if (rank == 0) {
      std::fprintf(stderr,
                   "cohort: rank 0: the workers take the order of their hosts, so that they "
                   "all-reduce by host\n");
    }
    return transport::tcp::renumber(cross_->transport(), rank, elastic().probe_timeout);
  }

  // Before the roll call: what this membership's replicas kept of the state, and its shared
  // memory, where they kept stripes there. Stripes an earlier regroup kept stay, where the job has
  // not taken its state from them (forget_stripes): a worker was lost while it did, and they still
  // hold the newest state every worker kept, which this process's own may be spread over.
  [[gnu::cold]] void keep_lost_stripes() requires kRegroups {
    if (lost_) return;
    if constexpr (kKeepsStripes) {
      if (kept_.layout.parameters == 0) return;
      if (!kept_.own.empty()) {
        lost_.emplace(LostStripes{std::move(kept_), std::nullopt});
      } else if (std::optional<collective::SharedBuffers> buffers = cross_->keep_shared_buffers()) {
        lost_.emplace(LostStripes{std::move(kept_), std::move(*buffers)});
      }
    }
  }

  // On an elastic job's chief: its door (detail/job_door.hpp).
  [[gnu::cold]] void open_door() {
    if constexpr (kRegroups) {
      if (elastic().enabled()) door_.open(cross_->transport(), process_.spec(), process_.binding());
    }
  }

  // Where `reorders` and the workers could go by host in another order, nothing is shared: this
  // process's rank in that order (adopt); -1 otherwise.
  [[gnu::cold]] int share_host_memory(bool reorders = false) {
    if constexpr (requires { cross_->share_host_memory(true, {}); }) {
      const bool realtime =
          options().communication_priority == collective::ThreadPriority::kRealtime;
      const auto sharing = cross_->share_host_memory(
          options().shared_memory,
          realtime ? std::chrono::microseconds(0) : transport::tcp::Options{}.spin);
      if (reorders && sharing.rank_by_host >= 0) return sharing.rank_by_host;
      use_sharing(sharing, realtime);
    }
    return -1;
  }

  // What share_host_memory found, said by the chief (or by each rank where a host's memory could
  // not be shared), and the buckets and priority it calls for.
  template <class HostSharing>
  [[gnu::cold]] void use_sharing(const HostSharing& sharing, bool realtime) {
    const cluster::Spec& spec = process_.spec();
    if (!sharing.shared) {
      if (!sharing.why_not.empty() && (sharing.hosts == 1 || spec.rank == 0)) {
        std::fprintf(stderr,
                     "cohort: rank %d: the worker processes of %s all-reduce over TCP, since "
                     "%s\n",
                     spec.rank, sharing.hosts == 1 ? "this host" : "each host",
                     (sharing.hosts == 1 ? "shared memory failed: " + sharing.why_not
                                         : "they cannot go by host: " + sharing.why_not)
                         .c_str());
      }
      return;
    }
    // Across hosts the all-reduce waits on the network: buckets overlap it with the backward
    // pass, as over TCP.
    if (sharing.hosts > 1) {
      if (spec.rank == 0) {
        std::fprintf(stderr,
                     "cohort: the %d worker processes of each of %d hosts all-reduce through "
                     "shared memory, and between the hosts each over TCP for its part of the "
                     "gradient\n",
                     spec.size / sharing.hosts, sharing.hosts);
      }
      return;
    }
    if (!realtime) thread_->run_at_normal_priority();
    const int cpus = detail::cpus_of_host(*cross_);
    const std::size_t replica_threads = replicas();
    const bool overlap =
        options().bucket_bytes.has_value() || static_cast<std::size_t>(cpus) > replica_threads;
    if (!overlap) bucket_ = {};
    if (spec.rank != 0) return;
    std::fprintf(stderr,
                 "cohort: the %d worker processes of this host all-reduce through shared "
                 "memory, %s (%zu replica threads, %d CPUs)\n",
                 spec.size, bucket_.describe().c_str(), replica_threads, cpus);
  }

  detail::BucketSize configured_bucket() const {
    if (const auto chosen = options().bucket_bytes) return {.bytes = *chosen};
    return {.bytes = default_bucket_bytes(cluster().size), .most = kMostBuckets};
  }

  detail::WorkerProcess<Options> process_;
  // The replicas' buckets: share_host_memory may make them one.
  detail::BucketSize bucket_ = configured_bucket();
  std::unique_ptr<Cross> cross_;
  std::unique_ptr<collective::CommunicationThread> thread_;  // after cross_: stopped before it
  std::vector<std::size_t> local_leaf_counts_;               // use_deal; empty: one each
  std::size_t started_workers_ = 0;                          // the job's size at the start
  bool joined_ = false;                                      // joined(): through a door
  detail::ConstructionLoss construction_loss_;               // until the first run
  detail::JobDoor door_;                        // an elastic job's, on its chief
  // An elastic job's: what this process's replica keeps of its stripes in this membership, and
  // after a regroup, the lost membership's (kept_stripes.hpp).
  detail::KeptStripes kept_{};
  struct LostStripes {
    detail::KeptStripes kept;
    std::optional<collective::SharedBuffers> buffers;  // none: kept.own
  };
  std::optional<LostStripes> lost_;
};

static_assert(Strategy<MultiWorkerMirrored<>>);
// Its capabilities (strategy.hpp).
static_assert(SpansProcesses<MultiWorkerMirrored<>>);
static_assert(SharesSaveOutcome<MultiWorkerMirrored<>>);
static_assert(ChecksGradient<MultiWorkerMirrored<>, float, optimizer::Sgd>);
static_assert(AbandonsStep<MultiWorkerMirrored<>>);
static_assert(LendsGradientStorage<MultiWorkerMirrored<>, float>);
static_assert(SnapshotsBetweenSteps<MultiWorkerMirrored<>, float>);
static_assert(FoldsAnyDeal<MultiWorkerMirrored<>>);
static_assert(Grows<MultiWorkerMirrored<>>);
static_assert(ChoosesGradientSum<MultiWorkerMirrored<>>);
static_assert(KeepsStripes<MultiWorkerMirrored<>, float>);

}  // namespace cohort::strategy

#if defined(COHORT_SEPARATE_COMPILATION)
namespace cohort::collective {
COHORT_INSTANTIATED class detail::OverTransport<transport::tcp::Tcp>;
COHORT_INSTANTIATED class Deterministic<transport::tcp::Tcp>;
COHORT_INSTANTIATED void Deterministic<transport::tcp::Tcp>::all_reduce<float>(std::span<float>,
                                                                               ReduceOp);
COHORT_INSTANTIATED void Deterministic<transport::tcp::Tcp>::all_reduce<double>(std::span<double>,
                                                                                ReduceOp);
COHORT_INSTANTIATED class Hierarchical<LocalCommunicator, Deterministic<transport::tcp::Tcp>>;
COHORT_INSTANTIATED void Hierarchical<LocalCommunicator, Deterministic<transport::tcp::Tcp>>::
    all_reduce<float>(std::span<float>, ReduceOp);
COHORT_INSTANTIATED void Hierarchical<LocalCommunicator, Deterministic<transport::tcp::Tcp>>::
    all_reduce<double>(std::span<double>, ReduceOp);
COHORT_INSTANTIATED Pending Hierarchical<LocalCommunicator, Deterministic<transport::tcp::Tcp>>::
    start_all_reduce<float>(std::span<float>, ReduceOp);
COHORT_INSTANTIATED void Hierarchical<LocalCommunicator, Deterministic<transport::tcp::Tcp>>::
    broadcast<float>(std::span<float>, int);
COHORT_INSTANTIATED void Hierarchical<LocalCommunicator, Deterministic<transport::tcp::Tcp>>::
    broadcast<double>(std::span<double>, int);
}  // namespace cohort::collective
namespace cohort::strategy {
COHORT_INSTANTIATED class MultiWorkerMirrored<>;
}  // namespace cohort::strategy
#endif
