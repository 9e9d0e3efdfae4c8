// ParameterServer: the parameters live, sharded, on server processes; worker processes compute
// gradients, push them and pull the new parameters. Synchronous, asynchronous or with bounded
// staleness (strategy/consistency.hpp): one implementation, one number K.
//
//   cohort::strategy::ParameterServer<cohort::strategy::consistency::Sync> strategy({});
//   cohort::Trainer trainer(model, std::move(strategy), optimizer, options);
//   trainer.fit(data, {.epochs = 5});   // on a server: serves until every worker is done
//
// Roles come from the launcher (cluster/cluster.hpp): TF_CONFIG's "ps" tasks serve, its "chief"
// and "worker" tasks train; or COHORT_ROLE = ps | worker with COHORT_PS_COUNT and
// COHORT_WORKER_COUNT (cohort-run --ps N sets them). The same program runs every role. All
// processes form one TCP mesh: workers are ranks 0 .. W-1 (the chief, worker 0, is rank 0 and
// hosts the rendezvous), servers are ranks W .. W+S-1. Construction is the rendezvous.
//
// Each worker process runs local_replicas replica threads (Mirrored inside the worker):
// replicas() = W x local_replicas. The Trainer deals each worker a node of the canonical tree over
// a step's micro-batches (core/sharding.hpp, Deal: 8 over 3 workers are 2, 2 and 4), split among
// its replicas (strategy::FoldsAnyDeal). A worker's replicas sum their gradients among themselves,
// each a node of its micro-batches, which together make the worker's node; its first replica
// pushes the sum, saying how many micro-batches it sums, and shares the parameters it pulls. Any
// worker count up to micro_batches gives, under Sync, the bits of one replica.
//
// One step, on a worker: the Trainer folds the worker's micro-batches (Update::gradient_sum). The
// chunks of the layout (parameter_server/protocol.hpp has the layout and the protocol) are the
// buckets of the fold, taken from its end: as soon as every element of a chunk is final
// (replica.gradients_ready, while the model's backward pass goes on when it reports readiness,
// core/model.hpp), the worker's replicas sum it and the first pushes it, on the worker's
// communication thread. replica.finish_step() pushes what is left and pulls every chunk, in the
// order of the pushes; a server answers a pull once the worker's pushes have settled (below).
// On a server, per chunk:
//   Sync (K = 0)     the W pushes of a step are summed in the canonical tree over its
//                    micro-batches, each push a node of its worker's
//                    (core/reduction_tree.hpp), scaled by 1 / global batch and given to the
//                    optimizer with step = step + 1, as detail/mirrored_replica.hpp does: the
//                    parameters are the same bits as Mirrored and MultiWorkerMirrored with the
//                    same seed and micro_batches (the optimizer is elementwise, so a chunk updates
//                    with the bits of the whole vector).
//   K >= 1, Async    each push is applied on arrival, exactly once, scaled by 1 / global batch
//                    (a push is one worker's share of a batch); the pull's answer, a whole
//                    version of the chunk, waits while its worker is more than K steps ahead of
//                    the slowest live worker. Adam's step counts the chunk's updates.
// A Sync pull waits for the step's aggregate. The bits do not depend on when a chunk was pushed.
// The optimizer state lives on the servers. At the start of every fit the chief sends its
// parameters and optimizer state to the servers, and every worker pulls; at its end the chief
// pulls the optimizer state back (so that the next fit starts from it) and every server keeps its
// shard. A server runs no replica: its Trainer builds no model, and it needs no device (with
// ParameterServer<C, device::Cuda>, strategy/parameter_server_cuda.hpp, the workers' replicas are
// on GPUs and their pushes and pulls are staged through the host). Trainer::save then writes a
// sharded checkpoint: every server its shard, the chief the manifest last
// (parameter_server/sharded_save.hpp); Trainer::restore on every process reads the manifest and
// the shards and continues the run (the same bits, for Sync). A sharded checkpoint restores under
// any strategy, and any checkpoint restores under ParameterServer.
//
// The third template argument is the transport between the processes: transport::tcp::Tcp by
// default; any strategy::ProcessTransport that also models transport::Serving can stand in
// (strategy/detail/worker_process.hpp).
//
// Faults. A worker that dies, or stays silent for `timeout` while a server waits on it (stopped,
// hung, or stalled in the middle of a request), is reported by the servers by name; Async and
// BoundedStaleness go on without it (the bound counts live workers only); Sync fails with an
// error naming it unless backup workers cover it or the job is elastic (below), and every worker
// waiting on a server receives that error (parameter_server/server.hpp has the rules). A server
// takes each request only once it has arrived whole, so a worker stalled in the middle of a frame
// holds back no other worker. A server that dies makes every worker's next push or pull fail naming
// it ("parameter server 1 (rank 5)"); one that stops answering, within 3/2 x `timeout` (a worker
// waits longer than a server, so that the server names a stalled worker first): restart the job
// from the last checkpoint.
//
// Workers started again (Async and BoundedStaleness with Options::elastic). A worker other than
// the chief whose process is lost may be started again with the environment it had and
// COHORT_JOIN=1 (cohort-run --min-np M --max-restarts K does it): it gets the job's addresses at
// the chief's door (transport/tcp/door.hpp; polled before each of the chief's steps), takes its
// place back at every server (transport::tcp::Tcp::readmit), and its fit goes on from the step
// after its last push (parameter_server/server.hpp): none of its examples is lost or pushed
// twice. The chief, its own steps done, tends its door until every other worker has ended its
// fit (or stayed lost for elastic.probe_timeout), then pulls the parameters and the optimizer
// state: the fit's result holds every worker's pushes. The servers end the fit once fewer than
// elastic.min_workers workers are live. A lost chief or server is not taken back: the chief holds
// the door and brings the optimizer state home, a server its shard.
//
// A synchronous job that goes on without a lost worker (Sync with Options::elastic; strategy::
// Regroups). A server that loses a worker tells every process why as it leaves the mesh; the
// workers abandon the step in flight, and every process left, servers included, meets at the
// regroup's roll call (transport/tcp/regroup.hpp) as the job's next membership: the workers in
// the order of their ranks, then the servers. The Trainer deals the step's micro-batches over the
// workers left and retries it (trainer/elastic.hpp). The servers hold the state: the chief does not
// send its own at the retry's start, and every worker pulls the parameters after the steps the
// job applied, which a server keeps for a chunk that took the retried step already
// (parameter_server/server.hpp). The reduction tree does not depend on the deal, so the
// parameters are the bits of a job that lost nobody. Any worker may be lost, the chief included
// (the lowest worker left is the next one). A server is not: its shard is gone, and every
// process fails naming it (cohort-run --max-restarts starts the job again whole). Below
// min_workers every process fails as a job without elastic does. A process started for the job
// (a lost worker's, started again with COHORT_JOIN=1, as cohort-run --max-restarts does) is taken
// in at a step boundary (strategy::Grows), as elastic MultiWorkerMirrored takes one
// (strategy/elastic.hpp): it waits at the chief's door, the workers' vote counts it, their segment
// ends (the chief brings the optimizer state home), the chief tells the servers
// (parameter_server/admission.hpp), and every process forms the grown mesh, the new worker after
// the others. The next segment starts from the chief's state, as every segment does. Where the
// chief was lost, the next one keeps the door (detail/job_door.hpp), where a process started again
// for any worker, the chief's too, is taken in.
//
// Settings. Before its first step every worker presents the Trainer's settings to every server,
// which compares them with its own and the chief's (trainer/job_settings.hpp;
// parameter_server/protocol.hpp): a server or a worker of any consistency started with other
// settings stops the job with a ConfigError that names the field and both values.
//
// Options:
//   local_replicas   replica threads in each worker process (a power of two, the same on every
//                    worker)
//   cluster          explicit overrides of what the launcher says
//   bind_address     where this process listens (or COHORT_BIND_ADDRESS); unset, the cluster
//                    description decides (cluster/binding.hpp): the own address, loopback for a
//                    loopback cluster
//   secret           shared secret authenticating every connection (or COHORT_SECRET)
//   listen_ports     "LOW-HIGH": the ports the ranks other than 0 listen in, for a firewall (or
//                    COHORT_PORT_RANGE); empty: any free port
//   connect_timeout  the rendezvous deadline (left at its default: COHORT_CONNECT_TIMEOUT)
//   timeout          how long a server waits on a silent worker before it counts it as lost
//                    (twice that when every worker went quiet at once); a worker's transfers
//                    (its pushes and pulls, where a bounded-staleness worker may wait for the
//                    slowest one, and under Sync the collectives between workers) may stall for
//                    3/2 x timeout (left at its default: COHORT_TIMEOUT)
//   min_shard_bytes  a shard holds at least this many bytes (so a small model uses few servers)
//   alignment        shard boundaries are multiples of this many elements
//   chunk_bytes      the unit of a request, so that push, update and pull pipeline, and of
//                    a push started during the backward pass
//   backup_workers   Sync only: a step needs the W - backup_workers lowest-indexed live workers
//                    (each worker dealt as many micro-batches: micro_batches = W x 2^k)
//   log_pushes       servers print a line per push applied to their first chunk
//   elastic          Async and BoundedStaleness: elastic.min_workers (or COHORT_MIN_WORKERS) > 0
//                    lets a lost worker's process started again take its place back (above), and
//                    ends the fit below that many live workers; elastic.joins_running_job (or
//                    COHORT_JOIN=1) on the process started again; elastic.probe_timeout, how long
//                    the chief, done, waits for a lost worker to come back. Sync: the job goes on
//                    without a lost worker down to elastic.min_workers, and takes processes
//                    started for it in, up to elastic.max_workers (above; with backup_workers,
//                    the micro-batches dealt in the shares of the W workers the job started
//                    with, whatever its membership, and below W - backup_workers workers several
//                    shares to a worker: parameter_server/server.hpp); elastic.probe_timeout
//                    bounds the regroup's roll call
//   wire             the format a push crosses in (collective/wire.hpp): kFloat32 (the default),
//                    or kBfloat16 (kFloat16), half the bytes: every sum of the canonical tree
//                    rounded to bfloat16 (float16), in each worker's fold, between its replicas
//                    and on the servers, so that under Sync the bits are MultiWorkerMirrored's
//                    with the same wire on any worker and replica count (float models with
//                    replicas on the host only; left at its default: COHORT_WIRE). Pulls carry
//                    the parameters in their own type
//   communication_priority
//                    a worker's communication thread, which pushes chunks while the backward
//                    pass goes on (collective/communication_thread.hpp): kNormal (the default);
//                    kAuto, real-time where this process may raise it; kRealtime, or a
//                    ConfigError (left at its default: COHORT_COMMUNICATION_PRIORITY). Normal,
//                    unlike MultiWorkerMirrored's: a real-time worker thread gained nothing
//                    between hosts, where the servers' links bound a step, and cost 4 to 10% of
//                    examples/s where servers and workers share a host (docs/benchmarks.md,
//                    "Overlap across hosts")
//
// Global-norm clipping (the optimizer's max_gradient_norm): under Sync the servers clip each
// step's aggregate by its global norm, the same bits as the mirrored strategies (alignment and
// chunk_bytes must then keep the norm's 4096-element blocks whole; ConfigError otherwise); under
// Async and BoundedStaleness each worker clips its own push by the push's own norm, which needs
// the whole gradient: there every push waits for finish_step, nothing overlaps the backward pass.
#pragma once

#include <algorithm>
#include <chrono>
#include <concepts>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>
#include <variant>
#include <vector>

#include "cohort/checkpoint/checkpoint.hpp"
#include "cohort/cluster/cluster.hpp"
#include "cohort/collective/communication_thread.hpp"
#include "cohort/collective/deterministic.hpp"
#include "cohort/collective/hierarchical.hpp"
#include "cohort/collective/local.hpp"
#include "cohort/collective/wire.hpp"
#include "cohort/core/error.hpp"
#include "cohort/core/options.hpp"
#include "cohort/core/reduce_op.hpp"
#include "cohort/core/settings.hpp"
#include "cohort/core/trace.hpp"
#include "cohort/device/cpu.hpp"
#include "cohort/strategy/consistency.hpp"
#include "cohort/strategy/detail/gradient_buckets.hpp"
#include "cohort/strategy/detail/job_door.hpp"
#include "cohort/strategy/detail/replica_threads.hpp"
#include "cohort/strategy/detail/staged_communicator.hpp"
#include "cohort/strategy/detail/worker_process.hpp"
#include "cohort/strategy/elastic.hpp"
#include "cohort/strategy/parameter_server/admission.hpp"
#include "cohort/strategy/parameter_server/client.hpp"
#include "cohort/strategy/parameter_server/communicators.hpp"
#include "cohort/strategy/parameter_server/protocol.hpp"
#include "cohort/strategy/parameter_server/server.hpp"
#include "cohort/strategy/parameter_server/sharded_save.hpp"
#include "cohort/strategy/strategy.hpp"
#include "cohort/transport/tcp/regroup.hpp"
#include "cohort/transport/tcp/tcp.hpp"

namespace cohort::strategy {

namespace detail::ps {
// Where a worker process's replica lives, what owns it there, and the host memory its data is
// staged through (Staging: resize(bytes), data()): nothing on the host, where nothing is staged;
// a stream on the worker's GPU and page-locked memory for device::Cuda
// (strategy/parameter_server_cuda.hpp). make_current() makes the place the calling thread's own
// (the worker's GPU, on a replica's thread before anything runs there); timeout bounds how long
// the place's end waits for its work.
template <class D>
class WorkerPlace;

template <>
class WorkerPlace<device::Cpu> {
 public:
  using Staging = std::vector<std::byte>;
  WorkerPlace(const cluster::Spec& /*spec*/, std::chrono::milliseconds /*timeout*/) {}
  device::Cpu::Place place() const { return {}; }
  void make_current() const {}
};
}  // namespace detail::ps

template <class C = consistency::Sync, device::Device D = device::Cpu,
          ProcessTransport TransportPolicy = transport::tcp::Tcp>
class ParameterServer {
  static_assert(consistency::Consistency<C>,
                "cohort: ParameterServer takes a consistency model: consistency::Sync, "
                "consistency::Async or consistency::BoundedStaleness<K>. See "
                "include/cohort/strategy/consistency.hpp.");

 public:
  static constexpr std::string_view kName = "parameter_server";
  static constexpr std::uint64_t kStaleness = C::kStaleness;
  using Transport = TransportPolicy;
  static_assert(transport::Serving<Transport>,
                "cohort: ParameterServer's servers take requests in arrival order: its transport "
                "must model transport::Serving (wait_any), as transport::tcp::Tcp does.");
  // Sync: over every replica of every worker, in the canonical tree (the workers' local replicas
  // first, as MultiWorkerMirrored). Otherwise a worker never waits for the others.
  using Cross = collective::Deterministic<ps::WorkerView<Transport>>;
  using HostCommunicator =
      std::conditional_t<kStaleness == 0,
                         collective::Hierarchical<collective::LocalCommunicator, Cross>,
                         ps::Independent<Transport>>;
  // The device of the workers' replicas: their gradients are staged to the host for the push and
  // the parameters copied back after the pull (servers work on the host and need no device).
  using Device = D;
  static constexpr bool kOnHost = std::same_as<D, device::Cpu>;
  using Communicator = std::conditional_t<kOnHost, HostCommunicator,
                                          detail::StagedCommunicator<HostCommunicator, D>>;

  struct Options {
    std::size_t local_replicas = 1;
    cluster::Explicit cluster{};
    std::string bind_address{};
    std::string secret{};
    std::string listen_ports{};  // "LOW-HIGH" (or COHORT_PORT_RANGE); empty: any free port
    std::chrono::milliseconds connect_timeout{std::chrono::minutes(1)};
    std::chrono::milliseconds timeout{std::chrono::minutes(5)};
    std::size_t min_shard_bytes = std::size_t{256} << 10;
    std::size_t alignment = device::cpu::kNormBlock;
    std::size_t chunk_bytes = std::size_t{1} << 20;
    std::size_t backup_workers = 0;
    bool log_pushes = false;
    collective::ThreadPriority communication_priority = collective::ThreadPriority::kNormal;
    collective::Wire wire = collective::Wire::kFloat32;
    Elastic elastic{};
  };

  explicit ParameterServer(Options options)
      : process_(std::move(options), {Role::kWorker, Role::kChief, Role::kParameterServer},
                 "ParameterServer") {
    workers_ = cluster::worker_count(cluster());
    servers_ = cluster::parameter_server_count(cluster());
    if (servers_ <= 0) {
      options::reject("parameter servers", servers_,
                      "a ParameterServer job needs at least one ps task (TF_CONFIG \"ps\", or "
                      "COHORT_PS_COUNT; cohort-run --ps N) (" +
                          cluster().source + ")");
    }
    if (workers_ <= 0) {
      options::reject("workers", workers_, "a ParameterServer job needs at least one worker");
    }
    detail::require_local_replicas(this->options().local_replicas);
    if (!kOnHost && this->options().local_replicas != 1) {
      options::reject("local_replicas", this->options().local_replicas,
                      "must be 1 for replicas on a device: a worker process drives the one GPU "
                      "at its local_rank");
    }
    options::require_positive("chunk_bytes", this->options().chunk_bytes);
    options::require_positive("alignment", this->options().alignment);
    if (kStaleness != 0 && this->options().backup_workers != 0) {
      options::reject("backup_workers", this->options().backup_workers,
                      "applies to consistency::Sync only (the others never wait for a step)");
    }
    if (!kOnHost && this->options().wire != collective::Wire::kFloat32) {
      options::reject("wire", collective::name(this->options().wire),
                      "is for workers whose replicas are on the host: a GPU worker's gradient "
                      "sums in float");
    }
    if (this->options().backup_workers >= static_cast<std::size_t>(workers_)) {
      options::reject("backup_workers", this->options().backup_workers,
                      "must be less than the " + std::to_string(workers_) + " workers");
    }
    check_elastic();
    // A worker's device first: a process without its GPU fails before the rendezvous.
    // (Where the launcher gives no local rank, the rendezvous does: the device comes after it.)
    if (!serves() && cluster().local_given)
      worker_place_.emplace(cluster(), this->options().timeout);
    if (!serves()) thread_ = process_.start_communication_thread();
    const int rank = serves() ? workers_ + cluster().rank : cluster().rank;
    // A worker waits longer than a server waits on a silent worker, so that the server, which
    // knows who stalled, speaks first (parameter_server/server.hpp).
    transport_ = std::make_unique<Transport>(process_.template connect<Transport>(
        rank, workers_ + servers_,
        cluster::describe(cluster()) + "; parameter server job: " + std::to_string(servers_) +
            " server(s), " + std::to_string(workers_) + " worker(s), " + std::string(C::kName) +
            ", rank " + std::to_string(rank) + " of the mesh",
        serves() ? std::nullopt : std::optional(worker_transfer_timeout(this->options().timeout)),
        rejoined() ? server_ranks() : std::vector<int>{}));
    started_workers_ = static_cast<std::size_t>(workers_);
    // A process that joins a running job (it takes its place back at the servers, or the job
    // takes it in) does not meet every process at once: the launcher's local rank, or 0.
    if (!this->options().elastic.joins_running_job) {
      collective::Deterministic<ps::WorkerView<Transport>> everyone(
          ps::WorkerView<Transport>(*transport_, workers_ + servers_));
      process_.learn_local_ranks(everyone, rank, serves() ? 1 : 0);
    }
    if (!serves() && !worker_place_) worker_place_.emplace(cluster(), this->options().timeout);
    if (serves()) transport_->isolate_peer_failures();
    if constexpr (kRegroups) {
      // A job starts at epoch 0: a later one is the grown mesh a running job's door gave this
      // process, at the end of its order, where it takes its place among the workers.
      joined_ = transport_->options().epoch > 0;
      if (joined_) {
        transport_ = std::make_unique<Transport>(transport::tcp::renumber(
            *transport_, transport_->rank() - servers_, this->options().elastic.probe_timeout));
        workers_ = transport_->size() - servers_;
        process_.regrouped(transport_->rank(), workers_);
      }
    }
    door_.started(is_chief());
    open_door();
  }

  // strategy::TakesWorkersBack (strategy.hpp), over TCP under Async and BoundedStaleness.
  static constexpr bool kTakesWorkersBack =
      kStaleness != 0 && std::same_as<Transport, transport::tcp::Tcp>;
  // strategy::Regroups, over TCP under Sync: the job goes on without a lost worker.
  static constexpr bool kRegroups = kStaleness == 0 && std::same_as<Transport, transport::tcp::Tcp>;
  const Elastic& elastic() const requires(kTakesWorkersBack || kRegroups) {
    return options().elastic;
  }

  // Every process of the job, servers included, once a worker is lost (a worker's segment failed
  // with `cause`; a server's serve() saw the loss): the processes left, as the job's next
  // membership (transport/tcp/regroup.hpp), this worker's index and the job's worker count
  // theirs. Throws CommError below min_workers, and where a server did not answer the roll call:
  // its shard is gone, so the job is restarted from its last checkpoint (cohort-run
  // --max-restarts does it).
  [[gnu::cold]] MembershipChange regroup(const CommError& cause) requires kRegroups {
    const int before = workers_;
    std::fprintf(stderr, "cohort: worker %d: regrouping after: %s\n", worker(), cause.what());
    thread_.reset();  // the old one's failure stays with it
    door_.close();
    const std::vector<int> members = regroup_mesh();
    door_.regrouped(members.front() == 0);
    process_.regrouped(transport_->rank(), workers_);
    thread_ = process_.start_communication_thread();
    servers_hold_state_ = in_segment_;
    open_door();
    MembershipChange change{.workers_before = static_cast<std::size_t>(before),
                            .workers_after = static_cast<std::size_t>(workers_),
                            .cause = cause.what()};
    for (int rank = 0; rank < before; ++rank) {
      if (std::ranges::find(members, rank) == members.end()) change.lost.push_back(rank);
    }
    return change;
  }

  // A process whose own failure ends its fit: the processes that regroup will not count it in.
  void withdraw() noexcept requires kRegroups { transport_->stop_listening(); }

  // strategy::Grows. On the chief, at a vote: the processes at its door that the job takes in
  // now, up to elastic.max_workers (or the workers it started with); 0 elsewhere.
  std::size_t joiners_waiting() requires kRegroups {
    return door_.joiners(static_cast<std::size_t>(workers_), elastic(), started_workers_);
  }

  // Every worker together, at the step boundary where the vote counted `joiners`, their segment
  // ended (FitEnd::kAdmit): the chief tells the servers (parameter_server/admission.hpp), and every
  // process forms the grown mesh. The segment that follows starts as any does, from the chief's
  // state, which its segment's end brought home from the servers.
  [[gnu::cold]] MembershipChange admit(std::size_t joiners) requires kRegroups {
    const auto before = static_cast<std::size_t>(workers_);
    door_.welcome(joiners);
    if (is_chief()) ps::order_admission(*transport_, server_ranks(), joiners);
    grow(static_cast<int>(joiners));
    open_door();
    return {.workers_before = before,
            .workers_after = static_cast<std::size_t>(workers_),
            .joined = joiners};
  }

  // Whether this process joined a running job through its door, rather than starting with it.
  bool joined() const requires kRegroups { return joined_; }
  // On the chief, before each step (trainer::ReplicaLoop) and while it waits for the others at
  // the end: answers the processes at its door, which ask for the job's addresses to take their
  // places back at the servers.
  void tend_door() requires kTakesWorkersBack { door_.waiting(); }
  // Whether this process, the chief of a job that takes workers back, ends its fit with the
  // others' (Replica::finish).
  bool awaits_workers() const requires kTakesWorkersBack {
    return options().elastic.enabled() && is_chief();
  }
  // Whether this process was started again for a lost worker's place, which it took back.
  bool rejoined() const {
    return kTakesWorkersBack && options().elastic.joins_running_job && !serves();
  }
  // On such a process, before its first fit: the step its fit goes on from, the earliest of the
  // servers' (parameter_server/server.hpp, kResume); `step`, its own, where no server holds a
  // chunk.
  std::uint64_t resume_step(std::uint64_t step) requires kTakesWorkersBack {
    ps::Client<Transport> client(*transport_, worker(), workers_);
    return client.resume(servers_, step);
  }

  // How long a worker's transfers may stall: 3/2 x timeout, the servers' deadline for a silent
  // worker and the time it takes them to say so.
  static std::chrono::milliseconds worker_transfer_timeout(std::chrono::milliseconds timeout) {
    return timeout + timeout / 2;
  }

  std::size_t replicas() const {
    return static_cast<std::size_t>(workers_) * options().local_replicas;
  }
  // A server runs no replica (Trainer builds no model there; the server needs no device).
  std::size_t local_replicas() const { return serves() ? 0 : options().local_replicas; }
  std::size_t first_local_replica() const {
    return serves() ? 0 : static_cast<std::size_t>(cluster().rank) * options().local_replicas;
  }
  // This process's worker index (its mesh rank); meaningless on a server.
  int worker() const { return cluster().rank; }
  // Where this worker's replicas live (a worker's GPU and stream for device::Cuda).
  typename D::Place place(std::size_t /*local_index*/) const { return worker_place_->place(); }
  bool is_chief() const { return !serves() && cluster().rank == 0; }
  // Whether this process is a server: Trainer::fit then calls serve() instead of training.
  bool serves() const { return cluster().role == Role::kParameterServer; }
  int servers() const { return servers_; }
  int workers() const { return workers_; }
  const cluster::Spec& cluster() const { return process_.spec(); }
  const Options& options() const { return process_.options(); }
  Transport& transport() { return *transport_; }

  // The layout of `elements` parameters of `element_bytes` each (parameter_server/protocol.hpp).
  ps::Layout layout(std::size_t elements, std::size_t element_bytes) const {
    return ps::Layout(elements, element_bytes, servers_,
                      {options().min_shard_bytes, options().alignment, options().chunk_bytes});
  }

  // strategy::KeepsShares: the workers' shares of the micro-batches, as the servers count them
  // (ps::shares_of): with backup workers, those of the job's workers at its start whatever its
  // membership.
  sharding::Shares shares() const {
    return ps::shares_of(static_cast<std::size_t>(workers_), started_workers_,
                         options().backup_workers);
  }

  // strategy::ChoosesGradientSum: the wire's (collective/wire.hpp).
  ReduceOp gradient_sum_op() const { return collective::gradient_sum(options().wire); }

  // strategy::FoldsAnyDeal, on a worker (a server runs no replica, and the Trainer deals it
  // nothing): its replicas fold as nodes of their micro-batches, which together make the worker's
  // node; its pushes say how many micro-batches they sum, which a Sync server folds them as; and
  // the Trainer's collectives between workers fold each worker as that node too.
  void use_deal(const sharding::Deal& deal) {
    const auto shares_dealt = deal.share_counts();
    if (options().backup_workers != 0 &&
        std::ranges::adjacent_find(shares_dealt, std::not_equal_to<>{}) != shares_dealt.end()) {
      options::reject("backup_workers", options().backup_workers,
                      "needs every worker dealt as many micro-batches (micro_batches = " +
                          std::to_string(shares().dealt) +
                          " workers x a power of two): a step aggregated without some workers' "
                          "pushes is scaled by the workers over the pushes, which holds for equal "
                          "shares only");
    }
    const auto mine = deal.counts().subspan(first_local_replica(), local_replicas());
    local_leaf_counts_.assign(mine.begin(), mine.end());
    const auto workers_dealt = deal.worker_counts();
    worker_leaf_counts_.assign(workers_dealt.begin(), workers_dealt.end());
  }

  // The settings of this strategy that every process of the job, servers included, must share
  // (Trainer adds them to the ones it compares: trainer/job_settings.hpp).
  settings::Fields settings() const {
    const auto text = [](std::size_t value) { return std::to_string(value); };
    return {{"consistency", std::string(C::kName)},
            {"parameter server option", "backup_workers=" + text(options().backup_workers) +
                                            " min_shard_bytes=" + text(options().min_shard_bytes) +
                                            " alignment=" + text(options().alignment) +
                                            " chunk_bytes=" + text(options().chunk_bytes)}};
  }

  // On a server: serves one fit (its shard of the layout of `elements` parameters) and returns
  // when every worker is done or lost, keeping its shard for save(): true when the workers'
  // fit stopped for preemption. Every worker's settings must match `own` (this server's: the
  // Trainer's settings that a server holds too) and the chief's (parameter_server/protocol.hpp).
  // What it did goes to stderr in one line.
  template <class T, class O>
  Served serve(std::size_t elements, const O& optimizer, const optimizer::Schedule& schedule,
               const settings::Fields& own) {
    try {
      check_optimizer<T>(optimizer);
      collective::require_gradient_sum_fits<T>(gradient_sum_op());
    } catch (const std::exception& refusal) {
      // The workers wait for this server's settings: they fail with its reason, not with a
      // closed connection that races its own line.
      transport_->abort(refusal.what());
      throw;
    }
    const ps::Layout shards = layout(elements, sizeof(T));
    ps::Server<Transport, T, O, C> server(*transport_, shards,
                                          {.server = cluster().rank,
                                           .workers = workers_,
                                           .backup_workers = options().backup_workers,
                                           .started_workers = started_workers_,
                                           .worker_timeout = options().timeout,
                                           .log_pushes = options().log_pushes,
                                           .settings = own,
                                           .schedule = schedule,
                                           .wire = options().wire,
                                           .readmits = options().elastic.enabled(),
                                           .min_workers = options().elastic.min_workers,
                                           .regroups = kRegroups && options().elastic.enabled()},
                                          optimizer);
    ps::ServerCounts counts = server.serve();
    if constexpr (kRegroups) {
      while (counts.membership_lost) {
        const std::vector<int> members = regroup_mesh();
        counts = server.serve_regrouped(*transport_, members);
      }
      if (counts.end == FitEnd::kAdmit) {
        try {
          grow(static_cast<int>(ps::await_admission(*transport_)));
        } catch (const CommError&) {
          // A process lost while the job grows (one taken in left after the vote): the workers
          // go on without it, from the chief's state, which a new fit of this server takes.
          regroup_mesh();
        }
      }
    }
    held_ = server.shard();
    std::string line = "cohort: parameter server " + std::to_string(cluster().rank) + " (" +
                       std::string(C::kName) + ", " +
                       std::to_string(shards.chunks_of(cluster().rank).size()) +
                       " chunks): pushes applied per worker " + ps::list(counts.applied);
    if (options().backup_workers != 0) line += ", dropped per worker " + ps::list(counts.dropped);
    line += ", workers lost " + std::to_string(counts.lost.size());
    if (counts.taken_back != 0) line += ", taken back " + std::to_string(counts.taken_back);
    if (kStaleness != 0) {
      line += ", staleness {";
      bool first = true;
      for (const auto& [staleness, count] : counts.staleness) {
        line += (first ? "" : ", ") + std::to_string(staleness) + ": " + std::to_string(count);
        first = false;
      }
      line += "}";
    }
    if (counts.end == FitEnd::kPreempted) line += ", stopped for preemption";
    if (counts.end == FitEnd::kCheckpoint) line += ", for a checkpoint at step " + std::to_string(counts.step);
    std::fprintf(stderr, "%s\n", line.c_str());
    return {.end = counts.end, .step = counts.step};
  }

  // Trainer::restore: a server keeps its shard of the restored state, so that a save before the
  // next fit saves it (the next fit starts from the chief's copy, the same values).
  template <class T>
  void restored(const checkpoint::TrainingState<T>& state) {
    if (!serves()) return;
    held_ = ps::shard_of(state, layout(state.parameters.size(), sizeof(T)), cluster().rank);
  }

  // Trainer::save: a sharded checkpoint (parameter_server/sharded_save.hpp). Every process calls
  // it after the same fit. The chief orders every server to write the shard it holds beside
  // `file`, waits until each has reported its file durable, then writes the manifest `file` (which
  // removes the shard files of the manifest it replaced). A server writes the shard of its last
  // fit or restore. `state` holds the run's settings and step (no values: those are the
  // servers'), `elements` the model's parameter count. Every other process returns once the
  // chief has told it that the manifest is written, or throws with the chief's reason.
  template <class T>
  void save(const std::filesystem::path& file, const checkpoint::TrainingState<T>& state,
            std::size_t elements) const {
    if (serves()) {
      const auto* held = std::get_if<checkpoint::ShardState<T>>(&held_);
      ps::save_shard(*transport_, cluster().rank, held,
                     held != nullptr ? ps::holders(layout(held->elements, sizeof(T))) : 0, file);
    } else if (is_chief()) {
      ps::save_manifest(*transport_, workers_, layout(elements, sizeof(T)), file, state);
    } else {
      ps::await_saved(*transport_, file);
    }
  }

  // A worker's replica (strategy/strategy.hpp). Its lifecycle in one fit: start, then per step
  // begin_step, gradients_ready for each final range, finish_step, then finish. Only the worker's
  // first replica talks to the servers; the others reduce their gradients with it and take the
  // parameters it pulls.
  class Replica {
    using Staging = typename detail::ps::WorkerPlace<D>::Staging;

   public:
    std::size_t index() const { return index_; }
    Communicator& communicator() { return communicator_; }

    // The start of a fit (trainer::ReplicaLoop): the chief initializes the servers with its
    // parameters, optimizer state and the run's step (so that a restored run's servers count
    // Adam's steps from it), then every worker's first replica pulls and hands the parameters
    // to the worker's other replicas.
    template <class T>
    void start(std::span<T> parameters, std::span<T> optimizer_state, std::uint64_t step) {
      collective::require_gradient_sum_fits<T>(owner_->gradient_sum_op());
      wire_ = owner_->options().wire;
      if (wire_ != collective::Wire::kFloat32 && speaks_for_worker_) {
        packed_.resize(parameters.size());
      }
      const ps::Layout layout = owner_->layout(parameters.size(), sizeof(T));
      // The buckets of every step: the layout's chunks (which tile the parameters), the last
      // first.
      chunks_.assign(layout.chunks().rbegin(), layout.chunks().rend());
      edges_.assign(1, parameters.size());
      for (const ps::Chunk& chunk : chunks_) edges_.push_back(chunk.begin);
      with_servers([&] {
        const std::span<T> host = host_copy(parameters, parameter_staging_);
        if (index_ == 0 && !owner_->rejoined() && !owner_->servers_hold_state_) {
          initialize_servers<T>(host, optimizer_state, step);
        }
        pull(host, step, step);
        land(host, parameters);
        owner_->servers_hold_state_ = false;
        owner_->in_segment_ = true;
      });
      local_.broadcast(parameters, 0);
      step_ = step;
    }

    // Before start, every worker's first replica presents the Trainer's settings to every server,
    // which compare them with theirs and the chief's: ConfigError when one differs
    // (parameter_server/protocol.hpp).
    void present_settings(const settings::Fields& fields) {
      with_servers([&] { client_.present(settings::encode(fields), owner_->servers_); });
    }

    // One step (strategy/strategy.hpp). Each chunk of the layout is a bucket: once every
    // element of it is final, the worker's replicas sum it (the canonical tree over them, a
    // subtree of the tree over all replicas) and the first replica pushes the sum, on the
    // communication thread, while the backward pass goes on. finish_step pulls every chunk in
    // the same order, once the servers have settled the pushes, and hands the parameters to the
    // worker's other replicas. Under Async and BoundedStaleness with clipping, a push is clipped
    // by its own norm, which needs the whole gradient: then every push waits for finish_step.
    template <class T, class O>
    void begin_step(Update<T, O>& update) {
      owner_->template check_optimizer<T>(update.optimizer);
      buckets_.begin(std::span<const std::size_t>(edges_));
      if (speaks_for_worker_) {
        gradient_ = std::as_writable_bytes(host_target(update.gradient_sum, gradient_staging_));
      }
    }

    template <class T, class O>
    void gradients_ready(Update<T, O>& update, std::size_t begin, std::size_t end) {
      if (clips_each_push(update.optimizer)) return;
      std::size_t first = chunks_.size();
      std::size_t last = 0;
      buckets_.ready(begin, end, [&](std::size_t bucket, std::size_t, std::size_t) {
        first = std::min(first, bucket);
        last = bucket + 1;
      });
      if (first < last) {
        reduce_locally(update.gradient_sum, first, last);
        push(update, first, last, update.inverse_batch);
      }
    }

    template <class T, class O>
    void finish_step(Update<T, O>& update) {
      if (clips_each_push(update.optimizer)) {
        // Every push is applied alone, so it is clipped here, by its own norm.
        reduce_locally(update.gradient_sum, 0, chunks_.size());
        if (speaks_for_worker_) {
          push(update, 0, chunks_.size(),
               update.inverse_batch *
                   optimizer::clipping_factor(
                       D::sum_of_squares(place_, std::span<const T>(update.gradient_sum)),
                       update.inverse_batch, update.optimizer.options().max_gradient_norm));
        }
      }
      COHORT_ASSERT(clips_each_push(update.optimizer) || buckets_.complete());
      if (speaks_for_worker_) {
        {
          const trace::Span waited(trace::current(), trace::Phase::kBucketWait,
                                   {.step = update.step});
          thread_->wait();  // every push sent (or its failure rethrown)
        }
        const std::span<T> parameters = host_target(update.parameters, parameter_staging_);
        pull(parameters, update.step, update.step + 1);
        land(parameters, update.parameters);
      }
      local_.broadcast(update.parameters, 0);
      step_ = update.step + 1;
    }

    // The end of a fit (trainer::ReplicaLoop), on every replica: the chief brings the optimizer
    // state home from the servers (the next fit starts from it), and every worker's first
    // replica tells the servers that its fit is done, and whether it stopped for preemption (the
    // servers then save too).
    template <class T>
    void finish(std::span<T> parameters, std::span<T> optimizer_state, FitEnd end) {
      if (!speaks_for_worker_) return;
      if constexpr (kTakesWorkersBack) {
        if (index_ == 0 && owner_->awaits_workers()) await_workers(parameters);
      }
      if (index_ == 0 && !parameters.empty() && !optimizer_state.empty()) {
        const std::span<T> state = host_target(optimizer_state, state_staging_);
        pull_state(state, optimizer_state.size() / parameters.size());
        land(state, optimizer_state);
      }
      client_.done(owner_->servers_, end, step_);
      owner_->in_segment_ = false;
    }

    // strategy::AbandonsStep: a step that failed here releases the worker's other replicas and
    // waits until the communication thread, whose pushes read the step's gradient, lets go of it.
    // The abort tells the servers and the other workers why this worker leaves the step: under
    // Sync, every process of an elastic job then meets at the regroup.
    void abandon_step(std::string_view reason) noexcept {
      try {
        communicator_.abort(reason);
        local_.abort(reason);
        thread_->wait();
      } catch (...) {  // the step's own error is what goes up
      }
    }

    // Whether a server said it was signalled (core/preemption.hpp; protocol.hpp): the Trainer
    // counts it in the job's agreement to stop.
    bool stop_requested() const { return speaks_for_worker_ && client_.preemption_heard(); }

   private:
    friend class ParameterServer;
    Replica(ParameterServer& owner, std::size_t index, Communicator communicator,
            collective::LocalCommunicator local, collective::CommunicationThread& thread)
        : owner_(&owner),
          index_(index),
          place_(owner.place(0)),
          speaks_for_worker_(local.rank() == 0),
          communicator_(std::move(communicator)),
          local_(std::move(local)),
          thread_(&thread),
          client_(*owner.transport_, owner.worker(), owner.workers_) {}

    // The first replica's exchange `talk` with the servers at the start of a fit. A ConfigError or
    // CommError it throws is thrown by every replica of the worker at once: the others would
    // otherwise wait for the first in their next local collective until the timeout. The error
    // itself passes through the strategy, which the worker's replicas share; the broadcast says
    // whether there is one.
    template <class Talk>
    void with_servers(Talk&& talk) {
      double failed = 0.0;
      if (speaks_for_worker_) {
        owner_->start_failure_ = nullptr;
        try {
          talk();
        } catch (const Error&) {
          owner_->start_failure_ = std::current_exception();
          failed = 1.0;
        }
      }
      local_.broadcast(std::span(&failed, 1), 0);
      if (failed != 0.0) std::rethrow_exception(owner_->start_failure_);
    }

    // The chief of a job that takes workers back (strategy::TakesWorkersBack), its own steps
    // done: it tends its door until no server hears from another worker that has not ended its
    // fit, or waits for one lost less than elastic.probe_timeout ago, then pulls the parameters
    // the servers end with, which hold every worker's pushes.
    template <class T>
    void await_workers(std::span<T> parameters) {
      constexpr auto kPause = std::chrono::milliseconds(20);
      const auto grace = owner_->options().elastic.probe_timeout;
      for (bool said = false; client_.working(owner_->servers_, grace) != 0; said = true) {
        if (!said) {
          std::fprintf(stderr,
                       "cohort: worker 0 (the chief) is done at step %llu; the fit ends with the "
                       "other workers'\n",
                       static_cast<unsigned long long>(step_));
        }
        owner_->tend_door();
        std::this_thread::sleep_for(kPause);
      }
      const std::span<T> host = host_target(parameters, parameter_staging_);
      pull(host, step_, step_);
      land(host, parameters);
    }

    // Under Async and BoundedStaleness with clipping, a push is clipped by its own norm.
    template <class O>
    static bool clips_each_push(const O& optimizer) {
      return kStaleness != 0 && optimizer.options().max_gradient_norm > 0.0;
    }

    // The chief's kInit: its parameters (host memory) and optimizer state (at its place), chunk
    // by chunk, each chunk's parameters followed by its state slot-major.
    template <class T>
    void initialize_servers(std::span<const T> parameters, std::span<T> state_at_place,
                            std::uint64_t step) {
      const std::size_t slots = parameters.empty() ? 0 : state_at_place.size() / parameters.size();
      const std::span<const T> state = host_copy(state_at_place, state_staging_);
      staging_.clear();
      std::vector<std::size_t> offsets;
      for (const ps::Chunk& chunk : chunks_) {
        offsets.push_back(staging_.size());
        append<T>(parameters.subspan(chunk.begin, chunk.size()));
        for (std::size_t slot = 0; slot < slots; ++slot) {
          append<T>(state.subspan(slot * parameters.size() + chunk.begin, chunk.size()));
        }
      }
      for (std::size_t i = 0; i < chunks_.size(); ++i) {
        client_.add({.operation = ps::Operation::kInit, .step = step, .element_bytes = sizeof(T)},
                    chunks_[i],
                    std::span<const std::byte>(staging_).subspan(
                        offsets[i], (1 + slots) * chunks_[i].size() * sizeof(T)));
      }
      client_.transfer();
    }

    // The worker's replicas sum buckets [first, last) of the gradient, one range of it.
    template <class T>
    void reduce_locally(std::span<T> gradient, std::size_t first, std::size_t last) {
      if (first == last) return;
      const std::size_t begin = chunks_[last - 1].begin;
      local_.all_reduce(gradient.subspan(begin, chunks_[first].end - begin),
                        owner_->gradient_sum_op());
    }

    // The first replica hands buckets [first, last) to the communication thread, which pushes
    // them from the host while this thread goes on.
    template <class T, class O>
    void push(Update<T, O>& update, std::size_t first, std::size_t last, double scale) {
      if (!speaks_for_worker_ || first == last) return;
      const std::size_t begin = chunks_[last - 1].begin;
      const std::size_t length = chunks_[first].end - begin;
      const std::span<T> host = as_elements<T>(gradient_).subspan(begin, length);
      if constexpr (!kOnHost) {
        D::to_host(place_, std::span<const T>(update.gradient_sum.subspan(begin, length)), host);
      }
      const std::span<const ps::Chunk> chunks = std::span(chunks_).subspan(first, last - first);
      const std::size_t element_bytes = collective::element_bytes(wire_, sizeof(T));
      thread_->submit([this, chunks, gradient = as_elements<const T>(gradient_), first,
                       step = update.step, scale, element_bytes, bytes = length * element_bytes] {
        const trace::Span span(trace::current(), trace::Phase::kPush,
                               {.step = step, .index = first, .bytes = bytes});
        for (const ps::Chunk& chunk : chunks) {
          client_.add({.operation = ps::Operation::kPush,
                       .step = step,
                       .inverse_batch = scale,
                       .element_bytes = element_bytes,
                       .leaves = owner_->leaves()},
                      chunk, payload(gradient.subspan(chunk.begin, chunk.size()), chunk.begin));
        }
        client_.transfer();
      });
    }

    // What a push of `values`, elements [begin, begin + values.size()) of the gradient, carries:
    // the values themselves, or under a narrow wire their 2-byte form, which every value already
    // is (the canonical tree's nodes are rounded: ReduceOp::kSumBfloat16, kSumFloat16), so that the
    // packing changes no bit.
    template <class T>
    std::span<const std::byte> payload(std::span<const T> values, std::size_t begin) {
      if constexpr (std::same_as<T, float>) {
        if (wire_ != collective::Wire::kFloat32) {
          const std::span<std::uint16_t> packed = std::span(packed_).subspan(begin, values.size());
          collective::pack(wire_, values, packed);
          return std::as_bytes(packed);
        }
      }
      return std::as_bytes(values);
    }

    // Every chunk's parameters after `updates` updates into `parameters` (host memory), in the
    // order of the pushes, at the Trainer's `step`.
    template <class T>
    void pull(std::span<T> parameters, std::uint64_t step, std::uint64_t updates) {
      const trace::Span span(trace::current(), trace::Phase::kPull,
                             {.step = step, .bytes = parameters.size_bytes()});
      for (const ps::Chunk& chunk : chunks_) {
        client_.add(
            {.operation = ps::Operation::kPull, .step = updates, .element_bytes = sizeof(T)}, chunk,
            {}, std::as_writable_bytes(parameters.subspan(chunk.begin, chunk.size())));
      }
      client_.transfer();
    }

    // The chief: the servers' optimizer state into `state` (host memory, slot-major over the
    // whole vector).
    template <class T>
    void pull_state(std::span<T> state, std::size_t slots) {
      const std::size_t elements = state.size() / slots;
      staging_.resize(state.size_bytes());
      for (const ps::Chunk& chunk : chunks_) {
        client_.add({.operation = ps::Operation::kPullState, .element_bytes = sizeof(T)}, chunk, {},
                    std::span(staging_).subspan(chunk.begin * slots * sizeof(T),
                                                chunk.size() * slots * sizeof(T)));
      }
      client_.transfer();
      // Each chunk's answer is slot-major over the chunk.
      const auto* values = reinterpret_cast<const T*>(staging_.data());
      for (const ps::Chunk& chunk : chunks_) {
        for (std::size_t slot = 0; slot < slots; ++slot) {
          std::copy_n(values + chunk.begin * slots + slot * chunk.size(), chunk.size(),
                      state.begin() + static_cast<std::ptrdiff_t>(slot * elements + chunk.begin));
        }
      }
    }

    // `values` (memory at the replica's place) as host memory: the span itself on the host, else
    // a copy in `staging`.
    template <class T, class Bytes>
    std::span<T> host_copy(std::span<T> values, Bytes& staging) {
      if constexpr (kOnHost) {
        return values;
      } else {
        const std::span<T> host = host_target(values, staging);
        D::to_host(place_, std::span<const T>(values), host);
        return host;
      }
    }

    // Where host data meant for `values` is written first: values itself on the host, else
    // `staging`, from which land() copies it to values.
    template <class T, class Bytes>
    static std::span<T> host_target(std::span<T> values, Bytes& staging) {
      if constexpr (kOnHost) {
        return values;
      } else {
        staging.resize(values.size_bytes());
        return {reinterpret_cast<T*>(staging.data()), values.size()};
      }
    }

    template <class T>
    void land(std::span<T> host, std::span<T> values) {
      if constexpr (!kOnHost) D::from_host(place_, std::span<const T>(host), values);
    }

    template <class T>
    void append(std::span<const T> values) {
      const auto bytes = std::as_bytes(values);
      staging_.insert(staging_.end(), bytes.begin(), bytes.end());
    }

    template <class T>
    static std::span<T> as_elements(std::span<std::byte> bytes) {
      return {reinterpret_cast<T*>(bytes.data()), bytes.size() / sizeof(T)};
    }

    ParameterServer* owner_;
    std::size_t index_;
    typename D::Place place_;
    bool speaks_for_worker_;  // the worker's first replica: the one that talks to the servers
    std::uint64_t step_ = 0;  // the run's steps done: from start, one more at each finish_step
    Communicator communicator_;
    collective::LocalCommunicator local_;  // among this worker's replicas
    // The worker's communication thread, where the first replica's pushes run. The first replica
    // uses the client itself only while the thread is idle (after waiting for it).
    collective::CommunicationThread* thread_;
    ps::Client<Transport> client_;
    // This fit's layout: its chunks in push order (the last first), which are the buckets of
    // every step, and their edges (GradientBuckets).
    std::vector<ps::Chunk> chunks_;
    std::vector<std::size_t> edges_;
    detail::GradientBuckets buckets_;
    std::span<std::byte> gradient_;   // this step's gradient sum on the host
    collective::Wire wire_ = collective::Wire::kFloat32;  // what pushes cross in (Options::wire)
    std::vector<std::uint16_t> packed_;  // the gradient as pushed in a narrow format
    std::vector<std::byte> staging_;  // the chief's kInit and kPullState payloads
    // Host copies of device memory (unused on the host): what crosses every step in the place's
    // staging memory, the optimizer state (twice a fit, on the chief) in plain memory.
    Staging gradient_staging_, parameter_staging_;
    std::vector<std::byte> state_staging_;
  };

  template <class Body>
  void run(Body&& body) {
    if (serves()) {
      throw ConfigError("ParameterServer::run: this process is parameter server " +
                        std::to_string(cluster().rank) +
                        "; it serves (Trainer::fit calls serve()) and runs no replica");
    }
    const collective::Local::Options group{.ranks = static_cast<int>(options().local_replicas),
                                           .timeout = options().timeout,
                                           .leaf_counts = local_leaf_counts_};
    // Two groups of the worker's replicas: the Trainer's collectives and the replicas' steps.
    collective::Local trainer_group(group);
    collective::Local step_group(group);
    // thread_ runs the worker's traffic between processes: its pushes, and under Sync the
    // Trainer's collectives over the workers' part of the mesh.
    std::optional<Cross> cross;
    if constexpr (kStaleness == 0) {
      cross.emplace(ps::WorkerView<Transport>(*transport_, workers_));
      cross->set_leaf_counts(worker_leaf_counts_);
    }
    detail::run_replica_threads(
        options().local_replicas,
        [&](std::size_t local) {
          worker_place_->make_current();  // this thread drives the worker's device from here on
          const int rank = static_cast<int>(local);
          const auto on_host = [&] {
            if constexpr (kStaleness == 0) {
              return HostCommunicator(trainer_group.communicator(rank), *cross, *thread_,
                                      options().chunk_bytes);
            } else {
              return HostCommunicator(*transport_, trainer_group.communicator(rank), workers_);
            }
          };
          const auto communicator = [&] {
            if constexpr (kOnHost) {
              return on_host();
            } else {
              return Communicator(on_host(), place(local));
            }
          };
          return Replica(*this, first_local_replica() + local, communicator(),
                         step_group.communicator(rank), *thread_);
        },
        body);
  }

 private:
  // How many micro-batches this worker's pushes sum (use_deal; one each where never dealt).
  std::uint32_t leaves() const {
    return worker_leaf_counts_.empty()
               ? 1
               : static_cast<std::uint32_t>(
                     worker_leaf_counts_[static_cast<std::size_t>(worker())]);
  }

  // The mesh grown by `joiners` processes (admit, and a server's serve), who come after the
  // members; every process then takes its place in the job's order, the workers first (the ones
  // taken in after the others), then the servers.
  [[gnu::cold]] void grow(int joiners) requires kRegroups {
    transport::tcp::Tcp grown = transport::tcp::grow(*transport_, joiners, elastic().probe_timeout);
    const int rank = grown.rank();
    const int place = rank < workers_ ? rank : rank + joiners;  // a member: a worker or a server
    transport_ = std::make_unique<Transport>(
        transport::tcp::renumber(grown, place, elastic().probe_timeout));
    workers_ += joiners;
    if (!serves()) process_.regrouped(transport_->rank(), workers_);
  }

  // On an elastic job's chief, the rank 0 of each membership: its door (detail/job_door.hpp),
  // where processes started for the job come. Under Async and BoundedStaleness the chief is
  // never another: the job ends with it (parameter_server/server.hpp).
  void open_door() {
    if constexpr (kTakesWorkersBack || kRegroups) {
      if (options().elastic.enabled()) door_.open(*transport_, process_.spec(), process_.binding());
    }
  }

  // The mesh of the processes left after a worker's loss (regroup, and a server's serve): by new
  // rank, each one's old rank. Every server must be among them, and min_workers workers: a
  // CommError says what is missing, on every process alike (they all heard the same roll call).
  [[gnu::cold]] std::vector<int> regroup_mesh() requires kRegroups {
    const Elastic& elastic = options().elastic;
    transport::tcp::Regrouped next = transport::tcp::regroup(
        *transport_, {.min_size = static_cast<int>(elastic.min_workers) + servers_,
                      .probe_timeout = elastic.probe_timeout});
    const auto failure = [&](const std::string& detail) {
      return CommError({.rank = next.transport.rank(), .operation = "regroup", .detail = detail});
    };
    std::string gone;
    for (const int rank : server_ranks()) {
      if (std::ranges::find(next.members, rank) != next.members.end()) continue;
      gone += (gone.empty() ? "" : ", ") + std::string("parameter server ") +
              std::to_string(rank - workers_) + " (rank " + std::to_string(rank) + ")";
    }
    if (!gone.empty()) {
      throw failure(gone +
                    " did not answer the roll call: its shard of the parameters and optimizer "
                    "state is gone, so the job cannot go on; restart it from its last checkpoint");
    }
    // With every server there, the roll call's min_size leaves min_workers workers at least.
    workers_ = static_cast<int>(
        std::ranges::count_if(next.members, [&](int rank) { return rank < workers_; }));
    transport_ = std::make_unique<Transport>(std::move(next.transport));
    return std::move(next.members);
  }

  // The mesh ranks of the servers, which follow the workers'.
  std::vector<int> server_ranks() const {
    std::vector<int> ranks;
    for (int server = 0; server < servers_; ++server) ranks.push_back(workers_ + server);
    return ranks;
  }

  // Options::elastic: a lost worker's process taken back under Async and BoundedStaleness (never
  // the chief's: the job ends with it), taken in under Sync (the chief's too, at the next chief's
  // door).
  void check_elastic() const {
    const Elastic& elastic = options().elastic;
    if (elastic.joins_running_job && !elastic.enabled()) {
      options::reject("elastic.joins_running_job", "true",
                      "needs elastic.min_workers (COHORT_MIN_WORKERS): only an elastic job takes a "
                      "worker back");
    }
    if (!elastic.enabled()) return;
    if (!kTakesWorkersBack && !kRegroups) {
      options::reject("elastic.min_workers", elastic.min_workers,
                      "needs transport::tcp::Tcp, over which the processes regroup or take a "
                      "worker back");
    }
    if (elastic.min_workers > static_cast<std::size_t>(workers_)) {
      options::reject("elastic.min_workers", elastic.min_workers,
                      "exceeds the " + std::to_string(workers_) + " workers");
    }
    if (elastic.max_workers != 0 && elastic.max_workers != static_cast<std::size_t>(workers_)) {
      options::reject("elastic.max_workers", elastic.max_workers,
                      "must be 0 or the " + std::to_string(workers_) +
                          " workers: a parameter-server job takes lost workers back, and grows "
                          "by none");
    }
    if (elastic.joins_running_job && (serves() || (kTakesWorkersBack && cluster().rank == 0))) {
      options::reject("elastic.joins_running_job", "true",
                      serves() ? "a parameter server started again cannot take its place back: "
                                 "its shard is gone; restart the job from its last checkpoint"
                               : "the chief started again cannot take its place back: it held the "
                                 "job's door and brings the optimizer state home; restart the "
                                 "job from its last checkpoint");
    }
  }

  // Global-norm clipping under Sync composes the servers' block sums of squares
  // (parameter_server/server.hpp), so no shard or chunk boundary may split a block.
  template <class T, class O>
  void check_optimizer(const O& optimizer) const {
    if (kStaleness != 0 || optimizer.options().max_gradient_norm <= 0.0) return;
    const std::string why =
        " when clipping (max_gradient_norm > 0): shard and chunk boundaries "
        "must fall on the gradient norm's blocks of " +
        std::to_string(device::cpu::kNormBlock) + " elements";
    if (options().alignment % device::cpu::kNormBlock != 0) {
      options::reject("alignment", options().alignment,
                      "must be a multiple of " + std::to_string(device::cpu::kNormBlock) + why);
    }
    if (options().chunk_bytes % (device::cpu::kNormBlock * sizeof(T)) != 0) {
      options::reject(
          "chunk_bytes", options().chunk_bytes,
          "must be a multiple of " + std::to_string(device::cpu::kNormBlock * sizeof(T)) + why);
    }
  }

  detail::WorkerProcess<Options> process_;
  int workers_ = 0;
  int servers_ = 0;
  std::unique_ptr<Transport> transport_;
  std::optional<detail::ps::WorkerPlace<D>> worker_place_;   // on a worker
  std::unique_ptr<collective::CommunicationThread> thread_;  // on a worker; stopped before the
                                                             // transport it moves data over
  ps::HeldShard held_;  // a server's shard, from its last fit or restore, for save()
  // On an elastic job's chief: where a worker's process started again gets the job's addresses.
  detail::JobDoor door_;
  // A worker's failure at the start of a fit, for its other replicas (Replica::with_servers).
  std::exception_ptr start_failure_;
  std::size_t started_workers_ = 0;
  bool joined_ = false;  // joined(): taken in through the chief's door
  // From a segment's start, once the servers hold its state, to its end, once every server was
  // told (Replica::start, finish): a loss in between leaves the state on the servers.
  bool in_segment_ = false;
  // After a regroup in a segment, until the next start has pulled: the servers hold the state the
  // job goes on from (the chief's optimizer state is not current), so the chief does not send its
  // own. A regroup between segments leaves the chief's state current, and new servers' fits.
  bool servers_hold_state_ = false;
  // use_deal, on a worker; empty: one micro-batch each.
  std::vector<std::size_t> local_leaf_counts_;   // this worker's replicas'
  std::vector<std::size_t> worker_leaf_counts_;  // every worker's
};

static_assert(Strategy<ParameterServer<>>);
static_assert(Strategy<ParameterServer<consistency::Async>>);
// Its capabilities (strategy.hpp): the same under every consistency.
static_assert(SpansProcesses<ParameterServer<>>);
static_assert(ServesFit<ParameterServer<>, float, optimizer::Sgd>);
static_assert(PresentsSettings<ParameterServer<>>);
static_assert(ReportsStop<ParameterServer<>>);
static_assert(SavesOwnCheckpoint<ParameterServer<>, float>);
static_assert(ChoosesGradientSum<ParameterServer<>>);
static_assert(FoldsAnyDeal<ParameterServer<>>);
static_assert(TakesWorkersBack<ParameterServer<consistency::Async>>);
static_assert(!TakesWorkersBack<ParameterServer<>>);
static_assert(Grows<ParameterServer<>>);
static_assert(KeepsShares<ParameterServer<>>);
static_assert(AbandonsStep<ParameterServer<>>);

// Workers under Async and BoundedStaleness go at their own pace.
template <class C, device::Device D, class Transport>
inline constexpr bool kLockstep<ParameterServer<C, D, Transport>> = C::kStaleness == 0;

}  // namespace cohort::strategy

#if defined(COHORT_SEPARATE_COMPILATION)
namespace cohort::strategy {
COHORT_INSTANTIATED class ParameterServer<consistency::Sync>;
COHORT_INSTANTIATED class ParameterServer<consistency::Async>;
namespace ps {
COHORT_INSTANTIATED class Client<transport::tcp::Tcp>;
COHORT_INSTANTIATED void save_manifest<float>(transport::tcp::Tcp&, int, const Layout&,
                                              const std::filesystem::path&,
                                              const checkpoint::TrainingState<float>&);
COHORT_INSTANTIATED void save_manifest<double>(transport::tcp::Tcp&, int, const Layout&,
                                               const std::filesystem::path&,
                                               const checkpoint::TrainingState<double>&);
COHORT_INSTANTIATED void save_shard<float>(transport::tcp::Tcp&, int,
                                           const checkpoint::ShardState<float>*, int,
                                           const std::filesystem::path&);
COHORT_INSTANTIATED void save_shard<double>(transport::tcp::Tcp&, int,
                                            const checkpoint::ShardState<double>*, int,
                                            const std::filesystem::path&);
}  // namespace ps
}  // namespace cohort::strategy
#endif
