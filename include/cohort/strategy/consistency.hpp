// Consistency models of the parameter server (strategy/parameter_server.hpp): how far a worker may
// run ahead of the others. One rule, one number K:
//
//   a worker's pull is answered once it is at most K steps ahead of the slowest live worker.
//
//   consistency::Sync                  K = 0. No worker is ever ahead, so all pushes of a step are
//                                      there together: the server sums them in the canonical
//                                      tree over worker indices and applies the optimizer once,
//                                      exactly as the mirrored strategies do (the same bits).
//   consistency::BoundedStaleness<K>   K >= 1. Each push is applied on arrival; a worker more than
//                                      K steps ahead of the slowest live worker waits in its pull.
//   consistency::Async                 K unbounded. Each push is applied on arrival, exactly once,
//                                      and a pull never waits.
//
// "Live" excludes workers that were lost (dead, or silent for the strategy's timeout while a
// server waited on them) or have finished, so one dead or stopped worker never blocks the others
// for longer than the timeout. The server takes the model as a template parameter
// (parameter_server/server.hpp): nothing tests K at run time.
#pragma once

#include <cstdint>
#include <limits>
#include <string_view>

namespace cohort::strategy::consistency {

inline constexpr std::uint64_t kUnbounded = std::numeric_limits<std::uint64_t>::max();

template <std::uint64_t K>
struct BoundedStaleness {
  static constexpr std::uint64_t kStaleness = K;
  static constexpr std::string_view kName = K == 0 ? std::string_view("sync")
                                            : K == kUnbounded
                                                ? std::string_view("async")
                                                : std::string_view("bounded_staleness");
};

using Sync = BoundedStaleness<0>;
using Async = BoundedStaleness<kUnbounded>;

template <class C>
concept Consistency = requires {
  { C::kStaleness } -> std::convertible_to<std::uint64_t>;
  { C::kName } -> std::convertible_to<std::string_view>;
};

}  // namespace cohort::strategy::consistency
