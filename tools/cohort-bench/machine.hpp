// The machine a run is on, for the header lines and the JSON: host name, CPU model, cores.
#pragma once

#include <unistd.h>

#include <fstream>
#include <string>
#include <thread>

#include "report.hpp"

namespace cohort::bench {

inline std::string host_name() {
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) != 0) return "unknown";
  return name;
}

// The first "model name" of /proc/cpuinfo (x86), else its "Hardware" or "CPU part" line (Arm).
inline std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string fallback;
  for (std::string line; std::getline(in, line);) {
    const auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::string key = line.substr(0, colon);
    while (!key.empty() && (key.back() == ' ' || key.back() == '\t')) key.pop_back();
    std::string value = line.substr(colon + 1);
    while (!value.empty() && value.front() == ' ') value.erase(value.begin());
    if (key == "model name" && !value.empty()) return value;
    if ((key == "Hardware" || key == "CPU part") && fallback.empty()) fallback = value;
  }
  return fallback.empty() ? "unknown" : fallback;
}

inline Machine this_machine() {
  return {host_name(), cpu_model(), std::thread::hardware_concurrency()};
}

}  // namespace cohort::bench
