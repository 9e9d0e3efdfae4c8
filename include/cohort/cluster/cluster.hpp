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

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "cohort/cluster/environment.hpp"
#include "cohort/cluster/slurm.hpp"
#include "cohort/cluster/tf_config.hpp"
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

  std::optional<std::string> get(std::string_view name) const {
    std::optional<std::string> value = environment_(name);
    if (value && value->empty()) return std::nullopt;
    return value;
  }

  std::optional<int> integer(std::string_view name) const {
    const std::optional<std::string> value = get(name);
    if (!value) return std::nullopt;
    return parse_integer(name, *value);
  }

  // Both of a pair, or neither; one alone is an error.
  std::optional<std::pair<int, int>> pair(std::string_view first, std::string_view second) const {
    const std::optional<std::string> a = get(first);
    const std::optional<std::string> b = get(second);
    if (!a && !b) return std::nullopt;
    if (!b) reject_text(first, *a, std::string(second) + " is not set; the two come together");
    if (!a) reject_text(second, *b, std::string(first) + " is not set; the two come together");
    return std::pair{parse_integer(first, *a), parse_integer(second, *b)};
  }

 private:
  const Environment& environment_;
};

inline std::string equals(std::string_view name, long long value) {
  return std::string(name) + " = " + std::to_string(value);
}

// 1 <= size, 0 <= rank < size, and the same for the local pair, local size <= size.
inline void check_world(std::string_view rank_name, int rank, std::string_view size_name, int size,
                        std::string_view local_rank_name, int local_rank,
                        std::string_view local_size_name, int local_size) {
  if (size < 1) reject_number(size_name, size, "must be at least 1");
  if (rank < 0) reject_number(rank_name, rank, "must not be negative");
  if (rank >= size) reject_number(rank_name, rank, "must be less than " + equals(size_name, size));
  if (local_size < 1) reject_number(local_size_name, local_size, "must be at least 1");
  if (local_rank < 0) reject_number(local_rank_name, local_rank, "must not be negative");
  if (local_rank >= local_size) {
    reject_number(local_rank_name, local_rank,
                  "must be less than " + equals(local_size_name, local_size));
  }
  if (local_size > size) {
    reject_number(local_size_name, local_size, "must not exceed " + equals(size_name, size));
  }
}

// The plain rank-and-size sources: COHORT_*, torchrun and Open MPI variables, explicit options.
struct PairNames {
  std::string_view rank, size, local_rank, local_size;
};

inline Reading make_reading(std::string_view source, const PairNames& names,
                            std::pair<int, int> world, std::optional<std::pair<int, int>> local,
                            std::pair<int, int> local_default) {
  const auto [rank, size] = world;
  const auto [local_rank, local_size] = local.value_or(local_default);
  check_world(names.rank, rank, names.size, size, names.local_rank, local_rank, names.local_size,
              local_size);
  Reading reading;
  reading.spec.rank = rank;
  reading.spec.size = size;
  reading.spec.local_rank = local_rank;
  reading.spec.local_size = local_size;
  reading.spec.task_index = rank;
  reading.spec.source = std::string(source);
  reading.evidence = equals(names.rank, rank) + ", " + equals(names.size, size);
  reading.size_evidence = equals(names.size, size);
  reading.local_evidence = equals(names.local_size, local_size);
  if (!local) {
    reading.local_evidence += " (not set)";
    reading.spec.local_given = size == 1;
  }
  return reading;
}

inline std::optional<Reading> read_explicit(const Explicit& given) {
  const PairNames names{"Explicit::rank", "Explicit::size", "Explicit::local_rank",
                        "Explicit::local_size"};
  const auto one_alone = [](std::string_view set, int value, std::string_view unset) {
    reject_number(set, value, std::string(unset) + " is not set; the two come together");
  };
  if (given.rank.has_value() != given.size.has_value()) {
    if (given.rank) one_alone(names.rank, *given.rank, names.size);
    one_alone(names.size, *given.size, names.rank);
  }
  if (given.local_rank.has_value() != given.local_size.has_value()) {
    if (given.local_rank) one_alone(names.local_rank, *given.local_rank, names.local_size);
    one_alone(names.local_size, *given.local_size, names.local_rank);
  }
  if (!given.rank) {
    if (given.local_rank) {
      reject_number(names.local_rank, *given.local_rank,
                    "given without Explicit::rank and Explicit::size");
    }
    return std::nullopt;
  }
  std::optional<std::pair<int, int>> local;
  if (given.local_rank) local = std::pair{*given.local_rank, *given.local_size};
  return make_reading(source::kExplicit, names, {*given.rank, *given.size}, local,
                      {*given.rank, *given.size});
}

inline std::optional<Reading> read_cohort(const Reader& reader) {
  const PairNames names{variable::kRank, variable::kWorldSize, variable::kLocalRank,
                        variable::kLocalWorldSize};
  const auto world = reader.pair(names.rank, names.size);
  const auto local = reader.pair(names.local_rank, names.local_size);
  if (!world) {
    if (local) {
      reject_number(names.local_rank, local->first,
                    "set without COHORT_RANK and COHORT_WORLD_SIZE");
    }
    return std::nullopt;
  }
  Reading reading = make_reading(source::kCohort, names, *world, local, *world);
  // The roles of a parameter-server job (environment.hpp, variable::kRole).
  if (const auto role = reader.get(variable::kRole)) {
    const std::optional<Role> named = role_named(*role);
    if (!named || named == Role::kEvaluator) {
      reject_text(variable::kRole, *role, "must be \"worker\", \"chief\" or \"ps\"");
    }
    reading.spec.role = *named;
  }
  const auto count = [&](std::string_view name) {
    const auto value = reader.integer(name);
    if (value && *value < 0) reject_number(name, *value, "must not be negative");
    return value.value_or(0);
  };
  reading.spec.ps_count = count(variable::kPsCount);
  reading.spec.worker_count = count(variable::kWorkerCount);
  if (reading.spec.role == Role::kParameterServer) {
    reading.spec.ps_count = reading.spec.size;
    if (reading.spec.worker_count == 0) {
      reject_text(variable::kWorkerCount, "", "must be set (> 0) for COHORT_ROLE = \"ps\"");
    }
  } else if (reading.spec.ps_count > 0) {
    reading.spec.worker_count = reading.spec.size;
  }
  return reading;
}

// The position of list[index] among the entries of `list` on its host, and their count.
inline std::pair<int, int> local_position(const std::vector<std::string>& list, std::size_t index) {
  const std::string host = parse_host_port("", list[index]).host;
  int local_rank = 0;
  int local_size = 0;
  for (std::size_t i = 0; i < list.size(); ++i) {
    if (parse_host_port("", list[i]).host != host) continue;
    if (i < index) ++local_rank;
    ++local_size;
  }
  return {local_rank, local_size};
}

inline std::optional<Reading> read_tf_config(const Reader& reader) {
  const std::optional<std::string> text = reader.get(kTfConfigName);
  if (!text) return std::nullopt;
  std::string squeezed;
  for (const char c : *text) {
    if (c != ' ' && c != '\t' && c != '\n' && c != '\r') squeezed += c;
  }
  if (squeezed.empty() || squeezed == "{}") return std::nullopt;  // TensorFlow: no cluster

  const TfConfig config = parse_tf_config(*text, kTfConfigName);
  Reading reading;
  Spec& spec = reading.spec;
  spec.source = std::string(source::kTfConfig);
  spec.role = *role_named(config.task_type);  // parse_tf_config knows only these names
  spec.task_index = config.task_index;
  spec.workers = config.chief;
  spec.workers.insert(spec.workers.end(), config.worker.begin(), config.worker.end());
  spec.parameter_servers = config.ps;
  const auto index = static_cast<std::size_t>(config.task_index);
  if (config.task_type == "chief" || config.task_type == "worker") {
    const std::size_t rank = config.task_type == "chief" ? 0 : config.chief.size() + index;
    spec.rank = static_cast<int>(rank);
    spec.size = static_cast<int>(spec.workers.size());
    std::tie(spec.local_rank, spec.local_size) = local_position(spec.workers, rank);
  } else {
    const auto& tasks = config.tasks_of(config.task_type);
    spec.rank = config.task_index;
    spec.size = tasks.empty() ? 1 : static_cast<int>(tasks.size());  // an unlisted evaluator
    if (!tasks.empty()) std::tie(spec.local_rank, spec.local_size) = local_position(tasks, index);
  }
  const HostPort master = parse_host_port(kTfConfigName, spec.workers.front());
  reading.master_address = master.host;
  reading.master_port = master.port;
  reading.evidence = std::string(kTfConfigName) + " task " + config.task_type + "[" +
                     std::to_string(config.task_index) + "]";
  return reading;
}

inline std::optional<Reading> read_torchrun(const Reader& reader) {
  const PairNames names{"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"};
  const auto world = reader.pair(names.rank, names.size);
  if (!world) return std::nullopt;
  Reading reading = make_reading(source::kTorchrun, names, *world,
                                 reader.pair(names.local_rank, names.local_size), {0, 1});
  if (const auto address = reader.get("MASTER_ADDR")) {
    reading.master_address = parse_host("MASTER_ADDR", *address);
  }
  if (const auto port_text = reader.get("MASTER_PORT")) {
    const std::uint16_t port = parse_port("MASTER_PORT", *port_text);
    // torchrun writes "True" or "False"; PyTorch itself compares with "True" exactly.
    if (reader.get("TORCHELASTIC_USE_AGENT_STORE") == "True") {
      // torchrun's agent already listens on MASTER_PORT: cohort takes the next port.
      if (port == 65535) {
        reject_number("MASTER_PORT", port,
                      "TORCHELASTIC_USE_AGENT_STORE is True, so cohort would listen on "
                      "MASTER_PORT + 1 = 65536; set COHORT_MASTER_PORT");
      }
      reading.master_port = static_cast<std::uint16_t>(port + 1);
    } else {
      reading.master_port = port;
    }
  }
  reading.job_id = reader.get("TORCHELASTIC_RUN_ID");
  return reading;
}

// The allocation's node list and the variable it came from, if Slurm gives one.
inline std::optional<std::pair<std::string, std::vector<std::string>>> slurm_nodes(
    const Reader& reader) {
  for (const std::string_view name :
       {"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"}) {
    if (const auto list = reader.get(name)) {
      return std::pair{std::string(name), expand_node_list(*list, name)};
    }
  }
  return std::nullopt;
}

inline std::optional<Reading> read_open_mpi(const Reader& reader) {
  const PairNames names{"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                        "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"};
  const auto world = reader.pair(names.rank, names.size);
  if (!world) return std::nullopt;
  Reading reading = make_reading(source::kOpenMpi, names, *world,
                                 reader.pair(names.local_rank, names.local_size), {0, 1});
  // mpirun inside a Slurm allocation places rank 0 on the allocation's first node.
  if (reading.spec.local_size < reading.spec.size) {
    if (const auto nodes = slurm_nodes(reader)) reading.master_address = nodes->second.front();
  }
  return reading;
}

inline std::optional<Reading> read_slurm(const Reader& reader) {
  const std::optional<std::string> procid = reader.get("SLURM_PROCID");
  if (!procid) return std::nullopt;
  const int rank = parse_integer("SLURM_PROCID", *procid);
  std::string_view size_name = "SLURM_NTASKS";
  std::optional<int> size = reader.integer(size_name);
  if (!size) {
    size_name = "SLURM_NPROCS";  // older Slurm
    size = reader.integer(size_name);
  }
  if (!size) reject_text("SLURM_PROCID", *procid, "SLURM_NTASKS is not set; the two come together");
  const int local_rank = reader.integer("SLURM_LOCALID").value_or(0);

  const auto nodes = slurm_nodes(reader);
  std::string local_evidence;
  int local_size = 0;
  std::string_view tasks_name = "SLURM_STEP_TASKS_PER_NODE";
  std::optional<std::string> tasks_text = reader.get(tasks_name);
  if (!tasks_text) tasks_text = reader.get(tasks_name = "SLURM_TASKS_PER_NODE");
  const std::optional<int> node = reader.integer("SLURM_NODEID");
  if (tasks_text && node) {
    const std::vector<int> tasks = expand_tasks_per_node(*tasks_text, tasks_name);
    if (*node < 0 || static_cast<std::size_t>(*node) >= tasks.size()) {
      reject_number("SLURM_NODEID", *node,
                    "out of range for " + std::string(tasks_name) + " = \"" + *tasks_text + "\"");
    }
    local_size = tasks[static_cast<std::size_t>(*node)];
  } else if (nodes && nodes->second.size() > 1) {
    // Without the per-node counts: block distribution, evenly split.
    const int count = static_cast<int>(nodes->second.size());
    local_size = std::max((*size + count - 1) / count, local_rank + 1);
  } else {
    local_size = *size;  // one node
  }
  const std::string local_size_name =
      tasks_text && node ? "local size (" + std::string(tasks_name) + ")" : "local size";
  const PairNames names{"SLURM_PROCID", size_name, "SLURM_LOCALID", local_size_name};
  Reading reading =
      make_reading(source::kSlurm, names, {rank, *size}, std::pair{local_rank, local_size}, {});
  if (nodes) reading.master_address = nodes->second.front();
  reading.job_id = reader.get("SLURM_JOB_ID");
  return reading;
}

[[noreturn]] inline void reject_disagreement(const Reading& decided, const Reading& other) {
  const auto says = [](const Reading& reading) {
    return reading.spec.source + ": rank " + std::to_string(reading.spec.rank) + " of " +
           std::to_string(reading.spec.size) + " (" + reading.evidence + ")";
  };
  throw ConfigError("cluster sources disagree: " + says(decided) + "; " + says(other) +
                    ". The first decides (docs/launching.md, \"Precedence\"): unset the "
                    "variables that do not describe this launch");
}

// The rendezvous fields, each from the first place that has it (see the top of this file).
inline Spec settle(Reading reading, const Explicit& given, const Reader& reader) {
  Spec spec = std::move(reading.spec);
  if (given.master_address) {
    spec.master_address = parse_host("Explicit::master_address", *given.master_address);
  } else if (const auto address = reader.get(variable::kMasterAddr)) {
    spec.master_address = parse_host(variable::kMasterAddr, *address);
  } else if (reading.master_address) {
    spec.master_address = *reading.master_address;
  } else if (spec.local_size == spec.size) {
    spec.master_address = "127.0.0.1";
  } else {
    throw ConfigError(std::string(variable::kMasterAddr) + ": not set, and the ranks span hosts (" +
                      reading.local_evidence + " < " + reading.size_evidence +
                      ") with no master address from " + spec.source +
                      "; set it to the host of rank 0");
  }
  if (given.master_port) {
    spec.master_port = require_port("Explicit::master_port", *given.master_port);
  } else if (const auto port = reader.get(variable::kMasterPort)) {
    spec.master_port = parse_port(variable::kMasterPort, *port);
  } else {
    spec.master_port = reading.master_port.value_or(kDefaultMasterPort);
  }
  if (given.job_id) {
    spec.job_id = *given.job_id;
  } else {
    spec.job_id = reader.get(variable::kJobId).value_or(reading.job_id.value_or(""));
  }
  return spec;
}

}  // namespace detail

// This process's Spec, from `given` and `environment` as the top of this file describes.
// Throws ConfigError for a malformed value in any source it reads, for disagreeing sources, and
// for ranks on several hosts with no known master address.
inline Spec resolve(const Explicit& given = {},
                    const Environment& environment = process_environment()) {
  const detail::Reader reader(environment);
  std::optional<detail::Reading> decided;
  const auto consider = [&](std::optional<detail::Reading> reading) {
    if (!reading) return;
    if (!decided) {
      decided = std::move(reading);
    } else if (reading->spec.rank != decided->spec.rank ||
               reading->spec.size != decided->spec.size) {
      detail::reject_disagreement(*decided, *reading);
    }
  };
  consider(detail::read_explicit(given));
  consider(detail::read_cohort(reader));
  consider(detail::read_tf_config(reader));
  consider(detail::read_torchrun(reader));
  consider(detail::read_open_mpi(reader));
  if (!decided) decided = detail::read_slurm(reader);
  if (!decided) {
    decided.emplace();
    decided->spec.source = std::string(source::kNone);
  }
  return detail::settle(std::move(*decided), given, reader);
}

// The parameter servers and the workers (chief included) of a job: from TF_CONFIG's lists, or
// from the COHORT_* role variables; 0 servers when the job has none.
inline int parameter_server_count(const Spec& spec) {
  if (!spec.parameter_servers.empty()) return static_cast<int>(spec.parameter_servers.size());
  return spec.ps_count;
}
inline int worker_count(const Spec& spec) {
  if (!spec.workers.empty()) return static_cast<int>(spec.workers.size());
  if (spec.worker_count > 0) return spec.worker_count;
  return spec.role == Role::kParameterServer ? 0 : spec.size;
}

// One line for the log: "rank 1 of 4 (local 1 of 4), role worker, master 127.0.0.1:29500,
// job 'abc', from torchrun variables".
inline std::string describe(const Spec& spec) {
  const std::string local = spec.local_given ? "local " + std::to_string(spec.local_rank) + " of " +
                                                   std::to_string(spec.local_size)
                                             : std::string("local from the rendezvous");
  std::string line = "rank " + std::to_string(spec.rank) + " of " + std::to_string(spec.size) +
                     " (" + local + "), role " + std::string(role_name(spec.role)) + ", master " +
                     format_host_port(spec.master_address, spec.master_port) + ", ";
  line += spec.job_id.empty() ? std::string("no job id") : "job '" + spec.job_id + "'";
  line += ", from " + spec.source;
  return line;
}

// Asks the system resolver about the master address and every listed address of `spec`; throws
// a ConfigError naming the first that has no address. For programs that want a typo in a host
// list reported at start rather than as a rendezvous timeout.
inline void check_resolvable(const Spec& spec) {
  const std::string from = " (from " + spec.source + ")";
  check_resolvable("master address" + from, spec.master_address);
  const auto check_list = [&](std::string_view list_name, const std::vector<std::string>& list) {
    for (std::size_t i = 0; i < list.size(); ++i) {
      const std::string name = std::string(list_name) + "[" + std::to_string(i) + "]" + from;
      check_resolvable(name, parse_host_port(name, list[i]).host);
    }
  };
  check_list("workers", spec.workers);
  check_list("parameter_servers", spec.parameter_servers);
}

}  // namespace cohort::cluster
