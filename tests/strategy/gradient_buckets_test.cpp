// The buckets in which replicas communicate a gradient while the backward pass goes on
// (strategy/detail/gradient_buckets.hpp): the mirrored replicas' fixed pieces and a parameter
// server's chunks, and their size.
#include <doctest/doctest.h>

#include <algorithm>
#include <cohort/strategy/detail/gradient_buckets.hpp>
#include <cstddef>
#include <random>
#include <utility>
#include <vector>

namespace {

using cohort::strategy::detail::BucketSize;
using cohort::strategy::detail::GradientBuckets;

struct Started {
  std::size_t bucket, begin, end;
  friend bool operator==(const Started&, const Started&) = default;
};

// Hands `buckets` the gradient of `elements` in ranges of `piece` elements, in `order` (the
// ranges' indices), and returns the buckets it started, in the order it started them.
std::vector<Started> feed(GradientBuckets& buckets, std::size_t elements, std::size_t piece,
                          const std::vector<std::size_t>& order) {
  std::vector<Started> started;
  for (const std::size_t range : order) {
    const std::size_t begin = range * piece;
    buckets.ready(begin, std::min(elements, begin + piece),
                  [&](std::size_t bucket, std::size_t first, std::size_t last) {
                    started.push_back({bucket, first, last});
                  });
  }
  return started;
}

// Every order of the ranges: last first, first first, and shuffled.
std::vector<std::vector<std::size_t>> orders(std::size_t ranges) {
  std::vector<std::size_t> forward(ranges);
  for (std::size_t i = 0; i < ranges; ++i) forward[i] = i;
  std::vector<std::size_t> backward(forward.rbegin(), forward.rend());
  std::vector<std::size_t> shuffled = forward;
  std::shuffle(shuffled.begin(), shuffled.end(), std::mt19937(static_cast<unsigned>(ranges)));
  return {backward, forward, shuffled};
}

}  // namespace

TEST_CASE("fixed buckets start from the gradient's end, in order, whatever order ranges arrive") {
  for (const std::size_t elements : {0, 1, 7, 4099}) {
    for (const std::size_t bucket_elements : {1, 3, 1000, 5000}) {
      for (const std::size_t piece : {1, 5, 4099}) {
        CAPTURE(elements);
        CAPTURE(bucket_elements);
        CAPTURE(piece);
        // The expected buckets: [e - (k + 1) x size, e - k x size), clipped at 0.
        std::vector<Started> expected;
        for (std::size_t k = 0; k * bucket_elements < elements; ++k) {
          const std::size_t end = elements - k * bucket_elements;
          expected.push_back({k, end - std::min(end, bucket_elements), end});
        }
        for (const auto& order : orders((elements + piece - 1) / piece)) {
          GradientBuckets buckets;
          buckets.begin(elements, bucket_elements);
          CHECK(buckets.complete() == (elements == 0));
          CHECK(feed(buckets, elements, piece, order) == expected);
          CHECK(buckets.complete());
        }
      }
    }
  }
}

TEST_CASE("given buckets (a parameter server's chunks) start in the order of their edges") {
  // 4099 elements in 3 shards ([0, 1366), [1366, 2733), [2733, 4099)), each cut into chunks of
  // 1000 elements: shorter at each shard's end.
  const std::vector<std::size_t> edges = {4099, 3733, 2733, 2366, 1366, 1000, 0};
  std::vector<Started> expected;
  for (std::size_t k = 0; k + 1 < edges.size(); ++k)
    expected.push_back({k, edges[k + 1], edges[k]});
  for (const std::size_t piece : {1, 7, 1366, 4099}) {
    for (const auto& order : orders((4099 + piece - 1) / piece)) {
      CAPTURE(piece);
      GradientBuckets buckets;
      buckets.begin(edges);
      CHECK(feed(buckets, 4099, piece, order) == expected);
      CHECK(buckets.complete());
    }
  }
  GradientBuckets none;
  none.begin(std::vector<std::size_t>{0});
  CHECK(none.complete());
}

TEST_CASE("a bucket waits for every bucket before it, even when it is final first") {
  GradientBuckets buckets;
  buckets.begin(std::vector<std::size_t>{10, 6, 0});  // bucket 0 = [6, 10), bucket 1 = [0, 6)
  std::vector<std::pair<std::size_t, std::size_t>> started;
  const auto record = [&](std::size_t, std::size_t first, std::size_t last) {
    started.emplace_back(first, last);
  };
  buckets.ready(0, 6, record);  // bucket 1 is final, bucket 0 is not: nothing starts
  CHECK(started.empty());
  buckets.ready(6, 9, record);
  CHECK(started.empty());
  buckets.ready(9, 10, record);  // both, in order
  CHECK(started == std::vector<std::pair<std::size_t, std::size_t>>{{6, 10}, {0, 6}});
  CHECK(buckets.complete());
}

TEST_CASE("a bucket keeps its bytes up to `most` buckets, and grows past them to keep the count") {
  const BucketSize size{.bytes = 256, .most = 4};
  CHECK(size.elements(0, sizeof(float)) == 64);
  CHECK(size.elements(256, sizeof(float)) == 64);  // 4 buckets of 64
  CHECK(size.elements(257, sizeof(float)) == 65);  // 4 buckets, the first of 62
  CHECK(size.elements(1000, sizeof(float)) == 250);
  CHECK(size.elements(1001, sizeof(double)) == 251);
  GradientBuckets buckets;
  buckets.begin(1001, size.elements(1001, sizeof(float)));
  const std::vector<Started> started = feed(buckets, 1001, 1001, {0});
  CHECK(started == std::vector<Started>{{0, 750, 1001}, {1, 499, 750}, {2, 248, 499}, {3, 0, 248}});
  // Unbounded (a size the program chose): the bytes alone; neither: one bucket; at least one
  // element.
  CHECK(BucketSize{.bytes = 256}.elements(1'000'000, sizeof(float)) == 64);
  CHECK(BucketSize{}.elements(1'000'000, sizeof(float)) >= 1'000'000);
  CHECK(BucketSize{.bytes = 1}.elements(10, sizeof(float)) == 1);
}

TEST_CASE("a bucket size says in words how the gradient goes") {
  CHECK(BucketSize{}.describe() == "the whole gradient once the backward pass ends");
  CHECK(BucketSize{.bytes = 65536}.describe() ==
        "in buckets of 65536 bytes during the backward pass");
  CHECK(BucketSize{.bytes = 262144, .most = 64}.describe() ==
        "in buckets of 262144 bytes, at most 64 of them, during the backward pass");
}
