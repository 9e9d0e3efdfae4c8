// The gradient's sum of squares where each process owns part of the reduced sums
// (strategy/detail/owned_norm.hpp): the bits of the whole gradient's, whatever the owners' runs.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cohort/collective/deterministic.hpp>
#include <cohort/device/cpu.hpp>
#include <cohort/strategy/detail/owned_norm.hpp>
#include <cohort/transport/loopback.hpp>
#include <cstddef>
#include <cstring>
#include <exception>
#include <random>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace {

// The buckets MirroredReplica reduces: [first, last) pieces of `bucket` elements cut from the end.
std::vector<std::pair<std::size_t, std::size_t>> buckets_of(std::size_t length,
                                                            std::size_t bucket) {
  std::vector<std::pair<std::size_t, std::size_t>> buckets;
  for (std::size_t end = length; end > 0; end -= std::min(end, bucket)) {
    buckets.emplace_back(end - std::min(end, bucket), end);
  }
  return buckets;
}

}  // namespace

TEST_CASE(
    "the sum of squares of a gradient whose sums several processes own has the whole gradient's "
    "bits, blocks split between owners included") {
  // Magnitudes far apart, so that another order of additions gives other bits.
  std::mt19937 random(5);
  std::uniform_int_distribution<int> exponent(-12, 12);
  std::uniform_real_distribution<float> mantissa(-1.0f, 1.0f);
  std::vector<float> gradient(300'001);
  for (float& value : gradient) value = std::ldexp(mantissa(random), exponent(random));
  const double expected = cohort::device::cpu::sum_of_squares(std::span<const float>(gradient));
  // 3,000-element buckets cut blocks of 4,096 among up to 9 owners' runs; 65,536 among 2 or 3; the
  // whole gradient as one bucket, at 4 and 8 ranks halved.
  for (const int ranks : {2, 3, 4, 8}) {
    for (const std::size_t bucket : {std::size_t{3'000}, std::size_t{65'536}, gradient.size()}) {
      CAPTURE(ranks);
      CAPTURE(bucket);
      const auto buckets = buckets_of(gradient.size(), bucket);
      cohort::transport::Loopback group({.ranks = ranks});
      std::vector<double> sums(static_cast<std::size_t>(ranks));
      std::vector<std::string> failures(static_cast<std::size_t>(ranks));
      {
        std::vector<std::jthread> threads;
        for (int rank = 0; rank < ranks; ++rank) {
          threads.emplace_back([&, rank] {
            cohort::collective::Deterministic<cohort::transport::Loopback::Endpoint> communicator(
                group.endpoint(rank));
            try {
              sums[static_cast<std::size_t>(rank)] =
                  cohort::strategy::detail::owned_sum_of_squares<float>(
                      communicator, std::span<const float>(gradient), std::span(buckets));
            } catch (const std::exception& error) {
              failures[static_cast<std::size_t>(rank)] = error.what();
              communicator.abort(error.what());
            }
          });
        }
      }
      for (int rank = 0; rank < ranks; ++rank) {
        const auto at = static_cast<std::size_t>(rank);
        CHECK(failures[at] == "");
        CHECK(std::memcmp(&sums[at], &expected, sizeof(double)) == 0);
      }
    }
  }
}
