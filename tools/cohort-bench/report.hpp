// What cohort-bench prints and writes, apart from how it measures: the collectives' shapes and
// bandwidth arithmetic, the statistics of one measurement, the nccl-tests table, its footer and the
// JSON file. Pure functions of their arguments (no clock, no communicator), so tests include this
// header alone (tests/bench/), and the peer programs of benchmarks/peers/ report through it too.
//
// Definitions, as nccl-tests makes them (docs/benchmarks.md, "## cohort-bench"):
//   size    bytes of the larger of the send and receive buffer of one rank
//   count   elements the call is given: the whole buffer for all_reduce and broadcast, one rank's
//           chunk for all_gather (its input) and reduce_scatter (its output)
//   algbw   size / time, in GB/s (1e9 bytes per second); push_pull counts both directions:
//           (push + pull) / time = 2 x size / time
//   busbw   algbw x factor: 2(n-1)/n for all_reduce, (n-1)/n for all_gather and reduce_scatter,
//           1 for broadcast and push_pull; it makes the figure comparable with the hardware's link
//           bandwidth whatever the rank count, for bandwidth-optimal algorithms
//   time    per iteration, the time of the slowest rank (each rank times its own call); the
//           column is the mean of those over the iterations, p50 and p99 their percentiles
//           (nearest rank: with 20 iterations p99 is the slowest one)
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace cohort::bench {

// --- collectives ---------------------------------------------------------------------------------

// The operations cohort-bench measures: the four collectives, and the parameter server's
// push_pull (each worker pushes a gradient of `size` bytes and pulls the updated parameters; only
// the ps backend runs it, backends.hpp). A new one gets its shape and factors here and a backend
// whose supports() accepts it; nothing else in the table, footer or JSON depends on which it is.
enum class Collective : std::uint8_t {
  kAllReduce,
  kBroadcast,
  kAllGather,
  kReduceScatter,
  kPushPull
};

struct CollectiveInfo {
  Collective collective;
  std::string_view name;
  bool rooted;   // takes a root (-r); the others print root -1, as nccl-tests does
  bool reduces;  // takes a reduce op (-o); the others print redop "none"
};

inline constexpr std::array<CollectiveInfo, 5> kCollectives = {{
    {Collective::kAllReduce, "all_reduce", false, true},
    {Collective::kBroadcast, "broadcast", true, false},
    {Collective::kAllGather, "all_gather", false, false},
    {Collective::kReduceScatter, "reduce_scatter", false, true},
    {Collective::kPushPull, "push_pull", false, true},  // the servers sum the pushes
}};

constexpr const CollectiveInfo& info(Collective collective) {
  return kCollectives[static_cast<std::size_t>(collective)];
}

inline std::optional<Collective> parse_collective(std::string_view name) {
  for (const CollectiveInfo& c : kCollectives) {
    if (c.name == name) return c.collective;
  }
  return std::nullopt;
}

// busbw / algbw for `ranks` ranks (nccl-tests' doc/PERFORMANCE.md): the fraction of the data each
// rank must send and receive in a bandwidth-optimal algorithm, relative to the buffer size.
inline double bus_factor(Collective collective, int ranks) {
  const double n = ranks;
  switch (collective) {
    case Collective::kAllReduce:
      return 2.0 * (n - 1.0) / n;
    case Collective::kAllGather:
    case Collective::kReduceScatter:
      return (n - 1.0) / n;
    case Collective::kBroadcast:
    case Collective::kPushPull:  // each byte crosses the network once per direction
      return 1.0;
  }
  return 1.0;
}

// Bytes one rank moves per call, relative to the size column: 2 for push_pull (the gradient goes
// out, the parameters come back, both `size` bytes), 1 for the collectives, whose algbw is
// nccl-tests' size / time.
inline double traffic_factor(Collective collective) {
  return collective == Collective::kPushPull ? 2.0 : 1.0;
}

// The buffers of one call for a requested size, as nccl-tests' getCollByteCount cuts them: the
// requested bytes become whole elements, and for all_gather and reduce_scatter whole chunks of
// `ranks` elements each.
struct Shape {
  std::size_t bytes = 0;    // the size column: max(send, receive) x element size
  std::size_t count = 0;    // the count column: elements the call is given
  std::size_t send = 0;     // elements in the send buffer
  std::size_t receive = 0;  // elements in the receive buffer
  std::size_t chunk = 0;    // elements per rank (all_gather, reduce_scatter); else count
  std::size_t element = 0;  // bytes per element

  friend bool operator==(const Shape&, const Shape&) = default;
};

inline Shape shape_of(Collective collective, std::size_t bytes, std::size_t element, int ranks) {
  const std::size_t n = static_cast<std::size_t>(std::max(ranks, 1));
  const std::size_t elements = bytes / element;
  Shape s;
  s.element = element;
  switch (collective) {
    case Collective::kAllReduce:
    case Collective::kBroadcast:
    case Collective::kPushPull:  // the gradient out, the parameters back
      s.send = s.receive = s.count = s.chunk = elements;
      break;
    case Collective::kAllGather:
      s.chunk = s.count = elements / n;
      s.send = s.chunk;
      s.receive = s.chunk * n;
      break;
    case Collective::kReduceScatter:
      s.chunk = s.count = elements / n;
      s.send = s.chunk * n;
      s.receive = s.chunk;
      break;
  }
  s.bytes = std::max(s.send, s.receive) * element;
  return s;
}

struct Bandwidth {
  double algbw = 0.0;  // GB/s
  double busbw = 0.0;  // GB/s
};

// algbw = size x traffic_factor / time and busbw = algbw x bus_factor; zero for a zero time.
inline Bandwidth bandwidth(Collective collective, std::size_t bytes, int ranks, double seconds) {
  if (!(seconds > 0.0)) return {};
  const double algbw = static_cast<double>(bytes) * traffic_factor(collective) / 1.0e9 / seconds;
  return {algbw, algbw * bus_factor(collective, ranks)};
}

// --- sizes ---------------------------------------------------------------------------------------

// "8", "64K", "64M", "1G", "1.5K" (binary units, either case, as nccl-tests' -b and -e); nullopt
// for anything else, a negative or a fractional byte count.
inline std::optional<std::size_t> parse_bytes(std::string_view text) {
  if (text.empty()) return std::nullopt;
  std::size_t unit = 1;
  switch (text.back()) {
    case 'k':
    case 'K':
      unit = std::size_t{1} << 10;
      break;
    case 'm':
    case 'M':
      unit = std::size_t{1} << 20;
      break;
    case 'g':
    case 'G':
      unit = std::size_t{1} << 30;
      break;
    default:
      break;
  }
  if (unit != 1) text.remove_suffix(1);
  if (text.empty()) return std::nullopt;
  double value = 0.0;
  double scale = 0.0;  // 0 before the decimal point; then 0.1, 0.01, ...
  for (const char c : text) {
    if (c == '.' && scale == 0.0) {
      scale = 0.1;
    } else if (c >= '0' && c <= '9') {
      if (scale == 0.0) {
        value = value * 10.0 + (c - '0');
      } else {
        value += (c - '0') * scale;
        scale /= 10.0;
      }
    } else {
      return std::nullopt;
    }
  }
  const double bytes = value * static_cast<double>(unit);
  if (bytes != std::floor(bytes) || bytes > 1e18) return std::nullopt;
  return static_cast<std::size_t>(bytes);
}

// The sizes of a sweep, as nccl-tests walks them: min, then x factor (factor > 1) or + step
// (factor 1), while not above max. Empty when min > max or when neither grows.
inline std::vector<std::size_t> sweep_sizes(std::size_t min, std::size_t max, std::size_t factor,
                                            std::size_t step) {
  std::vector<std::size_t> sizes;
  if (min > max) return sizes;
  if (factor <= 1 && step == 0) return min == max ? std::vector<std::size_t>{min} : sizes;
  for (std::size_t size = min; size <= max;) {
    sizes.push_back(size);
    const std::size_t next = factor > 1 ? size * factor : size + step;
    if (next <= size || (factor > 1 && next / factor != size)) break;  // 0 x f, or overflow
    size = next;
  }
  return sizes;
}

// --- one measurement ---------------------------------------------------------------------------

// Nearest-rank percentile (p in (0, 100]) of `values`; 0 for none.
inline double percentile(std::vector<double> values, double p) {
  if (values.empty()) return 0.0;
  std::sort(values.begin(), values.end());
  const double rank = std::ceil(p / 100.0 * static_cast<double>(values.size()));
  const std::size_t index = static_cast<std::size_t>(std::clamp(rank, 1.0, double(values.size())));
  return values[index - 1];
}

// One size, out-of-place or in-place.
struct Measurement {
  double time_us = 0.0;  // mean over iterations of the slowest rank's time
  double algbw = 0.0;    // GB/s
  double busbw = 0.0;    // GB/s
  double p50_us = 0.0;
  double p99_us = 0.0;
  std::int64_t wrong = -1;            // wrong elements summed over ranks; -1: not checked
  std::int64_t ranks_wrong = 0;       // ranks that saw at least one wrong element
  std::vector<double> iterations_us;  // the slowest rank's time of each iteration
};

// `iteration_seconds`: per iteration, the maximum over ranks of each rank's own time.
inline Measurement measure(Collective collective, std::size_t bytes, int ranks,
                           const std::vector<double>& iteration_seconds, std::int64_t wrong,
                           std::int64_t ranks_wrong) {
  Measurement m;
  m.wrong = wrong;
  m.ranks_wrong = ranks_wrong;
  m.iterations_us.reserve(iteration_seconds.size());
  double total = 0.0;
  for (const double s : iteration_seconds) {
    m.iterations_us.push_back(s * 1e6);
    total += s;
  }
  if (iteration_seconds.empty()) return m;
  const double mean = total / static_cast<double>(iteration_seconds.size());
  m.time_us = mean * 1e6;
  const Bandwidth bw = bandwidth(collective, bytes, ranks, mean);
  m.algbw = bw.algbw;
  m.busbw = bw.busbw;
  m.p50_us = percentile(m.iterations_us, 50.0);
  m.p99_us = percentile(m.iterations_us, 99.0);
  return m;
}

// One line of the table.
struct Row {
  std::size_t bytes = 0;
  std::size_t count = 0;
  std::string type;   // "float", "double", "int32", "int64"
  std::string redop;  // "sum", "prod", "min", "max", or "none"
  int root = -1;      // -1 for collectives without a root
  Measurement out_of_place;
  Measurement in_place;
};

struct Summary {
  std::int64_t out_of_bounds = 0;  // (rank, size, placement) triples with a wrong element
  double avg_busbw = 0.0;          // mean busbw over every measurement, both placements
  bool checked = false;            // whether any measurement was checked
};

inline Summary summarize(const std::vector<Row>& rows) {
  Summary s;
  double total = 0.0;
  for (const Row& row : rows) {
    for (const Measurement* m : {&row.out_of_place, &row.in_place}) {
      s.out_of_bounds += m->ranks_wrong;
      s.checked = s.checked || m->wrong >= 0;
      total += m->busbw;
    }
  }
  if (!rows.empty()) s.avg_busbw = total / static_cast<double>(2 * rows.size());
  return s;
}

// --- what the run was ----------------------------------------------------------------------------

struct Machine {
  std::string hostname;
  std::string cpu_model;
  unsigned cores = 0;  // hardware threads the OS reports
};

struct RankInfo {
  int rank = 0;
  long pid = 0;
  std::string host;
  // The GPU this rank measures on, as nccl-tests names it ("0 [0x1b] NVIDIA H100 80GB HBM3");
  // empty on the CPU. Default-initialized, so that {rank, pid, host} still says it all there.
  std::string device{};
  // The CPUs it may run on ("0", "0-1"), as taskset lists them; empty where unknown.
  std::string cpus{};
};

struct RunInfo {
  std::string tool = "cohort-bench";
  std::string version;
  Collective collective = Collective::kAllReduce;
  std::string backend;    // "local", "tcp", "openmpi", "gloo", ...
  std::string algorithm;  // "deterministic", "ring", "threads", "vader", ...
  std::string details;    // one line about the backend's settings ("frame checksums on"); optional
  int ranks = 1;
  std::string launcher;  // who started the ranks
  std::string type = "float";
  std::string op = "sum";
  int root = 0;
  std::size_t min_bytes = 0;
  std::size_t max_bytes = 0;
  std::size_t step_factor = 1;
  std::size_t step_bytes = 0;
  int iters = 0;
  int warmup_iters = 0;
  bool check = true;
  bool shared_buffer = false;  // shm: each buffer in the host's shared segment (in place)
  Machine machine;
  std::vector<RankInfo> rank_info;  // may be empty (then no "Using ranks" block)
};

// --- the table -----------------------------------------------------------------------------------

namespace detail {

template <class... Args>
std::string format(const char* pattern, Args... args) {
  char buffer[512];
  std::snprintf(buffer, sizeof buffer, pattern, args...);
  return buffer;
}

}  // namespace detail

// A time in microseconds as nccl-tests prints it: 7 wide, fewer decimals as it grows.
inline std::string format_time(double us) {
  if (us >= 10000.0) return detail::format("%7.0f", us);
  if (us >= 100.0) return detail::format("%7.1f", us);
  return detail::format("%7.2f", us);
}

inline std::string format_wrong(std::int64_t wrong) {
  return wrong < 0 ? detail::format("%5s", "N/A") : detail::format("%5lld", (long long)wrong);
}

// The lines above the table: what ran, where, how it was measured, then the column headers.
// nccl-tests' columns come first with their meaning unchanged; p50 and p99 of each placement
// follow.
inline std::string format_header(const RunInfo& run) {
  const CollectiveInfo& c = info(run.collective);
  std::string out;
  out += "# " + run.tool + (run.version.empty() ? "" : " " + run.version) + ": " +
         std::string(c.name) + " over " + std::to_string(run.ranks) +
         (run.ranks == 1 ? " rank" : " ranks") + ", backend " + run.backend + ", algorithm " +
         run.algorithm + (run.details.empty() ? "" : " (" + run.details + ")") + "\n";
  if (run.step_factor > 1) {
    out += detail::format("# minBytes %zu maxBytes %zu step: %zu(factor) ", run.min_bytes,
                          run.max_bytes, run.step_factor);
  } else {
    out += detail::format("# minBytes %zu maxBytes %zu step: %zu(bytes) ", run.min_bytes,
                          run.max_bytes, run.step_bytes);
  }
  out += detail::format("warmup iters: %d iters: %d validation: %d\n", run.warmup_iters, run.iters,
                        run.check ? 1 : 0);
  out += "# datatype " + run.type + ", op " + (c.reduces ? run.op : std::string("none")) +
         ", root " + std::to_string(c.rooted ? run.root : -1) + "; launched by " + run.launcher +
         "\n";
  out += "# machine: host " + run.machine.hostname + ", CPU " + run.machine.cpu_model + ", " +
         std::to_string(run.machine.cores) + " cores\n";
  out +=
      "# time: per iteration the slowest rank's; the column is the mean over iterations, "
      "p50/p99 their percentiles\n";
  if (run.collective == Collective::kPushPull) {
    out +=
        "# push_pull: size is one direction; algbw = (push + pull) bytes / time = 2 x size / "
        "time; busbw factor 1 (each byte crosses the network once per direction)\n";
  }
  out += "#\n";
  if (!run.rank_info.empty()) {
    out += "# Using ranks\n";
    for (const RankInfo& r : run.rank_info) {
      out += detail::format("#  Rank %2d Pid %6ld on %10s", r.rank, r.pid, r.host.c_str());
      out += (r.cpus.empty() ? "" : " cpus " + r.cpus);
      out += (r.device.empty() ? "" : " device " + r.device) + "\n";
    }
    out += "#\n";
  }
  out += detail::format(
      "# %10s  %12s  %8s  %6s  %6s           out-of-place                       "
      "in-place          ",
      "", "", "", "", "");
  out += "   out-of-place        in-place     \n";
  out += detail::format("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s %6s  %7s  %6s  %6s %6s", "size",
                        "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong",
                        "time", "algbw", "busbw", "#wrong");
  out += detail::format("  %7s  %7s  %7s  %7s\n", "p50", "p99", "p50", "p99");
  out += detail::format("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %5s  %7s  %6s  %6s  %5s",
                        "(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)",
                        "(GB/s)", "(GB/s)", "");
  out += detail::format("  %7s  %7s  %7s  %7s\n", "(us)", "(us)", "(us)", "(us)");
  return out;
}

inline std::string format_row(const Row& row) {
  std::string out = detail::format("%12zu  %12zu  %8s  %6s  %6i", row.bytes, row.count,
                                   row.type.c_str(), row.redop.c_str(), row.root);
  for (const Measurement* m : {&row.out_of_place, &row.in_place}) {
    out += detail::format("  %7s  %6.2f  %6.2f  %5s", format_time(m->time_us).c_str(), m->algbw,
                          m->busbw, format_wrong(m->wrong).c_str());
  }
  for (const Measurement* m : {&row.out_of_place, &row.in_place}) {
    out += "  " + format_time(m->p50_us) + "  " + format_time(m->p99_us);
  }
  return out + "\n";
}

inline std::string format_footer(const Summary& summary) {
  std::string out;
  out += detail::format("# Out of bounds values : %lld %s\n", (long long)summary.out_of_bounds,
                        summary.out_of_bounds ? "FAILED" : "OK");
  out += detail::format("# Avg bus bandwidth    : %g\n", summary.avg_busbw);
  out += "#\n";
  return out;
}

inline std::string format_table(const RunInfo& run, const std::vector<Row>& rows) {
  std::string out = format_header(run);
  for (const Row& row : rows) out += format_row(row);
  return out + format_footer(summarize(rows));
}

// --- JSON ----------------------------------------------------------------------------------------

inline nlohmann::json to_json(const Measurement& m) {
  nlohmann::json j;
  j["time_us"] = m.time_us;
  j["algbw_gbps"] = m.algbw;
  j["busbw_gbps"] = m.busbw;
  j["p50_us"] = m.p50_us;
  j["p99_us"] = m.p99_us;
  j["wrong"] = m.wrong;
  j["ranks_wrong"] = m.ranks_wrong;
  j["iterations_us"] = m.iterations_us;
  return j;
}

// Every figure of the run: what ran, where, each row with every iteration's time, the footer.
inline nlohmann::json to_json(const RunInfo& run, const std::vector<Row>& rows) {
  const Summary summary = summarize(rows);
  nlohmann::json j;
  j["tool"] = run.tool;
  j["version"] = run.version;
  j["collective"] = std::string(info(run.collective).name);
  j["backend"] = run.backend;
  j["algorithm"] = run.algorithm;
  j["details"] = run.details;
  j["ranks"] = run.ranks;
  j["launcher"] = run.launcher;
  j["datatype"] = run.type;
  j["op"] = run.op;
  j["root"] = run.root;
  j["settings"] = {{"min_bytes", run.min_bytes},
                   {"max_bytes", run.max_bytes},
                   {"step_factor", run.step_factor},
                   {"step_bytes", run.step_bytes},
                   {"iters", run.iters},
                   {"warmup_iters", run.warmup_iters},
                   {"check", run.check},
                   {"shared_buffer", run.shared_buffer}};
  j["machine"] = {{"hostname", run.machine.hostname},
                  {"cpu_model", run.machine.cpu_model},
                  {"cores", run.machine.cores}};
  j["timing"] =
      "per iteration the slowest rank's time; time_us is the mean over iterations, p50_us and "
      "p99_us nearest-rank percentiles";
  j["bus_factor"] = bus_factor(run.collective, run.ranks);
  nlohmann::json ranks = nlohmann::json::array();
  for (const RankInfo& r : run.rank_info) {
    nlohmann::json rank = {{"rank", r.rank}, {"pid", r.pid}, {"host", r.host}};
    if (!r.cpus.empty()) rank["cpus"] = r.cpus;
    if (!r.device.empty()) rank["device"] = r.device;
    ranks.push_back(std::move(rank));
  }
  j["rank_info"] = ranks;
  nlohmann::json results = nlohmann::json::array();
  for (const Row& row : rows) {
    results.push_back({{"size_bytes", row.bytes},
                       {"count", row.count},
                       {"type", row.type},
                       {"redop", row.redop},
                       {"root", row.root},
                       {"out_of_place", to_json(row.out_of_place)},
                       {"in_place", to_json(row.in_place)}});
  }
  j["results"] = results;
  j["out_of_bounds"] = summary.out_of_bounds;
  j["avg_busbw_gbps"] = summary.avg_busbw;
  j["ok"] = summary.out_of_bounds == 0;
  return j;
}

}  // namespace cohort::bench
