// Slurm's compressed lists, expanded.
//
//   expand_node_list("node[01-03,07],gpu5,rack[1-2]-n[1-2]")
//     node01 node02 node03 node07 gpu5 rack1-n1 rack1-n2 rack2-n1 rack2-n2
//
//   A list is comma-separated host expressions; a host expression is text with bracket groups,
//   each a comma-separated list of numbers and ranges lo-hi (lo <= hi). A number keeps the width
//   of lo ("[08-11]" gives 08 09 10 11). Several groups multiply, the first varying slowest, as
//   `scontrol show hostnames` prints them. Order and duplicates are kept: the first host is the
//   first node of the allocation.
//
//   expand_tasks_per_node("2(x3),1")  ->  2 2 2 1    (SLURM_TASKS_PER_NODE, one entry per node)
//
// Malformed input is a ConfigError naming the variable, the value and what is wrong where.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "cohort/cluster/environment.hpp"
#include "cohort/core/compilation.hpp"

namespace cohort::cluster {

// Expansion stops here rather than exhaust memory on "n[0-999999999]".
inline constexpr std::size_t kMaxExpandedNodes = std::size_t{1} << 20;

// The hosts of a Slurm node list (SLURM_JOB_NODELIST), in order. `name` is the variable the list
// came from, for the error message.
COHORT_DECL std::vector<std::string> expand_node_list(std::string_view value,
                                                      std::string_view name = "node list");

// The tasks on each node, from SLURM_TASKS_PER_NODE's "2(x3),1" form.
COHORT_DECL std::vector<int> expand_tasks_per_node(std::string_view value,
                                                   std::string_view name = "SLURM_TASKS_PER_NODE");

}  // namespace cohort::cluster

#if !defined(COHORT_SEPARATE_COMPILATION)
#include "cohort/cluster/impl/slurm.ipp"
#endif
