// A strategy's deadlines from the environment: COHORT_TIMEOUT and COHORT_CONNECT_TIMEOUT
// (cluster/environment.hpp, parse_duration), where the program leaves the Options defaults.
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <string_view>

#include "cohort/cluster/environment.hpp"

namespace cohort::strategy::detail {

// `options` with COHORT_TIMEOUT and COHORT_CONNECT_TIMEOUT applied to the fields the program left
// at their defaults (a value the program chose wins, as Options::bind_address beats
// COHORT_BIND_ADDRESS). A malformed or non-positive value is a ConfigError naming the variable,
// also where the program's value wins. StrategyOptions has timeout, and connect_timeout where
// the strategy connects processes.
template <class StrategyOptions>
StrategyOptions with_environment(StrategyOptions options, const cluster::Environment& environment =
                                                              cluster::process_environment()) {
  const StrategyOptions defaults{};
  const auto apply = [&](std::string_view name, std::chrono::milliseconds& field,
                         std::chrono::milliseconds default_value) {
    const std::optional<std::string> value = environment(name);
    if (!value || value->empty()) return;
    const std::chrono::milliseconds parsed = cluster::parse_duration(name, *value);
    if (field == default_value) field = parsed;
  };
  apply(cluster::variable::kTimeout, options.timeout, defaults.timeout);
  if constexpr (requires { options.connect_timeout; }) {
    apply(cluster::variable::kConnectTimeout, options.connect_timeout, defaults.connect_timeout);
  }
  return options;
}

}  // namespace cohort::strategy::detail
