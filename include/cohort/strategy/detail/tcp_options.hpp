// The TCP transport's options for a strategy's process: who it is comes from the cluster
// description; where it listens and the shared secret from the strategy's options, else from
// COHORT_BIND_ADDRESS and COHORT_SECRET; its deadlines from the strategy's options.
#pragma once

#include <cstdlib>
#include <string>

#include "cohort/cluster/cluster.hpp"
#include "cohort/transport/tcp/options.hpp"

namespace cohort::strategy::detail {

// The variable's value, or fallback when it is unset or empty.
inline std::string environment_or(const char* variable, const std::string& fallback) {
  const char* value = std::getenv(variable);
  return value != nullptr && *value != '\0' ? value : fallback;
}

inline std::string given_or_environment(const std::string& given, const char* variable,
                                        const char* fallback) {
  return given.empty() ? environment_or(variable, fallback) : given;
}

// StrategyOptions has bind_address, secret, connect_timeout and timeout.
template <class StrategyOptions>
transport::tcp::Options tcp_options(const cluster::Spec& spec, int rank, int size,
                                    const StrategyOptions& options) {
  return {
      .rank = rank,
      .size = size,
      .job_id = spec.job_id.empty() ? "cohort" : spec.job_id,
      .rendezvous_host = spec.master_address,
      .rendezvous_port = spec.master_port,
      .bind_address =
          given_or_environment(options.bind_address, "COHORT_BIND_ADDRESS", "127.0.0.1"),
      .secret = given_or_environment(options.secret, "COHORT_SECRET", ""),
      .connect_timeout = options.connect_timeout,
      .operation_timeout = options.timeout,
  };
}

}  // namespace cohort::strategy::detail
