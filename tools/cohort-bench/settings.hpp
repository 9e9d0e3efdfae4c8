// Everything cohort-bench can be told on its command line (main.cpp parses it), and the element
// types it measures.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "cohort/core/reduce_op.hpp"
#include "report.hpp"

namespace cohort::bench {

enum class Element : std::uint8_t { kFloat, kDouble, kInt32, kInt64 };

inline constexpr std::string_view name(Element element) {
  switch (element) {
    case Element::kFloat:
      return "float";
    case Element::kDouble:
      return "double";
    case Element::kInt32:
      return "int32";
    case Element::kInt64:
      return "int64";
  }
  return "unknown";
}

// Calls f.template operator()<T>() with the C++ type of `element`.
template <class F>
decltype(auto) with_element(Element element, F&& f) {
  switch (element) {
    case Element::kDouble:
      return f.template operator()<double>();
    case Element::kInt32:
      return f.template operator()<std::int32_t>();
    case Element::kInt64:
      return f.template operator()<std::int64_t>();
    case Element::kFloat:
      break;
  }
  return f.template operator()<float>();
}

// The collective sweep (cohort-bench <collective> ...). Defaults are nccl-tests' own.
struct Settings {
  Collective collective = Collective::kAllReduce;
  std::string backend = "local";
  std::optional<std::string> algorithm;  // tcp: "deterministic" (default) or "ring"; nccl:
                                         // "deterministic" (default) or "nccl"
  std::optional<int> processes;          // --np; default 2 where the launcher does not decide
  std::optional<int> servers;            // --ps: parameter servers (ps backend); default 1
  bool bind = true;  // --bind core: each process this program starts on a CPU of its own
  std::size_t min_bytes = std::size_t{32} << 20;
  std::size_t max_bytes = std::size_t{32} << 20;
  std::size_t step_factor = 1;
  std::size_t step_bytes = std::size_t{1} << 20;
  int iters = 20;
  int warmup_iters = 5;
  bool check = true;
  ReduceOp op = ReduceOp::kSum;
  Element element = Element::kFloat;
  int root = 0;
  std::string json;      // file for the JSON report; empty: none
  bool checksum = true;  // tcp: frame checksums (transport::tcp::Options::checksum)
  // shm: the receive buffer in the shared segment (Deterministic::share_buffer).
  bool shared_buffer = false;
  double timeout_s = 0;  // 0: none; else every rank (thread or process) stops after this long,
                         // and it bounds each TCP transfer and NCCL collective
  bool corrupt = false;  // test only: one wrong element on the last rank after each checked call
};

// The step-level benchmark (cohort-bench step ...).
struct StepSettings {
  std::string strategy = "mirrored";  // or "multi_worker_mirrored"
  std::optional<int> processes;       // --np: replicas (mirrored) or worker processes
  std::size_t local_replicas = 1;     // multi_worker_mirrored: replica threads per worker
  std::vector<std::size_t> parameters{std::size_t{1} << 20};
  int steps = 5;
  int warmup_steps = 1;
  std::size_t bucket_bytes = 0;  // multi_worker_mirrored; 0: the strategy's default
  double backward_us = 0;  // the synthetic backward pass that synchronization may hide behind
  int layers = 8;          // the ranges that backward pass reports ready, last first
  std::string json;
  double timeout_s = 0;
};

// "1M" (10^6, parameters are counted in decimal), "100M", "2.5M", "4096"; nullopt otherwise.
inline std::optional<std::size_t> parse_parameter_count(std::string_view text) {
  if (text.empty()) return std::nullopt;
  double unit = 1;
  switch (text.back()) {
    case 'k':
    case 'K':
      unit = 1e3;
      break;
    case 'm':
    case 'M':
      unit = 1e6;
      break;
    case 'g':
    case 'G':
      unit = 1e9;
      break;
    default:
      break;
  }
  if (unit != 1) text.remove_suffix(1);
  if (text.empty() || text.find_first_not_of("0123456789.") != std::string_view::npos) {
    return std::nullopt;
  }
  double value = 0;
  try {
    std::size_t used = 0;
    value = std::stod(std::string(text), &used);
    if (used != text.size()) return std::nullopt;
  } catch (...) {
    return std::nullopt;
  }
  const double count = value * unit;
  if (!(count >= 1) || count > 1e15 || count != std::floor(count)) return std::nullopt;
  return static_cast<std::size_t>(count);
}

}  // namespace cohort::bench
