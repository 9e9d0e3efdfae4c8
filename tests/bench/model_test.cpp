// The cost model of cohort-bench predict (tools/cohort-bench/model.hpp): its counts follow the
// algorithms, its fit recovers the costs that made the measurements, and a step is as long as
// the computation or the buckets' all-reduces that cannot hide behind it.
#include "model.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <vector>

namespace model_test {

namespace model = cohort::bench::model;
using model::Algorithm;
using model::Shape;

constexpr double kMiB = 1024.0 * 1024;

TEST_CASE("the model's link bytes are those of each algorithm's exchanges") {
  const double bytes = 64 * kMiB;
  // Over 4 hosts of 1: every byte leaves each host 2 (n-1)/n times, for every algorithm; the
  // deterministic algorithm (and by host, its rail) halves and doubles 64 segments of 1 MiB in
  // 2 log2(4) steps each, the ring takes 2 (4 - 1) on 32 segments of 4 chunks of 512 KiB.
  for (const Algorithm a : {Algorithm::kDeterministic, Algorithm::kRing, Algorithm::kByHost}) {
    CAPTURE(model::name(a));
    CHECK(model::count(a, Shape{4, 1}, bytes).link_bytes == doctest::Approx(2.0 * 3 / 4 * bytes));
    CHECK(model::count(a, Shape{4, 1}, bytes).messages ==
          (a == Algorithm::kRing ? 2 * 3 * 32 : 2 * 2 * 64));
  }
  // 3 hosts of 1: the deterministic algorithm's 2 (n - 1) steps, 43 segments of 3 chunks.
  CHECK(model::count(Algorithm::kDeterministic, Shape{3, 1}, bytes).messages == 2 * 2 * 43);
  // 4 hosts of 2: halving and doubling, the 8 ranks' first step of each half pairs the ranks of
  // a host, so that each rank sends 6/8 of its quarter through the link each way; the ring
  // crosses each host once; by host, the two rails carry half the buffer each between the hosts.
  const Shape four_by_two{4, 2};
  CHECK(model::count(Algorithm::kDeterministic, four_by_two, bytes).link_bytes ==
        doctest::Approx(2.0 * 6 / 8 * bytes));
  CHECK(model::count(Algorithm::kRing, four_by_two, bytes).link_bytes ==
        doctest::Approx(2.0 * 7 / 8 * bytes));
  // Those steps within the host move half the buffer three times (sent, folded, sent back) while
  // the link is idle; the rest of a rank's 3 x 7/8 overlaps the link. Over hosts of one, nothing
  // waits so.
  const model::Counts flat = model::count(Algorithm::kDeterministic, four_by_two, bytes);
  CHECK(flat.serial_cpu_bytes == doctest::Approx(3.0 / 2 * bytes));
  CHECK(flat.cpu_bytes == doctest::Approx(3.0 * 7 / 8 * bytes - 3.0 / 2 * bytes));
  CHECK(model::count(Algorithm::kDeterministic, Shape{4, 1}, bytes).serial_cpu_bytes == 0);
  // Of the halving's 2 x 3 steps a segment (64 of 1 MiB), the 2 within a host wait on no link;
  // every step of the ring does, and every one over hosts of one.
  CHECK(flat.messages == 2 * 3 * 64);
  CHECK(flat.link_messages == 2 * 2 * 64);
  const model::Counts ring = model::count(Algorithm::kRing, four_by_two, bytes);
  CHECK(ring.link_messages == ring.messages);
  CHECK(model::count(Algorithm::kDeterministic, Shape{4, 1}, bytes).link_messages == 2 * 2 * 64);
  // Only those pay the link's latency.
  model::Costs latency;
  latency.link_message_s = 1e-5;
  CHECK(model::seconds(Algorithm::kDeterministic, four_by_two, bytes, latency) ==
        doctest::Approx(2 * 2 * 64 * 1e-5));
  // 3 hosts of 2 (6 ranks, no power of two): each rank's chunks go to the 4 ranks of other hosts.
  CHECK(model::count(Algorithm::kDeterministic, Shape{3, 2}, bytes).link_bytes ==
        doctest::Approx(2.0 * 2 * 4 / 6 * bytes));
  const model::Counts by_host = model::count(Algorithm::kByHost, four_by_two, bytes);
  CHECK(by_host.link_bytes == doctest::Approx(2.0 * 3 / 4 * bytes));
  CHECK(by_host.messages == 2 * 2 * 32);  // the rail's 32 MiB: 32 segments of 1 MiB
  CHECK(by_host.link_messages == by_host.messages);
  // In place, the fold and the write-back go beside the link but for the first and the last of
  // the rail's 32 segments; the ranks of a host meet twice.
  CHECK(by_host.segment_bytes == doctest::Approx(bytes / 32));
  CHECK(by_host.beside_segment_bytes == doctest::Approx(bytes * 31 / 32));
  CHECK(by_host.segment_meetings == 2);
  // A rail of one segment: nothing of the segment's goes beside the link.
  CHECK(model::count(Algorithm::kByHost, four_by_two, kMiB).beside_segment_bytes == 0);
  // One host: nothing through a link; by host is the segment alone.
  CHECK(model::count(Algorithm::kDeterministic, Shape{1, 4}, bytes).link_bytes == 0);
  CHECK(model::count(Algorithm::kDeterministic, Shape{1, 4}, bytes).link_messages == 0);
  const model::Counts one_host = model::count(Algorithm::kByHost, Shape{1, 4}, bytes);
  CHECK(one_host.messages == 0);
  CHECK(one_host.segment_bytes == bytes);
  CHECK(one_host.beside_segment_bytes == 0);
}

TEST_CASE("ranks that share cores count each cost of a core that many times, not the link's") {
  model::Costs costs;
  costs.message_s = 10e-6;
  costs.cpu_s_per_byte = 1 / 2e9;
  costs.segment_s_per_byte = 1 / 4e9;
  costs.segment_meeting_s = 1e-6;
  costs.link_s_per_byte = 1 / 0.12e9;
  // 4 hosts of 2 on one machine of 2 cores: 4 ranks a core.
  Shape shared{4, 2};
  shared.ranks_per_core = 4;
  for (const double bytes : {64 * 1024.0, 64 * kMiB}) {
    const model::Counts c = model::count(Algorithm::kDeterministic, shared, bytes);
    const double expected =
        c.messages * 4 * costs.message_s +
        std::max(c.link_bytes * costs.link_s_per_byte, c.cpu_bytes * 4 * costs.cpu_s_per_byte) +
        c.serial_cpu_bytes * 4 * costs.cpu_s_per_byte;
    CHECK(model::seconds(Algorithm::kDeterministic, shared, bytes, costs) ==
          doctest::Approx(expected));
  }
  // The fit prices each measurement's core work by its ranks per core.
  costs.link_message_s = 30e-6;
  std::vector<model::Measured> measured;
  for (double bytes = 64 * 1024; bytes <= 64 * kMiB; bytes *= 4) {
    for (Shape shape : {Shape{1, 4}, Shape{2, 2}}) {
      shape.ranks_per_core = 2;
      for (const Algorithm a : {Algorithm::kDeterministic, Algorithm::kByHost}) {
        if (shape.hosts > 1 && a == Algorithm::kByHost) continue;
        measured.push_back({a, shape, bytes, model::seconds(a, shape, bytes, costs)});
      }
    }
  }
  const model::Costs fitted = model::fit(measured);
  CHECK(fitted.message_s == doctest::Approx(costs.message_s));
  CHECK(fitted.cpu_s_per_byte == doctest::Approx(costs.cpu_s_per_byte));
  CHECK(fitted.segment_s_per_byte == doctest::Approx(costs.segment_s_per_byte));
}

TEST_CASE("a small all-reduce is one message to each peer, and a large one grows by segments") {
  const model::Counts small = model::count(Algorithm::kDeterministic, Shape{8, 1}, 8 * 1024);
  CHECK(small.messages == 7);
  CHECK(small.link_bytes == 7 * 8 * 1024);
  // 1,024 ranks: a 100 MiB buffer is two segments of 64 KiB chunks (the least), each halved and
  // doubled in 2 x 10 exchanges; the ring takes 2 x 1,023 on one segment.
  const model::Counts wide = model::count(Algorithm::kDeterministic, Shape{1024, 1}, 100 * kMiB);
  CHECK(wide.messages == 2 * 10 * 2);
  CHECK(model::count(Algorithm::kRing, Shape{1024, 1}, 100 * kMiB).messages == 2 * 1023);
}

TEST_CASE("the fit recovers the costs that made the measurements") {
  model::Costs truth;
  truth.message_s = 20e-6;
  truth.cpu_s_per_byte = 1 / 2e9;
  truth.segment_meeting_s = 5e-6;
  truth.segment_s_per_byte = 1 / 4e9;
  truth.link_message_s = 50e-6;
  truth.link_s_per_byte = 8 / 0.9e9;
  std::vector<model::Measured> measured;
  for (double bytes = 64 * 1024; bytes <= 64 * kMiB; bytes *= 4) {
    for (const auto& [algorithm, shape] : {std::pair{Algorithm::kDeterministic, Shape{1, 2}},
                                           std::pair{Algorithm::kByHost, Shape{1, 2}},
                                           std::pair{Algorithm::kDeterministic, Shape{2, 1}}}) {
      measured.push_back({algorithm, shape, bytes, model::seconds(algorithm, shape, bytes, truth)});
    }
  }
  const model::Costs fitted = model::fit(measured);
  CHECK(fitted.message_s == doctest::Approx(truth.message_s));
  CHECK(fitted.cpu_s_per_byte == doctest::Approx(truth.cpu_s_per_byte));
  CHECK(fitted.segment_meeting_s == doctest::Approx(truth.segment_meeting_s));
  CHECK(fitted.segment_s_per_byte == doctest::Approx(truth.segment_s_per_byte));
  CHECK(fitted.link_message_s == doctest::Approx(truth.link_message_s));
  CHECK(fitted.link_s_per_byte == doctest::Approx(truth.link_s_per_byte));
}

TEST_CASE("a step hides the buckets' all-reduces behind the backward pass, but not the last") {
  model::Costs costs;
  costs.message_s = 1e-3;  // every all-reduce of 2 ranks on one host: 2 messages, 2 ms
  const Shape two{1, 2};
  const double bucket_s = 2e-3;
  // 4 buckets ready at 0.55, 0.7, 0.85 and 1 s of a 1 s computation whose last 60% is the
  // backward pass: each all-reduce ends long before the next bucket is ready, the last one after
  // the computation.
  const model::Step quick =
      model::step(Algorithm::kDeterministic, two, 4 * kMiB, kMiB, 1.0, 0.6, costs);
  CHECK(quick.communication_s == doctest::Approx(4 * bucket_s));
  CHECK(quick.step_s == doctest::Approx(1.0 + bucket_s));
  // All-reduces of 1 s each: the first starts at 0.55 s, and they run back to back.
  costs.message_s = 0.5;
  const model::Step slow =
      model::step(Algorithm::kDeterministic, two, 4 * kMiB, kMiB, 1.0, 0.6, costs);
  CHECK(slow.step_s == doctest::Approx(0.4 + 0.15 + 4 * 1.0));
  // One rank has nothing to all-reduce.
  CHECK(
      model::step(Algorithm::kDeterministic, Shape{1, 1}, 4 * kMiB, kMiB, 1.0, 0.6, costs).step_s ==
      1.0);
}

}  // namespace model_test
