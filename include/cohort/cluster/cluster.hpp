// Who is who: this process's rank, the world size and where rank 0 listens, resolved from
// whichever launcher started the process.
//
//   const cohort::cluster::Spec spec = cohort::cluster::resolve();
//   std::clog << cohort::cluster::describe(spec) << '\n';
//   // rank 1 of 4 (local 1 of 4), role worker, master 127.0.0.1:29500, job 'abc',
//   // from torchrun variables
//
// Sources, in this order; the first one present decides (docs/launching.md has the commands):
//
//   1. Explicit options      present when Explicit::rank or Explicit::size is set
//   2. COHORT_* variables    COHORT_RANK, COHORT_WORLD_SIZE [, COHORT_LOCAL_RANK,
//                            COHORT_LOCAL_WORLD_SIZE]; set by cohort-run, or by hand
//   3. TF_CONFIG             JSON (tf_config.hpp); chief is rank 0, workers follow; a ps or
//                            evaluator task has role "ps" or "evaluator" and its rank among those
//   4. torchrun, PyTorchJob  RANK, WORLD_SIZE [, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR,
//                            MASTER_PORT, TORCHELASTIC_RUN_ID]
//   5. Open MPI              OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE [, ..._LOCAL_RANK,
//                            ..._LOCAL_SIZE]
//   6. Slurm                 SLURM_PROCID, SLURM_NTASKS [, SLURM_LOCALID, SLURM_NODEID,
//                            SLURM_STEP_TASKS_PER_NODE or SLURM_TASKS_PER_NODE,
//                            SLURM_STEP_NODELIST or SLURM_JOB_NODELIST, SLURM_JOB_ID]
//   7. none of them          a single process: rank 0 of 1
//
// A variable set to the empty string counts as not set. Rank and size come as a pair: one
// without the other is an error, and so is a local rank without a local size. Where a source
// leaves the local pair out, it is the global pair for sources 1 and 2 (all ranks on one host) and
// 0 of 1 for 4 and 5 (one process per pod or slot) until a strategy learns it at the rendezvous
// (Spec::local_given is then false, and describe() says "local from the rendezvous").
//
// Cross-check: every later source among 1 to 5 that is also present is read too, and if it gives
// a different rank or size, resolve throws a ConfigError naming both sources and their values.
// Slurm is not compared: its variables describe the allocation, and every launcher started inside
// one (srun torchrun, mpirun or cohort-run in a batch script) inherits them with other numbers.
//
// Rendezvous fields, each decided on its own, the first that has it:
//   master address  Explicit::master_address, COHORT_MASTER_ADDR, the source's own (TF_CONFIG: the
//                   chief, else worker 0; torchrun: MASTER_ADDR; Open MPI in a Slurm allocation and
//                   Slurm: the first node of the node list), 127.0.0.1 when every rank is local
//                   (local size == size); otherwise a ConfigError asking for COHORT_MASTER_ADDR.
//   master port     Explicit::master_port, COHORT_MASTER_PORT, the source's own (TF_CONFIG: the
//                   chief's or worker 0's port; torchrun: MASTER_PORT, or MASTER_PORT + 1 when
//                   TORCHELASTIC_USE_AGENT_STORE=True, since torchrun's agent store already listens
//                   on MASTER_PORT), 29500.
//   job id          Explicit::job_id, COHORT_JOB_ID, TORCHELASTIC_RUN_ID or SLURM_JOB_ID, "".
//
// Every malformed value is a ConfigError naming the variable and the value (docs/launching.md,
// "Failure signatures", lists each form). resolve never touches the network; check_resolvable
// asks the system resolver about every host of a Spec, when the program wants that checked early.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "cohort/cluster/environment.hpp"
#include "cohort/cluster/slurm.hpp"
#include "cohort/cluster/tf_config.hpp"
#include "cohort/core/compilation.hpp"
#include "cohort/core/error.hpp"
#include "cohort/core/role.hpp"

namespace cohort::cluster {

// Who this process is, and where the group meets.
struct Spec {
  int rank = 0;        // among the processes of its role: 0 <= rank < size
  int size = 1;        // chief plus workers for role "chief" and "worker"
  int local_rank = 0;  // among the processes of its role on this host (picks the GPU)
  int local_size = 1;
  // Whether the source gave the local pair. Where it did not (COHORT_*, torchrun or Open MPI
  // variables, explicit options without one), the pair above is a stand-in (see the top of this
  // file) until a strategy learns it at the rendezvous: the ranks of a role that share an own
  // address share a host (strategy/detail/tcp_options.hpp, learn_local_ranks).
  bool local_given = true;
  Role role = Role::kWorker;
  int task_index = 0;  // index within its TF_CONFIG task type; else rank
  // "host:port" of every rank, where the source lists them (TF_CONFIG): workers[r] is rank r
  // (the chief first), parameter_servers[i] is ps task i.
  std::vector<std::string> workers;
  std::vector<std::string> parameter_servers;
  std::string master_address = "127.0.0.1";  // where rank 0 listens for the rendezvous
  std::uint16_t master_port = kDefaultMasterPort;
  // The job's hosts, each once, in the order the launch lists them: COHORT_HOSTS, else TF_CONFIG's
  // chief and workers, else Slurm's allocation (SLURM_JOB_NODELIST); empty where none does. A
  // process that joins a running elastic job looks for its door at each, at master_port, after
  // master_address: once the job's first rank 0 is lost, the next opens the door on its own host.
  std::vector<std::string> hosts;
  std::string job_id;  // "" when no source names the job
  std::string source;  // which source decided, as describe() prints it
  // A parameter-server job described by COHORT_* variables (no address lists): the number of
  // servers and of workers (chief included), from COHORT_PS_COUNT, COHORT_WORKER_COUNT and the
  // process's own role and size; 0 when not given. parameter_server_count() and worker_count()
  // below read either form.
  int ps_count = 0;
  int worker_count = 0;

  friend bool operator==(const Spec&, const Spec&) = default;
};

// What a program may decide itself, ahead of every environment variable. Set rank and size
// together (that makes this source present); the other fields apply whichever source decides.
// master_port is an int so that a wrong value is reported rather than wrapped.
struct Explicit {
  std::optional<int> rank = std::nullopt;
  std::optional<int> size = std::nullopt;
  std::optional<int> local_rank = std::nullopt;  // with local_size; default: rank and size
  std::optional<int> local_size = std::nullopt;  // (one host)
  std::optional<std::string> master_address = std::nullopt;
  std::optional<int> master_port = std::nullopt;
  std::optional<std::string> job_id = std::nullopt;
};

// The names of the sources, as Spec::source and the messages give them.
namespace source {
inline constexpr std::string_view kExplicit = "explicit options";
inline constexpr std::string_view kCohort = "COHORT_* variables";
inline constexpr std::string_view kTfConfig = "TF_CONFIG";
inline constexpr std::string_view kTorchrun = "torchrun variables";
inline constexpr std::string_view kOpenMpi = "Open MPI variables";
inline constexpr std::string_view kSlurm = "Slurm variables";
inline constexpr std::string_view kNone = "defaults (no launcher variables)";
}  // namespace source

namespace detail {

inline constexpr std::string_view kTfConfigName = "TF_CONFIG";

// What one source says, before the rendezvous fields are settled.
struct Reading {
  Spec spec;  // rank, size, local pair, role, task index, address lists, source
  std::optional<std::string> master_address;
  std::optional<std::uint16_t> master_port;
  std::optional<std::string> job_id;
  std::string evidence;        // "RANK = 0, WORLD_SIZE = 4": the values behind rank and size
  std::string size_evidence;   // "WORLD_SIZE = 4"
  std::string local_evidence;  // "LOCAL_WORLD_SIZE = 2": with size_evidence, "spans hosts"
};

// Environment lookups that treat an empty value as unset.
class Reader {
 public:
  explicit Reader(const Environment& environment) : environment_(environment) {}

  COHORT_DECL std::optional<std::string> get(std::string_view name) const;

  COHORT_DECL std::optional<int> integer(std::string_view name) const;

  // Both of a pair, or neither; one alone is an error.
  COHORT_DECL std::optional<std::pair<int, int>> pair(std::string_view first,
                                                      std::string_view second) const;

 private:
  const Environment& environment_;
};

// The plain rank-and-size sources: COHORT_*, torchrun and Open MPI variables, explicit options.
struct PairNames {
  std::string_view rank, size, local_rank, local_size;
};

}  // namespace detail

// This process's Spec, from `given` and `environment` as the top of this file describes.
// Throws ConfigError for a malformed value in any source it reads, for disagreeing sources, and
// for ranks on several hosts with no known master address.
COHORT_DECL Spec resolve(const Explicit& given = {},
                         const Environment& environment = process_environment());

// The parameter servers and the workers (chief included) of a job: from TF_CONFIG's lists, or
// from the COHORT_* role variables; 0 servers when the job has none.
COHORT_DECL int parameter_server_count(const Spec& spec);
COHORT_DECL int worker_count(const Spec& spec);

// One line for the log: "rank 1 of 4 (local 1 of 4), role worker, master 127.0.0.1:29500,
// job 'abc', from torchrun variables".
COHORT_DECL std::string describe(const Spec& spec);

// Asks the system resolver about the master address and every listed address of `spec`; throws
// a ConfigError naming the first that has no address. For programs that want a typo in a host
// list reported at start rather than as a rendezvous timeout.
COHORT_DECL void check_resolvable(const Spec& spec);

}  // namespace cohort::cluster

#if !defined(COHORT_SEPARATE_COMPILATION)
#include "cohort/cluster/impl/cluster.ipp"
#endif
