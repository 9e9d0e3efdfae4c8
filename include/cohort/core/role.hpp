// Role: the part a process plays in a job (cluster::Spec::role), in core so that the Trainer
// can name it without the cluster description's dependencies.
#pragma once

#include <optional>
#include <string_view>

namespace cohort {

// The part a process plays in a job, with TF_CONFIG's task types as its names: chief and workers
// train (the chief is worker 0 of MultiWorkerMirrored), parameter servers hold the variables of a
// ParameterServer job, an evaluator evaluates on its own.
enum class Role { kWorker, kChief, kParameterServer, kEvaluator };

// "worker", "chief", "ps", "evaluator": what TF_CONFIG and COHORT_ROLE call them.
inline std::string_view role_name(Role role) {
  switch (role) {
    case Role::kWorker:
      return "worker";
    case Role::kChief:
      return "chief";
    case Role::kParameterServer:
      return "ps";
    case Role::kEvaluator:
      return "evaluator";
  }
  return "unknown";
}

inline std::optional<Role> role_named(std::string_view name) {
  for (const Role role : {Role::kWorker, Role::kChief, Role::kParameterServer, Role::kEvaluator}) {
    if (role_name(role) == name) return role;
  }
  return std::nullopt;
}

}  // namespace cohort
