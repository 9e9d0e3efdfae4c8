// The cost model of cohort's all-reduce (cohort-bench predict): what an all-reduce of a buffer
// costs over H hosts of P ranks, by algorithm, from a few costs fitted to cohort-bench's own
// measurements. Pure functions of their arguments, so tests include this header alone.
//
// The model counts, for one all-reduce, what each rank does one after another (Counts), and
// prices it (Costs):
//   messages       sequential messages per rank: each costs `message_s` (the software's turn and
//                  the wire's latency)
//   link_messages  those of them that wait on a host's link: every one where the job spans hosts,
//                  but the halving's steps within a host; `link_message_s` more each
//   link_bytes     bytes through the busiest host's link, each way: `link_s_per_byte` each
//   cpu_bytes      bytes a rank sends and folds: `cpu_s_per_byte` each
//   serial_cpu_bytes  the same, while the host's link has nothing to carry: `cpu_s_per_byte` each
//   segment_bytes  bytes of the buffer through the host's shared segment, per rank, while the
//                  link has nothing to carry: `segment_s_per_byte` each
//   beside_segment_bytes  the same, while the link carries others: `segment_s_per_byte` each
//   segment_meetings  meetings of the host's ranks in the segment: `segment_meeting_s` each
// The time is messages x message_s + link_messages x link_message_s + max(link_bytes x
// link_s_per_byte, cpu_bytes x cpu_s_per_byte + beside_segment_bytes x segment_s_per_byte) +
// serial_cpu_bytes x cpu_s_per_byte + segment_bytes x segment_s_per_byte + segment_meetings x
// segment_meeting_s: a transfer is as slow as the slower of the link and the core that moves it
// (a roofline), and the steps that stay within a host come before and after the link's. Where
// ranks share cores (Shape::ranks_per_core: network-namespace hosts of one machine), each cost of
// a core (a message's software turn, its bytes, the segment's) counts that many times.
//
// The counts follow the algorithms (collective/deterministic.hpp, collective/ring.hpp):
//   deterministic  n x B <= 64 KiB: every rank sends its whole buffer to the n-1 others. Larger:
//                  segments of n chunks of at most 512 KiB (the halving's below: segments of
//                  1 MiB, chunks of at least 64 KiB); per segment 2 (n-1) exchanges of a
//                  chunk with one peer at a time; a host's P ranks send their chunks to the n-P
//                  ranks of other hosts through its link. n a power of two from 4: per segment
//                  2 log2(n) exchanges, halving then doubling what a rank holds; the first
//                  log2(P) steps of the halving and the last of the doubling stay within the
//                  host, so that its link carries 2 (n-P)/n x B each way, as a ring's does with
//                  P = 1, and is idle while they move 3 (1 - 1/P) x B of a rank's bytes.
//   ring           the same steps, each to the next rank: only one stream leaves each host.
//   by host        in place in the host's shared segment, as a training step's gradient sum
//                  (collective::Deterministic::share_buffer): rank k of every host folds its
//                  chunk B/P straight from its host ranks' buffers, runs the deterministic
//                  algorithm on it among the H hosts (its rail; the P rails share the link), and
//                  writes the result into every host rank's buffer. The fold and the write-back
//                  go a rail's segment at a time, beside the transfers, but for the first
//                  segment's fold and the last one's write-back; the ranks of a host meet before
//                  and after. With one host: the segment alone.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "cohort/collective/deterministic.hpp"
#include "cohort/transport/loopback.hpp"

namespace cohort::bench::model {

enum class Algorithm { kDeterministic, kRing, kByHost };

inline constexpr std::string_view name(Algorithm algorithm) {
  switch (algorithm) {
    case Algorithm::kDeterministic:
      return "deterministic";
    case Algorithm::kRing:
      return "ring";
    case Algorithm::kByHost:
      return "by host";
  }
  return "unknown";
}

// H hosts of P ranks each, each host's ranks consecutive in rank order. ranks_per_core: how many
// ranks share each core, where the ranks outnumber the cores they run on (the hosts of a check,
// network namespaces of one machine); 1, a core per rank, for the hosts predicted.
struct Shape {
  int hosts = 1;
  int per_host = 1;
  double ranks_per_core = 1;
  int ranks() const { return hosts * per_host; }
};

struct Counts {
  double messages = 0;
  double link_messages = 0;
  double link_bytes = 0;
  double cpu_bytes = 0;
  double serial_cpu_bytes = 0;
  double segment_bytes = 0;
  double beside_segment_bytes = 0;
  double segment_meetings = 0;
};

struct Costs {
  double message_s = 0;
  double link_message_s = 0;
  double link_s_per_byte = 0;
  double cpu_s_per_byte = 0;
  double segment_s_per_byte = 0;
  double segment_meeting_s = 0;
};

// The algorithms' constants, the library's.
using Library = collective::Deterministic<transport::Loopback::Endpoint>;
inline constexpr double kDirectBytes = Library::kDirectBytes;

// Whether the deterministic all-reduce over n ranks halves and doubles (equal leaves assumed).
inline bool halves_and_doubles(int n) {
  return n >= 4 && std::has_single_bit(static_cast<unsigned>(n));
}

// Bytes of a segment of the all-reduce over n ranks: n chunks.
inline double segment_bytes(int n, bool halves) {
  return static_cast<double>(n) *
         static_cast<double>(Library::segment_chunk_bytes(static_cast<std::size_t>(n), halves));
}

namespace detail {

// Per rank, over n ranks of which `per_host` share each host's link, the counts of the
// deterministic algorithm (or of the ring) for a buffer of `bytes`.
inline Counts over_transport(double bytes, int n, int per_host, bool ring) {
  Counts counts;
  if (n < 2 || bytes <= 0) return counts;
  const int off_host = n - per_host;
  if (!ring && bytes * n <= kDirectBytes) {
    counts.messages = n - 1;
    counts.link_messages = off_host > 0 ? counts.messages : 0.0;
    counts.link_bytes = static_cast<double>(per_host) * off_host * bytes;
    counts.cpu_bytes = 2.0 * (n - 1) * bytes;  // sent, and folded
    return counts;
  }
  const bool halves = !ring && halves_and_doubles(n);
  // Segments of n chunks: the last one's chunks are shorter.
  const double segments = std::ceil(bytes / segment_bytes(n, halves));
  const double share = bytes / n;  // this rank's chunks, over every segment
  counts.messages = 2.0 * (halves ? std::countr_zero(static_cast<unsigned>(n)) : n - 1) * segments;
  // The halving's first log2(per_host) steps of each half pair ranks of one host.
  const double steps_within_host =
      halves ? 2.0 * std::countr_zero(static_cast<unsigned>(per_host)) * segments : 0.0;
  counts.link_messages = off_host > 0 ? counts.messages - steps_within_host : 0.0;
  if (ring) {
    counts.link_bytes = off_host > 0 ? 2.0 * (n - 1) * share : 0.0;
  } else {
    counts.link_bytes = (halves ? 2.0 : 2.0 * per_host) * off_host * share;
  }
  counts.cpu_bytes = 3.0 * (n - 1) * share;  // sent twice (reduce-scatter, all-gather), folded
  if (halves && per_host > 1 && off_host > 0) {
    counts.serial_cpu_bytes = 3.0 * (per_host - 1) * (n / per_host) * share;
    counts.cpu_bytes -= counts.serial_cpu_bytes;
  }
  return counts;
}

// Per rank, the counts of the segment's stages for a buffer of `bytes`, in place: this rank's
// chunk folded from every host rank's buffer and written back into each (counted as the buffer's
// bytes), between two meetings.
inline Counts through_segment(double bytes) {
  Counts counts;
  counts.segment_bytes = bytes;
  counts.segment_meetings = 2;
  return counts;
}

}  // namespace detail

// The counts of one all-reduce of `bytes` per rank. By host with one rank per host is the
// deterministic algorithm.
inline Counts count(Algorithm algorithm, Shape shape, double bytes) {
  const int n = shape.ranks();
  switch (algorithm) {
    case Algorithm::kDeterministic:
      return detail::over_transport(bytes, n, shape.per_host, false);
    case Algorithm::kRing:
      return detail::over_transport(bytes, n, shape.per_host, true);
    case Algorithm::kByHost:
      break;
  }
  if (shape.per_host == 1) return detail::over_transport(bytes, n, 1, false);
  Counts counts = detail::through_segment(bytes);
  if (shape.hosts > 1) {
    const double chunk = bytes / shape.per_host;
    const Counts rail = detail::over_transport(chunk, shape.hosts, 1, false);
    counts.messages = rail.messages;
    counts.link_messages = rail.link_messages;
    counts.link_bytes = rail.link_bytes * shape.per_host;  // the host's rails share its link
    counts.cpu_bytes = rail.cpu_bytes;
    // The first segment's fold and the last one's write-back wait; the rest goes beside the link.
    const double segment =
        std::min(chunk, segment_bytes(shape.hosts, halves_and_doubles(shape.hosts)));
    counts.beside_segment_bytes = bytes * (1 - segment / chunk);
    counts.segment_bytes = bytes - counts.beside_segment_bytes;
  }
  return counts;
}

// The costs of a core, where `ranks_per_core` ranks share each (Shape).
inline Costs on_shared_cores(Costs costs, double ranks_per_core) {
  costs.message_s *= ranks_per_core;
  costs.cpu_s_per_byte *= ranks_per_core;
  costs.segment_s_per_byte *= ranks_per_core;
  costs.segment_meeting_s *= ranks_per_core;
  return costs;
}

inline double seconds(const Counts& counts, const Costs& costs) {
  return counts.messages * costs.message_s + counts.link_messages * costs.link_message_s +
         std::max(counts.link_bytes * costs.link_s_per_byte,
                  counts.cpu_bytes * costs.cpu_s_per_byte +
                      counts.beside_segment_bytes * costs.segment_s_per_byte) +
         counts.serial_cpu_bytes * costs.cpu_s_per_byte +
         counts.segment_bytes * costs.segment_s_per_byte +
         counts.segment_meetings * costs.segment_meeting_s;
}

inline double seconds(Algorithm algorithm, Shape shape, double bytes, const Costs& costs) {
  return seconds(count(algorithm, shape, bytes), on_shared_cores(costs, shape.ranks_per_core));
}

// --- fitting -------------------------------------------------------------------------------------

// One measured all-reduce: its algorithm and shape, bytes per rank, and its time.
struct Measured {
  Algorithm algorithm = Algorithm::kDeterministic;
  Shape shape;
  double bytes = 0;
  double seconds = 0;
};

// The non-negative a, b that minimize the sum of ((a x[i] + b y[i] - t[i]) / t[i])^2: relative
// errors, so that the small sizes count as much as the large ones.
struct Pair {
  double a = 0;
  double b = 0;
};
inline Pair fit_pair(std::span<const double> x, std::span<const double> y,
                     std::span<const double> t) {
  double xx = 0, xy = 0, yy = 0, xt = 0, yt = 0;
  for (std::size_t i = 0; i < t.size(); ++i) {
    const double w = 1 / (t[i] * t[i]);
    xx += w * x[i] * x[i];
    xy += w * x[i] * y[i];
    yy += w * y[i] * y[i];
    xt += w * x[i] * t[i];
    yt += w * y[i] * t[i];
  }
  const double determinant = xx * yy - xy * xy;
  Pair pair;
  if (determinant > 1e-12 * xx * yy) {
    pair.a = (xt * yy - yt * xy) / determinant;
    pair.b = (yt * xx - xt * xy) / determinant;
  }
  if (pair.a > 0 && pair.b > 0) return pair;
  // On the boundary: the better of one term alone.
  const Pair only_x{xx > 0 ? std::max(0.0, xt / xx) : 0.0, 0};
  const Pair only_y{0, yy > 0 ? std::max(0.0, yt / yy) : 0.0};
  const auto error = [&](const Pair& p) {
    double sum = 0;
    for (std::size_t i = 0; i < t.size(); ++i) {
      const double r = (p.a * x[i] + p.b * y[i] - t[i]) / t[i];
      sum += r * r;
    }
    return sum;
  };
  return error(only_x) <= error(only_y) ? only_x : only_y;
}

// Fits the costs in three stages, each a pair of costs on the measurements that show them:
//   over TCP on one host     message_s and cpu_s_per_byte
//   through the segment      segment_meeting_s and segment_s_per_byte (by host on one host)
//   over TCP across hosts    link_message_s and link_s_per_byte, on what the first two leave
// A stage without measurements leaves its costs at zero.
inline Costs fit(std::span<const Measured> measured) {
  Costs costs;
  // first, second and known take a measurement's counts and its ranks per core (Shape), by which
  // each count of a core's work is priced.
  const auto stage = [&](auto selects, auto first, auto second, auto known) {
    std::vector<double> x, y, t;
    for (const Measured& m : measured) {
      if (!selects(m)) continue;
      const Counts c = count(m.algorithm, m.shape, m.bytes);
      const double share = m.shape.ranks_per_core;
      const double left = m.seconds - known(c, share);
      if (left <= 0) continue;
      x.push_back(first(c, share));
      y.push_back(second(c, share));
      t.push_back(left);
    }
    return t.empty() ? std::optional<Pair>{} : std::optional<Pair>{fit_pair(x, y, t)};
  };
  const auto nothing = [](const Counts&, double) { return 0.0; };
  const auto on_one_host_tcp = [](const Measured& m) {
    return m.shape.hosts == 1 && m.algorithm != Algorithm::kByHost;
  };
  if (const auto p = stage(
          on_one_host_tcp, [](const Counts& c, double share) { return c.messages * share; },
          [](const Counts& c, double share) { return c.cpu_bytes * share; }, nothing)) {
    costs.message_s = p->a;
    costs.cpu_s_per_byte = p->b;
  }
  const auto on_one_host_segment = [](const Measured& m) {
    return m.shape.hosts == 1 && m.algorithm == Algorithm::kByHost;
  };
  if (const auto p = stage(
          on_one_host_segment,
          [](const Counts& c, double share) { return c.segment_meetings * share; },
          [](const Counts& c, double share) { return c.segment_bytes * share; }, nothing)) {
    costs.segment_meeting_s = p->a;
    costs.segment_s_per_byte = p->b;
  }
  const auto across_hosts = [](const Measured& m) { return m.shape.hosts > 1; };
  const Costs known = costs;
  if (const auto p = stage(
          across_hosts, [](const Counts& c, double) { return c.link_messages; },
          [](const Counts& c, double) { return c.link_bytes; },
          [&known](const Counts& c, double share) {
            return share *
                   (c.messages * known.message_s + c.serial_cpu_bytes * known.cpu_s_per_byte +
                    c.segment_bytes * known.segment_s_per_byte +
                    c.segment_meetings * known.segment_meeting_s);
          })) {
    costs.link_message_s = p->a;
    costs.link_s_per_byte = p->b;
  }
  return costs;
}

// --- a training step ----------------------------------------------------------------------------

// A data-parallel step of a model whose gradient is `gradient_bytes`, computed in `compute_s`
// (forward and backward, the backward `backward_fraction` of it, the gradient ready evenly over
// it), all-reduced in buckets of `bucket_bytes` as each is ready: the step ends when both the
// computation and the last bucket's all-reduce have, and each bucket starts once ready and once
// the one before it is done.
struct Step {
  double compute_s = 0;
  double communication_s = 0;  // every bucket's all-reduce, back to back
  double step_s = 0;
};

inline Step step(Algorithm algorithm, Shape shape, double gradient_bytes, double bucket_bytes,
                 double compute_s, double backward_fraction, const Costs& costs) {
  Step result;
  result.compute_s = compute_s;
  const double buckets = std::ceil(gradient_bytes / bucket_bytes);
  const double forward_s = compute_s * (1 - backward_fraction);
  double done_s = forward_s;  // when the bucket before ended
  double left = gradient_bytes;
  for (double b = 1; b <= buckets; ++b) {
    const double bytes = std::min(bucket_bytes, left);
    left -= bytes;
    const double ready_s = forward_s + compute_s * backward_fraction * (b / buckets);
    const double all_reduce_s = seconds(algorithm, shape, bytes, costs);
    result.communication_s += all_reduce_s;
    done_s = std::max(done_s, ready_s) + all_reduce_s;
  }
  result.step_s = shape.ranks() == 1 ? compute_s : std::max(compute_s, done_s);
  return result;
}

}  // namespace cohort::bench::model
