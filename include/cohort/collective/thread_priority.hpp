// ThreadPriority: the priority a communication thread runs at (collective/communication_thread.hpp
// says why it matters), the value of a strategy's Options::communication_priority. A header of its
// own so that what only reads the option (strategy/detail/environment_options.hpp, which every
// strategy includes, Mirrored too) does not parse the thread.
#pragma once

#include <cstdint>
#include <string_view>

namespace cohort::collective {

enum class ThreadPriority : std::uint8_t {
  kAuto,      // real-time where this process may raise it (CAP_SYS_NICE, or RLIMIT_RTPRIO >= 1),
              // else normal
  kNormal,    // as the process's other threads
  kRealtime,  // real-time, or a ConfigError saying why not
};

inline std::string_view name(ThreadPriority priority) {
  switch (priority) {
    case ThreadPriority::kAuto:
      return "auto";
    case ThreadPriority::kNormal:
      return "normal";
    case ThreadPriority::kRealtime:
      return "realtime";
  }
  return "unknown";
}

}  // namespace cohort::collective
