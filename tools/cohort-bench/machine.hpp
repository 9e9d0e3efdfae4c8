// The machine a run is on, for the header lines and the JSON: host name, CPU model, cores, and
// the CPUs a rank may run on.
#pragma once

#include <sched.h>
#include <unistd.h>

#include <fstream>
#include <string>
#include <thread>
#include <vector>

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

// The CPUs this process may run on, in order; empty where the system does not say.
inline std::vector<int> usable_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof set, &set) != 0) return {};
  std::vector<int> cpus;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (CPU_ISSET(cpu, &set)) cpus.push_back(cpu);
  }
  return cpus;
}

// CPUs as taskset lists them: "0-3,6".
inline std::string cpu_list(const std::vector<int>& cpus) {
  std::string text;
  for (std::size_t i = 0; i < cpus.size();) {
    std::size_t last = i;
    while (last + 1 < cpus.size() && cpus[last + 1] == cpus[last] + 1) ++last;
    text += (text.empty() ? "" : ",") + std::to_string(cpus[i]) +
            (last > i ? "-" + std::to_string(cpus[last]) : "");
    i = last + 1;
  }
  return text;
}

inline Machine this_machine() {
  return {host_name(), cpu_model(), std::thread::hardware_concurrency()};
}

}  // namespace cohort::bench
