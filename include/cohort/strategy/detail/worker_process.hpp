// The part of every multi-process strategy (MultiWorkerMirrored on CPUs and on GPUs,
// ParameterServer) that makes one process of a job, written once. Its lifecycle is three calls,
// in this order:
//
//   detail::WorkerProcess<Options> process(options, {Role::kWorker, Role::kChief},
//                                          "MultiWorkerMirrored");
//       COHORT_TIMEOUT, COHORT_CONNECT_TIMEOUT and COHORT_COMMUNICATION_PRIORITY applied to the
//       options (environment_options.hpp), the cluster resolved (cluster/cluster.hpp), the role
//       checked against the strategy's roles
//   Transport transport = process.connect<Transport>(mesh_rank, mesh_size, banner);
//       the transport's options (tcp_options.hpp: bind address, ports, secret, deadlines), the
//       start-up line, and the rendezvous: the transport is up when this returns
//   process.learn_local_ranks(all, mesh_rank, group);
//       where no launcher gave local ranks, this process's place among the ranks of its group
//       that share its host, over `all`, a collective over the whole mesh
//
// A process with a communication thread (collective/communication_thread.hpp) starts it with
// process.start_communication_thread() before connect, which then keeps its transport from
// spinning where the thread runs at real-time priority.
//
// Between the calls a strategy does what is its own (a GPU worker binds its device before the
// rendezvous where it can). The transport is the strategy's template parameter: any
// transport::Transport constructible from transport::tcp::Options, so that a shaped or emulated
// transport can stand in for transport::tcp::Tcp (ProcessTransport).
#pragma once

#include <sched.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <concepts>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <initializer_list>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "cohort/checkpoint/checkpoint.hpp"
#include "cohort/cluster/binding.hpp"
#include "cohort/cluster/cluster.hpp"
#include "cohort/collective/communication_thread.hpp"
#include "cohort/core/options.hpp"
#include "cohort/core/role.hpp"
#include "cohort/strategy/detail/environment_options.hpp"
#include "cohort/strategy/detail/tcp_options.hpp"
#include "cohort/transport/tcp/options.hpp"
#include "cohort/transport/transport.hpp"

namespace cohort::strategy {

// What a multi-process strategy asks of its transport: the transport contract, and construction
// from the TCP transport's options, which say who the process is and where it meets the others.
template <class T>
concept ProcessTransport = transport::Transport<T> &&
    std::constructible_from<T, transport::tcp::Options> && std::move_constructible<T>;

namespace detail {

template <class StrategyOptions>
class WorkerProcess {
 public:
  // Throws ConfigError naming the role when this process's is not one of `roles`.
  [[gnu::cold]] WorkerProcess(StrategyOptions options, std::initializer_list<Role> roles,
                              std::string_view strategy)
      : options_(with_environment(std::move(options))), spec_(cluster::resolve(options_.cluster)) {
    if (std::ranges::find(roles, spec_.role) != roles.end()) return;
    std::string names;
    for (const Role role : roles) {
      names += (names.empty() ? "" : ", ") + std::string(role_name(role));
    }
    options::reject(
        "role", role_name(spec_.role),
        std::string(strategy) + " runs " + names + " tasks only (" + spec_.source + ")");
  }

  // Prints the start-up line (`banner`, then where this process listens and why) and meets the
  // other `mesh_size` - 1 processes as mesh rank `mesh_rank`. transfer_timeout, where given,
  // replaces the options' timeout as the transport's operation_timeout. A process started again
  // for its place in a running mesh gives `rejoin_peers`, the ranks it takes it back at
  // (transport::tcp::Options::rejoin_peers), instead of joining through the door.
  template <ProcessTransport Transport>
  [[gnu::cold]] Transport connect(
      int mesh_rank, int mesh_size, const std::string& banner,
      std::optional<std::chrono::milliseconds> transfer_timeout = std::nullopt,
      std::vector<int> rejoin_peers = {}) {
    TcpSetup tcp = tcp_setup(spec_, mesh_rank, mesh_size, options_);
    if (transfer_timeout) tcp.options.operation_timeout = *transfer_timeout;
    if (!rejoin_peers.empty()) {
      tcp.options.rejoin_peers = std::move(rejoin_peers);
      tcp.options.joins_running_job = false;
    }
    // A real-time thread that spins keeps its core from the replica threads (sched_yield yields
    // to real-time threads only), where the normal thread's spin yields to them: between 2 hosts
    // the examples' MLP trained 10% faster with a real-time thread that sleeps at once, and no
    // faster than at normal priority with one that spins (docs/benchmarks.md, "Overlap across
    // hosts").
    if (realtime_thread_) tcp.options.spin = std::chrono::microseconds(0);
    announce(banner, tcp);
    binding_ = tcp.binding;
    return Transport(std::move(tcp.options));
  }

  // After connect: the local ranks from the rendezvous (tcp_options.hpp, learn_local_ranks).
  // Where a peer is lost meanwhile (CommError), the spec is as it was, for an elastic job's
  // regroup.
  template <class All>
  [[gnu::cold]] void learn_local_ranks(All& all, int mesh_rank, int group) {
    spec_ = detail::learn_local_ranks(all, spec_, binding_, mesh_rank, group);
  }

  // The process's communication thread, at options().communication_priority. Where kAuto leaves
  // it at normal priority, one line on stderr says why and what it costs.
  [[gnu::cold]] std::unique_ptr<collective::CommunicationThread> start_communication_thread() {
    auto thread = std::make_unique<collective::CommunicationThread>(
        options_.communication_priority,
        "communication_priority (or " + std::string(cluster::variable::kCommunicationPriority) +
            ")");
    if (!thread->refusal().empty()) {
      std::fprintf(stderr,
                   "cohort: rank %d: the communication thread runs at normal priority, so a "
                   "backward pass that keeps every core busy delays its transfers: %s "
                   "(docs/launching.md, \"Communication thread\")\n",
                   spec_.rank, thread->refusal().c_str());
    }
    realtime_thread_ = thread->realtime();
    return thread;
  }

  // After a regroup (transport/tcp/regroup.hpp): this process's rank and the job's size in the
  // new membership. Its local ranks are learned again (learn_local_ranks), since the launcher's
  // counted the workers lost.
  [[gnu::cold]] void regrouped(int rank, int size) {
    spec_.rank = rank;
    spec_.size = size;
    spec_.local_given = false;
  }

  const StrategyOptions& options() const { return options_; }
  const cluster::Spec& spec() const { return spec_; }
  // Where this process listens and why (cluster/binding.hpp), once connect has chosen it.
  const cluster::Binding& binding() const { return binding_; }

 private:
  StrategyOptions options_;
  cluster::Spec spec_;
  cluster::Binding binding_{};
  bool realtime_thread_ = false;  // the communication thread runs at real-time priority
};

// The CPUs that the processes of `all` (a collective over processes of one host) may run on
// together: the union of their affinity masks, which a launcher that pins each process to its
// own cores (mpirun, Slurm) makes disjoint, and which are all the host's otherwise.
template <class All>
[[gnu::cold]] int cpus_of_host(All& all) {
  cpu_set_t mine;
  CPU_ZERO(&mine);
  if (::sched_getaffinity(0, sizeof mine, &mine) != 0) CPU_SET(0, &mine);
  constexpr std::size_t kWords = sizeof(cpu_set_t) / sizeof(std::int64_t);
  std::array<std::int64_t, kWords> words;
  std::memcpy(words.data(), &mine, sizeof mine);
  std::vector<std::int64_t> every(kWords * static_cast<std::size_t>(all.size()));
  all.all_gather(std::span<const std::int64_t>(words), std::span<std::int64_t>(every));
  cpu_set_t host;
  CPU_ZERO(&host);
  for (std::size_t rank = 0; rank < static_cast<std::size_t>(all.size()); ++rank) {
    cpu_set_t theirs;
    std::memcpy(&theirs, every.data() + rank * kWords, sizeof theirs);
    CPU_OR(&host, &host, &theirs);
  }
  return CPU_COUNT(&host);
}

// After the chief's part of Trainer::save, on every process of a job that `cross` spans (rank 0
// the chief): the chief's outcome, "" when it wrote the checkpoint, else why not (its first 511
// bytes), so that save returns on every process only once the file is complete, and fails on
// every process when it is not.
template <class Cross>
std::string chief_save_outcome(Cross& cross, const std::filesystem::path& file,
                               std::string_view chief_failure) {
  std::array<char, 512> text{};
  if (cross.rank() == 0) chief_failure.copy(text.data(), text.size() - 1);
  std::array<std::int64_t, text.size() / sizeof(std::int64_t)> words;  // collectives move numbers
  std::memcpy(words.data(), text.data(), text.size());
  try {
    cross.broadcast(std::span<std::int64_t>(words), 0);
  } catch (const CommError& error) {
    throw checkpoint::save_incomplete(error, file,
                                      "the chief's outcome did not reach every process");
  }
  std::memcpy(text.data(), words.data(), text.size());
  text.back() = '\0';
  return std::string(text.data());
}

// A setting every process of the job that `cross` spans must be given alike (a collective): each
// process's `mine` gathered, and a difference a ConfigError on every process, naming `field`, this
// process's value and the first rank's that differs, each as text(values) writes it, and `remedy`.
template <class Cross, std::size_t N, class Text>
void require_same_across_processes(Cross& cross, std::string_view field,
                                   const std::array<std::int64_t, N>& mine, Text&& text,
                                   std::string_view remedy) {
  std::vector<std::int64_t> all(N * static_cast<std::size_t>(cross.size()));
  cross.all_gather(std::span<const std::int64_t>(mine), std::span<std::int64_t>(all));
  for (std::size_t rank = 0; rank * N < all.size(); ++rank) {
    std::array<std::int64_t, N> theirs;
    std::copy_n(all.begin() + static_cast<std::ptrdiff_t>(rank * N), N, theirs.begin());
    if (theirs != mine) {
      options::reject(
          field, text(mine),
          "rank " + std::to_string(rank) + " has " + text(theirs) + ": " + std::string(remedy));
    }
  }
}

}  // namespace detail
}  // namespace cohort::strategy
