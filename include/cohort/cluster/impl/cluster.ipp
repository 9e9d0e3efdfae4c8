// Definitions for cohort/cluster/cluster.hpp (core/compilation.hpp says where they compile).
#pragma once

#include "cohort/cluster/cluster.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
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

namespace detail {

COHORT_DECL std::optional<std::string> Reader::get(std::string_view name) const {
  std::optional<std::string> value = environment_(name);
  if (value && value->empty()) return std::nullopt;
  return value;
}

COHORT_DECL std::optional<int> Reader::integer(std::string_view name) const {
  const std::optional<std::string> value = get(name);
  if (!value) return std::nullopt;
  return parse_integer(name, *value);
}

COHORT_DECL std::optional<std::pair<int, int>> Reader::pair(std::string_view first,
                                                            std::string_view second) const {
  const std::optional<std::string> a = get(first);
  const std::optional<std::string> b = get(second);
  if (!a && !b) return std::nullopt;
  if (!b) reject_text(first, *a, std::string(second) + " is not set; the two come together");
  if (!a) reject_text(second, *b, std::string(first) + " is not set; the two come together");
  return std::pair{parse_integer(first, *a), parse_integer(second, *b)};
}

COHORT_DECL std::string equals(std::string_view name, long long value) {
  return std::string(name) + " = " + std::to_string(value);
}

// 1 <= size, 0 <= rank < size, and the same for the local pair, local size <= size.
COHORT_DECL void check_world(std::string_view rank_name, int rank, std::string_view size_name,
                             int size, std::string_view local_rank_name, int local_rank,
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

COHORT_DECL Reading make_reading(std::string_view source, const PairNames& names,
                                 std::pair<int, int> world,
                                 std::optional<std::pair<int, int>> local,
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

COHORT_DECL std::optional<Reading> read_explicit(const Explicit& given) {
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

COHORT_DECL std::optional<Reading> read_cohort(const Reader& reader) {
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
COHORT_DECL std::pair<int, int> local_position(const std::vector<std::string>& list,
                                               std::size_t index) {
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

COHORT_DECL std::optional<Reading> read_tf_config(const Reader& reader) {
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

COHORT_DECL std::optional<Reading> read_torchrun(const Reader& reader) {
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

// The first of Slurm's node lists `names` that is set, and its name.
COHORT_DECL std::optional<std::pair<std::string, std::vector<std::string>>> first_node_list(
    const Reader& reader, std::initializer_list<std::string_view> names) {
  for (const std::string_view name : names) {
    if (const auto list = reader.get(name)) {
      return std::pair{std::string(name), expand_node_list(*list, name)};
    }
  }
  return std::nullopt;
}

// The step's node list and the variable it came from, if Slurm gives one.
COHORT_DECL std::optional<std::pair<std::string, std::vector<std::string>>> slurm_nodes(
    const Reader& reader) {
  return first_node_list(reader, {"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"});
}

// Spec::hosts: COHORT_HOSTS, else the hosts of TF_CONFIG's tasks that train, else the allocation's
// nodes (a replacement step's own list names its node alone), each once, in order.
COHORT_DECL std::vector<std::string> job_hosts(const Spec& spec, const Reader& reader) {
  std::vector<std::string> hosts;
  const auto add = [&hosts](std::string host) {
    if (std::find(hosts.begin(), hosts.end(), host) == hosts.end()) hosts.push_back(std::move(host));
  };
  if (const auto listed = reader.get(variable::kHosts)) {
    std::string_view rest = *listed;
    for (int item = 1;; ++item) {
      const std::size_t comma = rest.find(',');
      add(parse_host(std::string(variable::kHosts) + " item " + std::to_string(item),
                     rest.substr(0, comma)));
      if (comma == std::string_view::npos) break;
      rest.remove_prefix(comma + 1);
    }
  } else if (!spec.workers.empty()) {
    for (const std::string& worker : spec.workers) add(parse_host_port(kTfConfigName, worker).host);
  } else if (const auto nodes = first_node_list(
                 reader, {"SLURM_JOB_NODELIST", "SLURM_NODELIST", "SLURM_STEP_NODELIST"})) {
    for (const std::string& node : nodes->second) add(node);
  }
  return hosts;
}

COHORT_DECL std::optional<Reading> read_open_mpi(const Reader& reader) {
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

COHORT_DECL std::optional<Reading> read_slurm(const Reader& reader) {
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

[[noreturn]] COHORT_DECL void reject_disagreement(const Reading& decided, const Reading& other) {
  const auto says = [](const Reading& reading) {
    return reading.spec.source + ": rank " + std::to_string(reading.spec.rank) + " of " +
           std::to_string(reading.spec.size) + " (" + reading.evidence + ")";
  };
  throw ConfigError("cluster sources disagree: " + says(decided) + "; " + says(other) +
                    ". The first decides (docs/launching.md, \"Precedence\"): unset the "
                    "variables that do not describe this launch");
}

// The rendezvous fields, each from the first place that has it (see the top of this file).
COHORT_DECL Spec settle(Reading reading, const Explicit& given, const Reader& reader) {
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
  spec.hosts = job_hosts(spec, reader);
  return spec;
}

}  // namespace detail

COHORT_DECL Spec resolve(const Explicit& given, const Environment& environment) {
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

COHORT_DECL int parameter_server_count(const Spec& spec) {
  if (!spec.parameter_servers.empty()) return static_cast<int>(spec.parameter_servers.size());
  return spec.ps_count;
}
COHORT_DECL int worker_count(const Spec& spec) {
  if (!spec.workers.empty()) return static_cast<int>(spec.workers.size());
  if (spec.worker_count > 0) return spec.worker_count;
  return spec.role == Role::kParameterServer ? 0 : spec.size;
}

COHORT_DECL std::string describe(const Spec& spec) {
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

COHORT_DECL void check_resolvable(const Spec& spec) {
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
