// cohort-bench predict: fits the cost model (model.hpp) to cohort-bench's own all_reduce reports,
// checks it against others, and predicts the all-reduce and a training step's time for H hosts
// of P ranks on faster links.
//
//   cohort-bench predict --params 25M --compute-ms 100     (measures this host first)
//   cohort-bench all_reduce --backend tcp --np 2 -b 1K -e 64M -f 4 --json tcp.json
//   cohort-bench all_reduce --backend shm --shared-buffer --np 2 -b 1K -e 64M -f 4 --json shm.json
//   cohort-bench predict --measured tcp.json,shm.json --params 25M --compute-ms 100
//       --per-host 8 --hosts 1,2,8,32,128 --gbits 10,25,100   (one line)
//   cohort-bench predict --measured tcp.json,shm.json,two.json@2x1 --check eight.json@8x1
//
// A report measured across hosts names its shape after it: FILE@HxP, H hosts of P ranks each
// (each host's ranks consecutive); without it every rank was on one host. The median time of each
// size is the measurement. Reports over TCP on one host give the costs of a message and of a byte
// on a core; through shared memory on one host (in place in the shared buffer, as a training
// step's gradient sum: --shared-buffer), the segment's; across hosts, the link's. --cores C says
// that each report's ranks shared C cores (network-namespace hosts of one machine): where they
// outnumber them, a core's costs count ranks / C times for that report. Where no
// report crossed hosts, a link of G Gbit/s carries 0.94 x G (TCP's payload in 1500-byte frames)
// and adds --latency-us to each message. docs/benchmarks.md, "The cost model", has the check and
// the tables.
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "cohort/core/error.hpp"
#include "launch.hpp"
#include "model.hpp"
#include "report.hpp"

namespace cohort::bench {

struct PredictSettings {
  std::vector<std::string> measured;  // FILE[@HxP]: the reports the costs are fitted to
  std::vector<std::string> check;     // FILE[@HxP]: reports the fitted model is checked against
  std::vector<std::size_t> parameters;
  double compute_ms = 0;
  double backward_fraction = 2.0 / 3;
  std::vector<int> hosts{1, 2, 4, 8, 16, 32, 64, 128};
  int per_host = 8;
  std::vector<double> gbits{10, 25, 100};
  double latency_us = 10;
  double link_efficiency = 0.94;
  std::vector<std::size_t> bucket_bytes{std::size_t{256} << 10, std::size_t{4} << 20,
                                        std::size_t{32} << 20};
  std::size_t wire_bytes = 4;  // per parameter: fp32 4, bf16 or fp16 2
  int cores = 0;               // the cores the reports' ranks shared; 0: a core per rank
};

namespace detail {

// One report: its measurements, and what to call it.
struct Report {
  std::string file;
  std::vector<model::Measured> measured;
};

// "FILE@4x2" or "FILE", its ranks on `cores` cores (0: a core each).
inline Report read_report(const std::string& argument, int cores) {
  std::string file = argument;
  std::optional<model::Shape> shape;
  if (const auto at = argument.rfind('@'); at != std::string::npos) {
    file = argument.substr(0, at);
    const std::string text = argument.substr(at + 1);
    int hosts = 0, per_host = 0;
    char x = 0, extra = 0;
    if (std::sscanf(text.c_str(), "%d%c%d%c", &hosts, &x, &per_host, &extra) != 3 || x != 'x' ||
        hosts < 1 || per_host < 1) {
      throw ConfigError("'" + argument + "': the shape after @ must be HxP, H hosts of P ranks " +
                        "each, both at least 1 (e.g. " + file + "@4x2)");
    }
    shape = model::Shape{hosts, per_host};
  }
  std::ifstream in(file);
  if (!in) throw ConfigError("'" + file + "': cannot read it");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw ConfigError("'" + file + "': not JSON: " + e.what());
  }
  const auto field = [&](const char* key) -> const nlohmann::json& {
    if (!j.is_object() || !j.contains(key)) {
      throw ConfigError("'" + file + "': no field '" + key +
                        "': not a report of cohort-bench --json");
    }
    return j.at(key);
  };
  if (field("collective") != "all_reduce") {
    throw ConfigError("'" + file + "': collective is " + field("collective").dump() +
                      ": the model is of all_reduce");
  }
  if (field("op") != "sum") {
    throw ConfigError("'" + file + "': op is " + field("op").dump() +
                      ": the model is fitted to sums on the wire in their own type (-o sum)");
  }
  const std::string backend = field("backend");
  const std::string algorithm = field("algorithm");
  model::Algorithm which = model::Algorithm::kDeterministic;
  const char* column = "out_of_place";
  if (backend == "shm") {
    if (!field("settings").value("shared_buffer", false)) {
      throw ConfigError("'" + file +
                        "': through shared memory but not in the shared buffer: the model is of "
                        "the all-reduce by host in place, as a training step's gradient sum "
                        "(cohort-bench all_reduce --backend shm --shared-buffer)");
    }
    which = model::Algorithm::kByHost;
    column = "in_place";
  } else if (backend == "tcp") {
    which = algorithm == "ring" ? model::Algorithm::kRing : model::Algorithm::kDeterministic;
  } else {
    throw ConfigError("'" + file + "': backend is " + backend +
                      ": the model is of processes over TCP (tcp) and shared memory (shm)");
  }
  const int ranks = field("ranks");
  if (!shape) shape = model::Shape{1, ranks};
  if (shape->ranks() != ranks) {
    throw ConfigError("'" + argument + "': " + std::to_string(shape->hosts) + " hosts of " +
                      std::to_string(shape->per_host) + " make " + std::to_string(shape->ranks()) +
                      " ranks, but the report has " + std::to_string(ranks));
  }
  if (cores > 0) shape->ranks_per_core = std::max(1.0, static_cast<double>(ranks) / cores);
  Report report{file, {}};
  for (const nlohmann::json& row : field("results")) {
    const double p50_us = row.at(column).at("p50_us");
    if (p50_us <= 0) continue;
    report.measured.push_back({which, *shape, row.at("size_bytes").get<double>(), p50_us * 1e-6});
  }
  if (report.measured.empty()) throw ConfigError("'" + file + "': no results");
  return report;
}

inline std::string shape_text(model::Shape shape) {
  return std::to_string(shape.hosts) + "x" + std::to_string(shape.per_host);
}

inline std::string seconds_text(double seconds) {
  if (seconds < 1e-3) return format("%.1f us", seconds * 1e6);
  if (seconds < 1) return format("%.2f ms", seconds * 1e3);
  return format("%.2f s", seconds);
}

inline std::string bytes_text(double bytes) {
  if (bytes >= 1 << 20) return format("%g MiB", bytes / (1 << 20));
  return format("%g KiB", bytes / 1024);
}

inline void print_costs(const model::Costs& c) {
  std::printf(
      "# costs: message %s (+ %s across hosts), link %.3g GB/s, core %.3g GB/s, segment %.3g "
      "GB/s and %s a meeting\n",
      seconds_text(c.message_s).c_str(), seconds_text(c.link_message_s).c_str(),
      c.link_s_per_byte > 0 ? 1e-9 / c.link_s_per_byte : INFINITY,
      c.cpu_s_per_byte > 0 ? 1e-9 / c.cpu_s_per_byte : INFINITY,
      c.segment_s_per_byte > 0 ? 1e-9 / c.segment_s_per_byte : INFINITY,
      seconds_text(c.segment_meeting_s).c_str());
}

// Predicted against measured, size by size; returns the largest error from 64 KiB.
inline double print_check(const Report& report, const model::Costs& costs) {
  double worst = 0;
  std::printf("# %s: %s over %s\n", report.file.c_str(),
              std::string(model::name(report.measured.front().algorithm)).c_str(),
              shape_text(report.measured.front().shape).c_str());
  std::printf("# %12s %12s %12s %8s\n", "size", "measured", "predicted", "error");
  for (const model::Measured& m : report.measured) {
    const double predicted = model::seconds(m.algorithm, m.shape, m.bytes, costs);
    const double error = (predicted - m.seconds) / m.seconds;
    if (m.bytes >= 64 * 1024) worst = std::max(worst, std::abs(error));
    std::printf("  %12s %12s %12s %+7.1f%%\n", bytes_text(m.bytes).c_str(),
                seconds_text(m.seconds).c_str(), seconds_text(predicted).c_str(), 100 * error);
  }
  return worst;
}

inline void require(bool holds, const std::string& sentence) {
  if (!holds) throw ConfigError(sentence);
}

}  // namespace detail

// Refuses what cannot be predicted, with a sentence naming the flag.
inline void validate(const PredictSettings& s) {
  using detail::require;
  require(s.per_host >= 1, "--per-host " + std::to_string(s.per_host) + ": at least 1 rank");
  for (int h : s.hosts) require(h >= 1, "--hosts " + std::to_string(h) + ": at least 1 host");
  for (double g : s.gbits) {
    require(g > 0 && std::isfinite(g),
            "--gbits " + std::to_string(g) + ": a link's rate is more than 0 Gbit/s");
  }
  for (std::size_t b : s.bucket_bytes) {
    require(b >= 4, "--bucket-bytes " + std::to_string(b) + ": at least one element (4 bytes)");
  }
  require(s.compute_ms >= 0 && std::isfinite(s.compute_ms),
          "--compute-ms: a step's computation takes 0 ms or more");
  require(s.backward_fraction > 0 && s.backward_fraction <= 1,
          "--backward-fraction: the backward pass is more than 0 and at most all of the "
          "computation");
  require(s.parameters.empty() || s.compute_ms > 0,
          "--params needs --compute-ms, the time of one replica's forward and backward pass");
  require(s.latency_us >= 0, "--latency-us: a message's latency is 0 us or more");
  require(s.cores >= 0, "--cores " + std::to_string(s.cores) +
                            ": at least 1 core, or 0 for a "
                            "core per rank");
}

namespace detail {

// Without --measured: the two reports of this host that the costs need, measured now by copies of
// this program (launch.hpp), their tables to /dev/null, in a directory that is kept so that the
// next prediction can reuse them (--measured) and says where.
inline std::vector<std::string> measure_this_host(const std::string& program) {
  const std::filesystem::path directory = std::filesystem::temp_directory_path() /
                                          ("cohort-bench-predict-" + std::to_string(::getpid()));
  std::filesystem::create_directories(directory);
  std::vector<std::string> reports;
  for (const char* backend : {"tcp", "shm"}) {
    const std::string report = (directory / (std::string(backend) + ".json")).string();
    std::fflush(stdout);
    const int saved_stdout = ::dup(STDOUT_FILENO);
    const int null = ::open("/dev/null", O_WRONLY | O_CLOEXEC);
    ::dup2(null, STDOUT_FILENO);
    ::close(null);
    std::vector<std::string> arguments{
        program, "all_reduce", "--backend", backend, "--np", "2",  "-b", "1K",     "-e",
        "64M",   "-f",         "4",         "-n",    "5",    "-w", "2",  "--json", report};
    if (std::string(backend) == "shm") arguments.push_back("--shared-buffer");
    const int status = launch_self(arguments, {.processes = 2, .timeout_s = 300, .bind = true});
    ::dup2(saved_stdout, STDOUT_FILENO);
    ::close(saved_stdout);
    if (status != 0) {
      throw std::runtime_error("measuring this host (cohort-bench all_reduce --backend " +
                               std::string(backend) + " --np 2) failed with exit status " +
                               std::to_string(status));
    }
    reports.push_back(report);
  }
  std::printf(
      "# measured this host: 2 ranks over TCP and through shared memory, 1 KiB to 64 MiB "
      "(%s, %s; --measured reuses them)\n",
      reports[0].c_str(), reports[1].c_str());
  return reports;
}

}  // namespace detail

// `program`: this program's path, to measure this host where no report is given.
inline int run_predict(PredictSettings s, const std::string& program) {
  validate(s);
  if (s.measured.empty()) s.measured = detail::measure_this_host(program);
  std::vector<model::Measured> fitted_to;
  bool one_host_tcp = false, one_host_segment = false, across_hosts = false;
  for (const std::string& argument : s.measured) {
    const detail::Report report = detail::read_report(argument, s.cores);
    for (const model::Measured& m : report.measured) {
      one_host_tcp |= m.shape.hosts == 1 && m.algorithm != model::Algorithm::kByHost;
      one_host_segment |= m.shape.hosts == 1 && m.algorithm == model::Algorithm::kByHost;
      across_hosts |= m.shape.hosts > 1;
    }
    fitted_to.insert(fitted_to.end(), report.measured.begin(), report.measured.end());
  }
  detail::require(one_host_tcp,
                  "--measured: none of the reports is over TCP on one host (--backend tcp, no "
                  "@HxP): the costs of a message and of a byte on a core come from one");
  const model::Costs fitted = model::fit(fitted_to);
  std::printf("# cohort-bench predict: the cost model fitted to %zu measurements\n",
              fitted_to.size());
  detail::print_costs(fitted);

  double worst = 0;
  for (const std::string& argument : s.check) {
    const detail::Report report = detail::read_report(argument, s.cores);
    detail::require(across_hosts || report.measured.front().shape.hosts == 1,
                    "--check " + argument +
                        ": spans hosts, but no --measured report does: the link's costs come "
                        "from one (FILE@HxP)");
    worst = std::max(worst, detail::print_check(report, fitted));
  }
  if (!s.check.empty()) std::printf("# largest error from 64 KiB: %.1f%%\n#\n", 100 * worst);

  for (const std::size_t parameters : s.parameters) {
    const double gradient = static_cast<double>(parameters) * s.wire_bytes;
    for (const double gbits : s.gbits) {
      model::Costs costs = fitted;
      costs.link_s_per_byte = 8 / (gbits * 1e9 * s.link_efficiency);
      costs.link_message_s = s.latency_us * 1e-6;
      std::printf(
          "# %zu parameters (%s on the wire), computation %s a step, %g Gbit/s links, %d ranks "
          "per host\n",
          parameters, detail::bytes_text(gradient).c_str(),
          detail::seconds_text(s.compute_ms * 1e-3).c_str(), gbits, s.per_host);
      std::printf("# %8s %8s", "hosts", "ranks");
      constexpr model::Algorithm kAll[] = {model::Algorithm::kDeterministic,
                                           model::Algorithm::kRing, model::Algorithm::kByHost};
      for (const model::Algorithm a : kAll) {
        std::printf(" | %-13s %10s %10s %6s %9s", std::string(model::name(a)).c_str(), "all_reduce",
                    "step", "scaled", "bucket");
      }
      std::printf("\n");
      for (const int hosts : s.hosts) {
        const model::Shape shape{hosts, s.per_host};
        std::printf("  %8d %8d", hosts, shape.ranks());
        for (const model::Algorithm a : kAll) {
          if (a == model::Algorithm::kByHost && s.per_host > 1 && !one_host_segment) {
            std::printf(" | %-13s %10s %10s %6s %9s", "", "-", "-", "-", "-");
            continue;
          }
          model::Step best{};
          std::size_t best_bucket = 0;
          for (const std::size_t bucket : s.bucket_bytes) {
            const model::Step step = model::step(a, shape, gradient, static_cast<double>(bucket),
                                                 s.compute_ms * 1e-3, s.backward_fraction, costs);
            if (best_bucket == 0 || step.step_s < best.step_s) {
              best = step;
              best_bucket = bucket;
            }
          }
          const double all_reduce = model::seconds(a, shape, gradient, costs);
          std::printf(" | %-13s %10s %10s %5.2fx %9s", "", detail::seconds_text(all_reduce).c_str(),
                      detail::seconds_text(best.step_s).c_str(),
                      shape.ranks() * best.compute_s / best.step_s,
                      detail::bytes_text(static_cast<double>(best_bucket)).c_str());
        }
        std::printf("\n");
      }
      std::printf("#\n");
    }
  }
  if (!s.parameters.empty()) {
    std::printf(
        "# all_reduce: the whole gradient in one call; step: with the best bucket of those given, "
        "each bucket's all-reduce started once the backward pass has made it (evenly over the "
        "last %.0f%% of the computation); scaled: ranks x computation / step, the speed-up over "
        "one rank\n",
        100 * s.backward_fraction);
  }
  return 0;
}

}  // namespace cohort::bench
