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
// replicas() = W x local_replicas, and the Trainer's split rule applies (micro_batches /
// replicas a power of two: 3 workers of 1 replica need micro_batches = 3 x 2^k). A worker's
// replicas sum their gradients among themselves (the canonical tree over them: a subtree of the
// tree over all replicas, as local_replicas is a power of two), and its first replica pushes the
// sum and shares the parameters it pulls.
//
// One step, on a worker: the Trainer folds the worker's micro-batches (Update::gradient_sum),
// then replica.finish_step() sends, for every chunk of every shard at once (detail/ps_protocol.hpp has
// the layout and the protocol), the chunk's gradient sum; each reply carries the chunk's new
// parameters. On a server, per chunk:
//   Sync (K = 0)     the W pushes of a step are summed in the canonical tree over worker indices
//                    (core/reduction_tree.hpp), scaled by 1 / global batch and given to the
//                    optimizer with step = step + 1, as detail/mirrored_replica.hpp does: the
//                    parameters are the same bits as Mirrored and MultiWorkerMirrored with the
//                    same seed and micro_batches (the optimizer is elementwise, so a chunk updates
//                    with the bits of the whole vector).
//   K >= 1, Async    each push is applied on arrival, exactly once, scaled by 1 / global batch
//                    (a push is one worker's share of a batch); the reply, a whole version of the
//                    chunk, waits while its worker is more than K steps ahead of the slowest live
//                    worker. Adam's step counts the chunk's updates.
// The optimizer state lives on the servers. At the start of every fit the chief sends its
// parameters and optimizer state to the servers, and every worker pulls; at its end the chief
// pulls the optimizer state back (so that the next fit starts from it) and every server keeps its
// shard. A server runs no replica: its Trainer builds no model, and it needs no device (with
// ParameterServer<C, device::Cuda>, strategy/parameter_server_cuda.hpp, the workers' replicas are
// on GPUs and their pushes and pulls are staged through the host). Trainer::save then writes a
// sharded checkpoint: every server its shard, the
// chief the manifest last (save() below); Trainer::restore on every process reads the manifest
// and the shards and continues the run (the same bits, for Sync). A sharded checkpoint restores
// under any strategy, and any checkpoint restores under ParameterServer.
//
// Faults. A worker that dies is reported by the servers by name; Async and BoundedStaleness go on
// without it (the bound counts live workers only); Sync fails with an error naming it unless
// backup workers cover it (detail/ps_server.hpp has the rule). A server that dies makes every
// worker's next push or pull fail naming it ("parameter server 1 (rank 5)"), within `timeout` at
// worst: restart the job from the last checkpoint.
//
// Options:
//   local_replicas   replica threads in each worker process (a power of two, the same on every
//                    worker)
//   cluster          explicit overrides of what the launcher says
//   bind_address     where this process listens (or COHORT_BIND_ADDRESS); loopback by default
//   secret           shared secret authenticating every connection (or COHORT_SECRET)
//   connect_timeout  the rendezvous deadline
//   timeout          how long a worker waits for a reply (a bounded-staleness worker may wait
//                    for the slowest one) and any transfer may stall
//   min_shard_bytes  a shard holds at least this many bytes (so a small model uses few servers)
//   alignment        shard boundaries are multiples of this many elements
//   chunk_bytes      the unit of a request, so that push, update and pull pipeline
//   backup_workers   Sync only: a step needs the W - backup_workers lowest-indexed live workers
//   log_pushes       servers print a line per push applied to their first chunk
//
// Global-norm clipping (the optimizer's max_gradient_norm): under Sync the servers clip each
// step's aggregate by its global norm, the same bits as the mirrored strategies (alignment and
// chunk_bytes must then keep the norm's 4096-element blocks whole; ConfigError otherwise); under
// Async and BoundedStaleness each worker clips its own push.
#pragma once

#include <chrono>
#include <concepts>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <variant>
#include <vector>

#include "cohort/checkpoint/checkpoint.hpp"
#include "cohort/cluster/cluster.hpp"
#include "cohort/collective/deterministic.hpp"
#include "cohort/collective/hierarchical.hpp"
#include "cohort/collective/local.hpp"
#include "cohort/core/error.hpp"
#include "cohort/core/options.hpp"
#include "cohort/device/cpu.hpp"
#include "cohort/strategy/consistency.hpp"
#include "cohort/strategy/detail/ps_client.hpp"
#include "cohort/strategy/detail/ps_protocol.hpp"
#include "cohort/strategy/detail/ps_server.hpp"
#include "cohort/strategy/detail/replica_threads.hpp"
#include "cohort/strategy/detail/staged_communicator.hpp"
#include "cohort/strategy/detail/tcp_options.hpp"
#include "cohort/strategy/strategy.hpp"
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

template <class C = consistency::Sync, device::Device D = device::Cpu>
class ParameterServer {
  static_assert(consistency::Consistency<C>,
                "cohort: ParameterServer takes a consistency model: consistency::Sync, "
                "consistency::Async or consistency::BoundedStaleness<K>. See "
                "include/cohort/strategy/consistency.hpp.");

 public:
  static constexpr std::string_view kName = "parameter_server";
  static constexpr std::uint64_t kStaleness = C::kStaleness;
  using Transport = transport::tcp::Tcp;
  // Sync: over every replica of every worker, in the canonical tree (the workers' local replicas
  // first, as MultiWorkerMirrored). Otherwise a worker never waits for the others.
  using Cross = collective::Deterministic<detail::ps::WorkerView<Transport>>;
  using HostCommunicator =
      std::conditional_t<kStaleness == 0,
                         collective::Hierarchical<collective::LocalCommunicator, Cross>,
                         detail::ps::Independent<Transport>>;
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
    std::chrono::milliseconds connect_timeout{std::chrono::minutes(1)};
    std::chrono::milliseconds timeout{std::chrono::minutes(5)};
    std::size_t min_shard_bytes = std::size_t{256} << 10;
    std::size_t alignment = device::cpu::kNormBlock;
    std::size_t chunk_bytes = std::size_t{1} << 20;
    std::size_t backup_workers = 0;
    bool log_pushes = false;
  };

  explicit ParameterServer(Options options)
      : options_(std::move(options)), spec_(cluster::resolve(options_.cluster)) {
    workers_ = cluster::worker_count(spec_);
    servers_ = cluster::parameter_server_count(spec_);
    if (spec_.role != "ps" && spec_.role != "worker" && spec_.role != "chief") {
      options::reject("role", spec_.role,
                      "ParameterServer runs ps, worker and chief tasks (" + spec_.source + ")");
    }
    if (servers_ <= 0) {
      options::reject("parameter servers", servers_,
                      "a ParameterServer job needs at least one ps task (TF_CONFIG \"ps\", or "
                      "COHORT_PS_COUNT; cohort-run --ps N) (" +
                          spec_.source + ")");
    }
    if (workers_ <= 0) {
      options::reject("workers", workers_, "a ParameterServer job needs at least one worker");
    }
    detail::require_local_replicas(options_.local_replicas);
    if (!kOnHost && options_.local_replicas != 1) {
      options::reject("local_replicas", options_.local_replicas,
                      "must be 1 for replicas on a device: a worker process drives the one GPU "
                      "at its local_rank");
    }
    options::require_positive("chunk_bytes", options_.chunk_bytes);
    options::require_positive("alignment", options_.alignment);
    if (kStaleness != 0 && options_.backup_workers != 0) {
      options::reject("backup_workers", options_.backup_workers,
                      "applies to consistency::Sync only (the others never wait for a step)");
    }
    if (options_.backup_workers >= static_cast<std::size_t>(workers_)) {
      options::reject("backup_workers", options_.backup_workers,
                      "must be less than the " + std::to_string(workers_) + " workers");
    }
    // A worker's device first: a process without its GPU fails before the rendezvous.
    if (!serves()) worker_place_.emplace(spec_, options_.timeout);
    const int rank = serves() ? workers_ + spec_.rank : spec_.rank;
    std::fprintf(stderr,
                 "cohort: %s; parameter server job: %d server(s), %d worker(s), %s, rank %d "
                 "of the mesh\n",
                 cluster::describe(spec_).c_str(), servers_, workers_,
                 std::string(C::kName).c_str(), rank);
    transport_ = std::make_unique<Transport>(
        detail::tcp_options(spec_, rank, workers_ + servers_, options_));
    if (serves()) transport_->isolate_peer_failures();
  }

  std::size_t replicas() const {
    return static_cast<std::size_t>(workers_) * options_.local_replicas;
  }
  // A server runs no replica (Trainer builds no model there; the server needs no device).
  std::size_t local_replicas() const { return serves() ? 0 : options_.local_replicas; }
  std::size_t first_local_replica() const {
    return serves() ? 0 : static_cast<std::size_t>(spec_.rank) * options_.local_replicas;
  }
  // This process's worker index (its mesh rank); meaningless on a server.
  int worker() const { return spec_.rank; }
  // Where this worker's replicas live (a worker's GPU and stream for device::Cuda).
  typename D::Place place(std::size_t /*local_index*/) const { return worker_place_->place(); }
  bool is_chief() const { return !serves() && spec_.rank == 0; }
  // Whether this process is a server: Trainer::fit then calls serve() instead of training.
  bool serves() const { return spec_.role == "ps"; }
  int servers() const { return servers_; }
  int workers() const { return workers_; }
  const cluster::Spec& cluster() const { return spec_; }
  const Options& options() const { return options_; }
  Transport& transport() { return *transport_; }

  // The layout of `elements` parameters of `element_bytes` each (detail/ps_protocol.hpp).
  const detail::ps::Layout& layout(std::size_t elements, std::size_t element_bytes) const {
    if (!layout_ || layout_->elements() != elements) {
      layout_.emplace(elements, element_bytes, servers_,
                      detail::ps::LayoutOptions{options_.min_shard_bytes, options_.alignment,
                                                options_.chunk_bytes});
    }
    return *layout_;
  }

  // On a server: serves one fit (its shard of the layout of `elements` parameters) and returns
  // when every worker is done or lost, keeping its shard for save(). What it did goes to stderr
  // in one line.
  template <class T, class O>
  void serve(std::size_t elements, const O& optimizer) {
    check_optimizer<T>(optimizer);
    const auto& shards = layout(elements, sizeof(T));
    detail::ps::Server<Transport, T, O> server(*transport_, shards,
                                               {.server = spec_.rank,
                                                .workers = workers_,
                                                .backup_workers = options_.backup_workers,
                                                .staleness = kStaleness,
                                                .log_pushes = options_.log_pushes},
                                               optimizer);
    const detail::ps::ServerCounts counts = server.serve();
    held_ = server.shard();
    std::string line = "cohort: parameter server " + std::to_string(spec_.rank) + " (" +
                       std::string(C::kName) + ", " +
                       std::to_string(shards.chunks_of(spec_.rank).size()) +
                       " chunks): pushes applied per worker " + list(counts.applied);
    if (options_.backup_workers != 0) line += ", dropped per worker " + list(counts.dropped);
    line += ", workers lost " + std::to_string(counts.lost.size());
    if (kStaleness != 0) {
      line += ", staleness {";
      bool first = true;
      for (const auto& [staleness, count] : counts.staleness) {
        line += (first ? "" : ", ") + std::to_string(staleness) + ": " + std::to_string(count);
        first = false;
      }
      line += "}";
    }
    std::fprintf(stderr, "%s\n", line.c_str());
  }

  // Trainer::restore: a server keeps its shard of the restored state, so that a save before the
  // next fit saves it (the next fit starts from the chief's copy, the same values).
  template <class T>
  void restored(const checkpoint::TrainingState<T>& state) {
    if (!serves()) return;
    const std::size_t elements = state.parameters.size();
    const auto& chunks = layout(elements, sizeof(T)).chunks_of(spec_.rank);
    checkpoint::ShardState<T> shard;
    shard.elements = elements;
    if (!chunks.empty()) {
      shard.begin = chunks.front().begin;
      shard.end = chunks.back().end;
    }
    const std::size_t length = shard.end - shard.begin;
    const auto own = std::span(state.parameters).subspan(shard.begin, length);
    shard.parameters.assign(own.begin(), own.end());
    for (std::size_t slot = 0; elements != 0 && slot < state.optimizer_state.size() / elements;
         ++slot) {
      const auto values =
          std::span(state.optimizer_state).subspan(slot * elements + shard.begin, length);
      shard.optimizer_state.insert(shard.optimizer_state.end(), values.begin(), values.end());
    }
    held_ = std::move(shard);
  }

  // Trainer::save: a sharded checkpoint (checkpoint/checkpoint.hpp). Every process calls it after
  // the same fit. The chief orders every server that holds a shard to write it beside `file`,
  // waits until each has reported its file durable, then writes the manifest `file` (which
  // removes the shard files of the manifest it replaced). A server writes the shard it holds,
  // from its last fit or restore. `state` holds the run's settings and step (no values: those
  // are the servers'), `elements` the model's parameter count. Other workers return at once.
  template <class T>
  void save(const std::filesystem::path& file, const checkpoint::TrainingState<T>& state,
            std::size_t elements) const {
    namespace ps = detail::ps;
    if (serves()) {
      save_shard<T>(file);
      return;
    }
    if (!is_chief()) return;
    const ps::Layout& shards = layout(elements, sizeof(T));
    const int holding = holders(elements, sizeof(T));
    std::random_device entropy;
    const ps::SaveOrder order{.step = state.step,
                              .token = std::uint64_t{entropy()} << 32 | entropy()};
    // Every server is ordered and answers (one beyond the shard count writes nothing), so that no
    // server waits for an order that never comes.
    std::vector<ps::SaveReport> reports(static_cast<std::size_t>(servers_));
    std::vector<transport::Send> sends;
    std::vector<transport::Receive> receives;
    for (int server = 0; server < servers_; ++server) {
      const int peer = workers_ + server;
      sends.push_back({peer, ps::header(ps::tag::kSaveOrder), std::as_bytes(std::span(&order, 1))});
      receives.push_back(
          {peer, ps::header(ps::tag::kSaveReport),
           std::as_writable_bytes(std::span(&reports[static_cast<std::size_t>(server)], 1))});
    }
    try {
      transport_->transfer(sends, receives);
    } catch (const CommError& error) {
      throw CommError(
          "checkpoint " + file.string() + ": the servers' shards were not all " +
          "written (every process must call Trainer::save after the same fit): " + error.what());
    }
    checkpoint::TrainingState<T> manifest = state;
    for (int server = 0; server < servers_; ++server) {
      const ps::SaveReport& report = reports[static_cast<std::size_t>(server)];
      if (report.status != 0) {
        throw CheckpointError("checkpoint " + file.string() + ": parameter server " +
                              std::to_string(server) +
                              " could not write its shard: " + report.message);
      }
      if (server >= holding) continue;
      const auto& chunks = shards.chunks_of(server);
      manifest.shards.push_back(
          {.file = checkpoint::shard_file_name(file, order.step, order.token,
                                               static_cast<std::size_t>(server),
                                               static_cast<std::size_t>(holding)),
           .begin = chunks.front().begin,
           .end = chunks.back().end,
           .crc32 = report.crc32});
    }
    checkpoint::write(file, manifest);
  }

  class Replica {
    using Staging = typename detail::ps::WorkerPlace<D>::Staging;

   public:
    std::size_t index() const { return index_; }
    Communicator& communicator() { return communicator_; }

    // The start of a fit (Trainer::train_replica): the chief initializes the servers with its
    // parameters, optimizer state and the run's step (so that a restored run's servers count
    // Adam's steps from it), then every worker's first replica pulls and hands the parameters
    // to the worker's other replicas.
    template <class T>
    void start(std::span<T> parameters, std::span<T> optimizer_state, std::uint64_t step) {
      if (speaks_for_worker_) begin(parameters, optimizer_state, step);
      local_.broadcast(parameters, 0);
    }

    // One step (strategy/strategy.hpp): the worker's replicas sum their gradients (the canonical
    // tree over them, a subtree of the tree over all replicas), the first pushes the sum and
    // pulls the new parameters, and hands them to the others. The push waits for the whole
    // gradient: begin_step and gradients_ready have nothing to start.
    template <class T, class O>
    void begin_step(Update<T, O>& /*update*/) {}
    template <class T, class O>
    void gradients_ready(Update<T, O>& /*update*/, std::size_t /*begin*/, std::size_t /*end*/) {}

    template <class T, class O>
    void finish_step(Update<T, O>& update) {
      owner_->template check_optimizer<T>(update.optimizer);
      local_.all_reduce(update.gradient_sum, ReduceOp::kSum);
      if (speaks_for_worker_) {
        // Sync: the servers clip the step's aggregate. Otherwise every push is applied alone,
        // so it is clipped here, by its own norm.
        double scale = update.inverse_batch;
        if (const double max_norm = update.optimizer.options().max_gradient_norm;
            kStaleness != 0 && max_norm > 0.0) {
          scale *= optimizer::clipping_factor(
              D::sum_of_squares(place_, std::span<const T>(update.gradient_sum)),
              update.inverse_batch, max_norm);
        }
        const std::span<T> gradient = host_copy(update.gradient_sum, gradient_staging_);
        const std::span<T> parameters = host_target(update.parameters, parameter_staging_);
        client_.exchange(
            {.operation = detail::ps::Operation::kPush,
             .step = update.step,
             .inverse_batch = scale,
             .element_bytes = sizeof(T),
             .slots = O::kStateSlots},
            [&](const detail::ps::Chunk& chunk) {
              return std::as_bytes(gradient.subspan(chunk.begin, chunk.size()));
            },
            [&](const detail::ps::Chunk& chunk) {
              return std::as_writable_bytes(parameters.subspan(chunk.begin, chunk.size()));
            });
        land(parameters, update.parameters);
      }
      local_.broadcast(update.parameters, 0);
    }

    // After the body returned: the chief pulls the optimizer state; every worker says done.
    void finish() {
      if (finish_) finish_();
    }

   private:
    friend class ParameterServer;
    Replica(ParameterServer& owner, std::size_t index, Communicator communicator,
            collective::LocalCommunicator local)
        : owner_(&owner),
          index_(index),
          place_(owner.place(0)),
          speaks_for_worker_(local.rank() == 0),
          communicator_(std::move(communicator)),
          local_(std::move(local)),
          client_(*owner.transport_, owner.layout_storage(), owner.worker(), owner.workers_) {}

    // The worker's side of the start of a fit (see start()), and what finish() will do.
    template <class T>
    void begin(std::span<T> at_place, std::span<T> state_at_place, std::uint64_t step) {
      const auto& shards = owner_->layout(at_place.size(), sizeof(T));
      const std::size_t slots = at_place.empty() ? 0 : state_at_place.size() / at_place.size();
      const auto none = [](const detail::ps::Chunk&) { return std::span<std::byte>(); };
      const bool chief = index_ == 0;
      // The work is done on host copies (on the host: the spans themselves), landed at the end.
      const std::span<T> parameters = host_copy(at_place, parameter_staging_);
      // Only the chief sends the optimizer state, and brings it home at the end.
      const std::span<T> optimizer_state =
          chief ? host_copy(state_at_place, state_staging_) : std::span<T>();
      if (chief) {
        staging_.clear();
        offsets_.clear();
        for (const auto& chunk : shards.chunks()) {
          offsets_.push_back(staging_.size());
          append<T>(parameters.subspan(chunk.begin, chunk.size()));
          for (std::size_t slot = 0; slot < slots; ++slot) {
            append<T>(
                optimizer_state.subspan(slot * parameters.size() + chunk.begin, chunk.size()));
          }
        }
        std::size_t next = 0;
        client_.exchange(
            {.operation = detail::ps::Operation::kInit,
             .step = step,
             .element_bytes = sizeof(T),
             .slots = slots},
            [&](const detail::ps::Chunk& chunk) {
              return std::span<const std::byte>(staging_).subspan(
                  offsets_[next++], (1 + slots) * chunk.size() * sizeof(T));
            },
            none);
      }
      client_.exchange(
          {.operation = detail::ps::Operation::kPull, .element_bytes = sizeof(T), .slots = slots},
          [](const detail::ps::Chunk&) { return std::span<const std::byte>(); },
          [&](const detail::ps::Chunk& chunk) {
            return std::as_writable_bytes(parameters.subspan(chunk.begin, chunk.size()));
          });
      land(parameters, at_place);
      // At the end of the fit, the chief brings the optimizer state home (the next fit starts
      // from it).
      finish_ = [this, parameters, optimizer_state, state_at_place, slots, chief, &shards] {
        if (chief && slots > 0) {
          staging_.resize(parameters.size() * slots * sizeof(T));
          client_.exchange(
              {.operation = detail::ps::Operation::kPullState,
               .element_bytes = sizeof(T),
               .slots = slots},
              [](const detail::ps::Chunk&) { return std::span<const std::byte>(); },
              [&](const detail::ps::Chunk& chunk) {
                return std::span(staging_).subspan(chunk.begin * slots * sizeof(T),
                                                   chunk.size() * slots * sizeof(T));
              });
          const auto* values = reinterpret_cast<const T*>(staging_.data());
          for (const auto& chunk : shards.chunks()) {
            for (std::size_t slot = 0; slot < slots; ++slot) {
              std::copy_n(values + chunk.begin * slots + slot * chunk.size(), chunk.size(),
                          optimizer_state.begin() +
                              static_cast<std::ptrdiff_t>(slot * parameters.size() + chunk.begin));
            }
          }
          land(optimizer_state, state_at_place);
        }
        client_.done();
      };
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

    ParameterServer* owner_;
    std::size_t index_;
    typename D::Place place_;
    bool speaks_for_worker_;  // the worker's first replica: the one that talks to the servers
    Communicator communicator_;
    collective::LocalCommunicator local_;  // among this worker's replicas
    detail::ps::Client<Transport> client_;
    std::vector<std::byte> staging_;
    std::vector<std::size_t> offsets_;
    // Host copies of device memory (unused on the host): what crosses every step in the place's
    // staging memory, the optimizer state (twice a fit, on the chief) in plain memory.
    Staging gradient_staging_, parameter_staging_;
    std::vector<std::byte> state_staging_;
    std::function<void()> finish_;
  };

  template <class Body>
  void run(Body&& body) {
    if (serves()) {
      throw ConfigError("ParameterServer::run: this process is parameter server " +
                        std::to_string(spec_.rank) +
                        "; it serves (Trainer::fit calls serve()) and runs no replica");
    }
    auto finishing_body = [&](Replica& replica) {
      body(replica);
      replica.finish();
    };
    const collective::Local::Options group{.ranks = static_cast<int>(options_.local_replicas),
                                           .timeout = options_.timeout};
    // Two groups of the worker's replicas: the Trainer's collectives and the replicas' steps.
    collective::Local trainer_group(group);
    collective::Local step_group(group);
    // Sync: the workers' part of the mesh, for the Trainer's collectives over every replica.
    std::optional<Cross> cross;
    std::optional<collective::CommunicationThread> thread;
    if constexpr (kStaleness == 0) {
      cross.emplace(detail::ps::WorkerView<Transport>(*transport_, workers_));
      thread.emplace();
    }
    detail::run_replica_threads(
        options_.local_replicas,
        [&](std::size_t local) {
          worker_place_->make_current();  // this thread drives the worker's device from here on
          const int rank = static_cast<int>(local);
          const auto on_host = [&] {
            if constexpr (kStaleness == 0) {
              return HostCommunicator(trainer_group.communicator(rank), *cross, *thread,
                                      options_.chunk_bytes);
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
                         step_group.communicator(rank));
        },
        finishing_body);
  }

 private:
  // "[a, b, c]"
  static std::string list(const std::vector<std::uint64_t>& counts) {
    std::string text = "[";
    for (std::size_t i = 0; i < counts.size(); ++i) {
      text += (i == 0 ? "" : ", ") + std::to_string(counts[i]);
    }
    return text + "]";
  }

  // Global-norm clipping under Sync composes the servers' block sums of squares
  // (detail/ps_server.hpp), so no shard or chunk boundary may split a block.
  template <class T, class O>
  void check_optimizer(const O& optimizer) const {
    if (kStaleness != 0 || optimizer.options().max_gradient_norm <= 0.0) return;
    const std::string why =
        " when clipping (max_gradient_norm > 0): shard and chunk boundaries "
        "must fall on the gradient norm's blocks of " +
        std::to_string(device::cpu::kNormBlock) + " elements";
    if (options_.alignment % device::cpu::kNormBlock != 0) {
      options::reject("alignment", options_.alignment,
                      "must be a multiple of " + std::to_string(device::cpu::kNormBlock) + why);
    }
    if (options_.chunk_bytes % (device::cpu::kNormBlock * sizeof(T)) != 0) {
      options::reject(
          "chunk_bytes", options_.chunk_bytes,
          "must be a multiple of " + std::to_string(device::cpu::kNormBlock * sizeof(T)) + why);
    }
  }

  // A server's half of save(): waits for the chief's order, writes the shard it holds (a server
  // beyond the shard count holds none), reports.
  template <class T>
  void save_shard(const std::filesystem::path& file) const {
    namespace ps = detail::ps;
    ps::SaveOrder order;
    const transport::Receive receive{0, ps::header(ps::tag::kSaveOrder),
                                     std::as_writable_bytes(std::span(&order, 1))};
    transport_->transfer({}, std::span(&receive, 1));
    const auto* held = std::get_if<checkpoint::ShardState<T>>(&held_);
    std::string failure;
    ps::SaveReport report;
    if (held == nullptr) {
      failure = "checkpoint " + file.string() + ": parameter server " + std::to_string(spec_.rank) +
                " holds no shard to save: call Trainer::save after a fit or a restore";
    } else if (held->begin != held->end) {
      checkpoint::ShardState<T> shard = *held;
      shard.step = order.step;
      try {
        report.crc32 = checkpoint::write(
            file.parent_path() / checkpoint::shard_file_name(
                                     file, order.step, order.token,
                                     static_cast<std::size_t>(spec_.rank),
                                     static_cast<std::size_t>(holders(held->elements, sizeof(T)))),
            shard);
      } catch (const CheckpointError& error) {
        failure = error.what();
      }
    }
    if (!failure.empty()) {
      report.status = 1;
      ps::set_message(report.message, failure);
    }
    const transport::Send send{0, ps::header(ps::tag::kSaveReport),
                               std::as_bytes(std::span(&report, 1))};
    transport_->transfer(std::span(&send, 1), {});
    if (!failure.empty()) throw CheckpointError(failure);
  }

  // The servers that hold a shard of `elements` parameters: 0 .. holders - 1 (the layout's rule).
  int holders(std::size_t elements, std::size_t element_bytes) const {
    const detail::ps::Layout& shards = layout(elements, element_bytes);
    int count = 0;
    while (count < servers_ && !shards.chunks_of(count).empty()) ++count;
    return count;
  }

  // The Client keeps a reference to the layout, which start() fills in before any request.
  detail::ps::Layout& layout_storage() {
    if (!layout_) layout_.emplace(0, 1, servers_, detail::ps::LayoutOptions{0, 1, 1});
    return *layout_;
  }

  Options options_;
  cluster::Spec spec_;
  int workers_ = 0;
  int servers_ = 0;
  std::unique_ptr<Transport> transport_;
  std::optional<detail::ps::WorkerPlace<D>> worker_place_;  // on a worker
  mutable std::optional<detail::ps::Layout> layout_;        // a cache of the layout of the model
  // A server's shard, from its last fit or restore, for save().
  std::variant<std::monostate, checkpoint::ShardState<float>, checkpoint::ShardState<double>> held_;
};

static_assert(Strategy<ParameterServer<>>);
static_assert(Strategy<ParameterServer<consistency::Async>>);

}  // namespace cohort::strategy
