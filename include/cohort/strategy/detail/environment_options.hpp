// A strategy's options from the environment, where the program leaves the Options defaults:
// COHORT_TIMEOUT and COHORT_CONNECT_TIMEOUT (cluster/environment.hpp, parse_duration),
// COHORT_COMMUNICATION_PRIORITY (auto, normal or realtime: collective/thread_priority.hpp)
// COHORT_SHARED_MEMORY (0 or 1: cluster::parse_switch), COHORT_WIRE (fp32, bf16 or fp16:
// collective/wire.hpp), COHORT_SHARE_UPDATE_FROM (bytes), COHORT_MIN_WORKERS and
// COHORT_MAX_WORKERS (counts: strategy/elastic.hpp), COHORT_JOIN (0 or 1).
#pragma once

#include <chrono>
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

#include "cohort/cluster/environment.hpp"
#include "cohort/collective/thread_priority.hpp"
#include "cohort/collective/wire.hpp"

namespace cohort::strategy::detail {

// The priority a variable names; a ConfigError naming the variable for anything else.
inline collective::ThreadPriority parse_thread_priority(std::string_view name,
                                                        std::string_view value) {
  for (const collective::ThreadPriority priority :
       {collective::ThreadPriority::kAuto, collective::ThreadPriority::kNormal,
        collective::ThreadPriority::kRealtime}) {
    if (value == collective::name(priority)) return priority;
  }
  cluster::detail::reject_text(name, value, "expected auto, normal or realtime");
}

// The format a variable names; a ConfigError naming the variable for anything else.
inline collective::Wire parse_wire(std::string_view name, std::string_view value) {
  for (const collective::Wire wire :
       {collective::Wire::kFloat32, collective::Wire::kBfloat16, collective::Wire::kFloat16}) {
    if (value == collective::name(wire)) return wire;
  }
  cluster::detail::reject_text(name, value, "expected fp32, bf16 or fp16");
}

// `options` with the variables above applied to the fields the program left at their defaults (a
// value the program chose wins, as Options::bind_address beats COHORT_BIND_ADDRESS). A malformed
// value is a ConfigError naming the variable, also where the program's value wins.
// StrategyOptions has timeout, connect_timeout where the strategy connects processes, and
// communication_priority where it has a communication thread, shared_memory where its processes
// can all-reduce through shared memory, wire where its gradient crosses between them,
// share_update_from_bytes where its workers may share the update, elastic where its job may go on
// without a lost worker; where it has no elastic, an elastic variable set (not 0) is a ConfigError.
template <class StrategyOptions>
StrategyOptions with_environment(StrategyOptions options, const cluster::Environment& environment =
                                                              cluster::process_environment()) {
  const StrategyOptions defaults{};
  const auto apply = [&](std::string_view name, auto& field, const auto& default_value,
                         auto parse) {
    const std::optional<std::string> value = environment(name);
    if (!value || value->empty()) return;
    const auto parsed = parse(name, *value);
    if (field == default_value) field = parsed;
  };
  apply(cluster::variable::kTimeout, options.timeout, defaults.timeout, cluster::parse_duration);
  if constexpr (requires { options.connect_timeout; }) {
    apply(cluster::variable::kConnectTimeout, options.connect_timeout, defaults.connect_timeout,
          cluster::parse_duration);
  }
  if constexpr (requires { options.communication_priority; }) {
    apply(cluster::variable::kCommunicationPriority, options.communication_priority,
          defaults.communication_priority, parse_thread_priority);
  }
  if constexpr (requires { options.shared_memory; }) {
    apply(cluster::variable::kSharedMemory, options.shared_memory, defaults.shared_memory,
          cluster::parse_switch);
  }
  if constexpr (requires { options.wire; }) {
    apply(cluster::variable::kWire, options.wire, defaults.wire, parse_wire);
  }
  const auto parse_count = [](std::string_view name, std::string_view value) {
    const int count = cluster::parse_integer(name, value);
    if (count < 0) cluster::detail::reject_text(name, value, "expected a count, 0 or more");
    return static_cast<std::size_t>(count);
  };
  if constexpr (requires { options.share_update_from_bytes; }) {
    apply(cluster::variable::kShareUpdateFrom, options.share_update_from_bytes,
          defaults.share_update_from_bytes, parse_count);
  }
  if constexpr (requires { options.elastic; }) {
    apply(cluster::variable::kMinWorkers, options.elastic.min_workers, defaults.elastic.min_workers,
          parse_count);
    apply(cluster::variable::kMaxWorkers, options.elastic.max_workers, defaults.elastic.max_workers,
          parse_count);
    apply(cluster::variable::kJoin, options.elastic.joins_running_job,
          defaults.elastic.joins_running_job, cluster::parse_switch);
  } else {
    // A launcher that makes the job elastic (cohort-run --min-np) would otherwise see every
    // process fail at the first loss, and a process started again find no job to join.
    const auto refuse = [&](std::string_view name, auto parse, const auto& off) {
      const std::optional<std::string> value = environment(name);
      if (!value || value->empty() || parse(name, *value) == off) return;
      cluster::detail::reject_text(
          name, *value,
          "this strategy's job cannot go on without a lost worker (elastic jobs: "
          "MultiWorkerMirrored and ParameterServer, on CPUs and GPUs; not Mirrored); unset it, "
          "or start the job again whole after a failure (cohort-run --max-restarts without "
          "--min-np)");
    };
    refuse(cluster::variable::kMinWorkers, parse_count, std::size_t{0});
    refuse(cluster::variable::kMaxWorkers, parse_count, std::size_t{0});
    refuse(cluster::variable::kJoin, cluster::parse_switch, false);
  }
  return options;
}

}  // namespace cohort::strategy::detail
