// Slurm's compressed lists: the first byte picks what the rest is, a node list
// (expand_node_list), a tasks-per-node list (expand_tasks_per_node), or the variables of a Slurm
// step, resolved as a process inside it resolves them. Every refusal is a ConfigError; an
// expansion never exceeds kMaxExpandedNodes and never yields an empty host or count.
#include <cohort/cluster/cluster.hpp>
#include <cohort/cluster/slurm.hpp>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "fuzz_input.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  namespace cluster = cohort::cluster;
  cohort::fuzz::FuzzInput input(data, size);
  const auto mode = input.take<std::uint8_t>() % 3;
  try {
    if (mode == 0) {
      const auto hosts = cluster::expand_node_list(input.rest(), "SLURM_JOB_NODELIST");
      if (hosts.empty() || hosts.size() > cluster::kMaxExpandedNodes) std::abort();
      for (const auto& host : hosts) {
        if (host.empty()) std::abort();
      }
    } else if (mode == 1) {
      const auto tasks = cluster::expand_tasks_per_node(input.rest());
      if (tasks.empty() || tasks.size() > cluster::kMaxExpandedNodes) std::abort();
      for (const int count : tasks) {
        if (count < 1) std::abort();
      }
    } else {
      cluster::Variables variables;
      for (const char* name : {"SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NODEID",
                               "SLURM_TASKS_PER_NODE", "SLURM_JOB_ID"}) {
        if (std::string value = input.take_string(24); !value.empty()) variables[name] = value;
      }
      variables["SLURM_JOB_NODELIST"] = std::string(input.rest());
      const cluster::Spec spec = cluster::resolve({}, cluster::environment_from(variables));
      if (spec.rank < 0 || spec.rank >= spec.size || spec.local_rank < 0 ||
          spec.local_rank >= spec.local_size) {
        std::abort();
      }
    }
  } catch (const cohort::ConfigError&) {
  }
  return 0;
}
