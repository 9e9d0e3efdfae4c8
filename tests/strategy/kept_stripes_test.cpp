// The state an elastic job keeps for a lost worker (strategy/detail/kept_stripes.hpp): a process's
// own copies of the whole state, as workers that share no memory keep them, rebuilt after the step
// each holds, the two copies alternating; and the stripes of several workers in their shared
// buffers, each rebuilt from its owner's.
#include <doctest/doctest.h>

#include <cohort/strategy/detail/kept_stripes.hpp>
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <span>
#include <vector>

namespace {

using cohort::strategy::detail::KeptStripes;
using cohort::strategy::detail::OwnCopies;
using cohort::strategy::detail::rebuild_from_kept_state;
using cohort::strategy::detail::StripeLayout;

// Parameters and optimizer state whose every element says the step and its place.
struct State {
  std::vector<float> parameters;
  std::vector<float> state;
  State(std::size_t count, std::size_t slots, std::uint64_t step)
      : parameters(count), state(count * slots) {
    std::iota(parameters.begin(), parameters.end(), static_cast<float>(step * 1000));
    std::iota(state.begin(), state.end(), static_cast<float>(step * 1000 + 500));
  }
};

// Every rank's shared buffer, as collective::SharedBuffers gives them.
struct Buffers {
  std::vector<std::vector<float>> of_rank;
  int ranks() const { return static_cast<int>(of_rank.size()); }
  template <class E>
  std::span<const E> of(int rank, std::size_t count) const {
    return std::span<const float>(of_rank[static_cast<std::size_t>(rank)]).first(count);
  }
};

}  // namespace

TEST_CASE(
    "a process's own copies give back the whole state of the step each holds, the older copy "
    "overwritten by the third, with two, one or no slots of optimizer state") {
  for (const std::size_t slots : {2, 1, 0}) {
    CAPTURE(slots);
    constexpr std::size_t kCount = 37;
    KeptStripes kept;
    for (const std::uint64_t step : {0, 16, 32}) {
      const State now(kCount, slots, step);
      kept.keep_own(std::span<const float>(now.parameters), std::span<const float>(now.state),
                    step);
    }
    CHECK(kept.keeps == 3);
    // Steps 16 and 32 are held; 0 is gone.
    for (const std::uint64_t step : {16, 32}) {
      CAPTURE(step);
      State rebuilt(kCount, slots, 99);
      rebuild_from_kept_state(kept, OwnCopies{kept.own}, std::span<float>(rebuilt.parameters),
                              std::span<float>(rebuilt.state), step);
      const State expected(kCount, slots, step);
      CHECK(rebuilt.parameters == expected.parameters);
      CHECK(rebuilt.state == expected.state);
    }
    // A segment starts with nothing kept, and keeps its copies in the same memory.
    const std::byte* memory = kept.own.data();
    kept.restart();
    CHECK(kept.keeps == 0);
    CHECK(kept.layout.parameters == 0);
    CHECK(!kept.complete.has_value());
    CHECK(kept.own.data() == memory);
  }
}

TEST_CASE("the stripes every worker kept in its shared buffer give back the whole state") {
  constexpr std::size_t kCount = 50;
  constexpr std::size_t kSlots = 2;
  constexpr std::size_t kStripe = 4;
  constexpr int kRanks = 3;
  KeptStripes kept;
  kept.layout = StripeLayout{.parameters = kCount,
                             .state = kCount * kSlots,
                             .stripe = kStripe,
                             .ranks = kRanks,
                             .element_bytes = sizeof(float),
                             .first = kCount};
  Buffers buffers{std::vector<std::vector<float>>(
      kRanks, std::vector<float>(kept.layout.shared_count(), -1.0f))};
  // Each worker writes only its stripes of the state after step 16 into copy 0, as
  // MirroredReplica does.
  const State after(kCount, kSlots, 16);
  const std::size_t copy = kept.begin_copy(16);
  for (int rank = 0; rank < kRanks; ++rank) {
    std::vector<float>& shared = buffers.of_rank[static_cast<std::size_t>(rank)];
    cohort::strategy::detail::for_each_stripe_of(
        static_cast<std::size_t>(rank), kRanks, kStripe, kCount,
        [&](std::size_t begin, std::size_t count) {
          for (std::size_t i = begin; i < begin + count; ++i) {
            shared[kept.layout.parameters_in(copy) + i] = after.parameters[i];
            for (std::size_t at = i; at < kCount * kSlots; at += kCount) {
              shared[kept.layout.state_in(copy) + at] = after.state[at];
            }
          }
        });
  }
  State rebuilt(kCount, kSlots, 99);
  rebuild_from_kept_state(kept, buffers, std::span<float>(rebuilt.parameters),
                          std::span<float>(rebuilt.state), 16);
  CHECK(rebuilt.parameters == after.parameters);
  CHECK(rebuilt.state == after.state);
}
