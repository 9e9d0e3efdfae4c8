// Progress lines printed by the chief while training.
//
// On a terminal the periodic line is rewritten in place and each epoch ends with a line of its
// own; when stdout is a file or a pipe (a cluster log), every report is a line, so logs stay
// greppable.
#pragma once

#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>

namespace cohort {

enum class Progress {
  kAuto,    // in place on a terminal, lines otherwise
  kLines,   // one line per report
  kSilent,  // nothing
};

// Seconds a step spent computing (forward, backward, update) and communicating (collectives,
// including waiting for the slowest replica).
struct StepTimes {
  double compute = 0.0;
  double communication = 0.0;

  StepTimes& operator+=(const StepTimes& other) {
    compute += other.compute;
    communication += other.communication;
    return *this;
  }
};

class ProgressPrinter {
 public:
  ProgressPrinter(Progress mode, std::uint64_t steps_per_epoch, std::uint64_t examples_per_step)
      : in_place_(mode == Progress::kAuto && ::isatty(::fileno(stdout))),
        silent_(mode == Progress::kSilent),
        steps_per_epoch_(steps_per_epoch),
        examples_per_step_(examples_per_step) {}

  // After step `step` (0-based, counted since the run began) with its mean loss.
  void report(std::uint64_t step, double loss, const StepTimes& times, bool periodic) {
    window_loss_ += loss;
    ++window_steps_;
    window_times_ += times;
    const bool epoch_end = (step + 1) % steps_per_epoch_ == 0;
    if (silent_ || !(periodic || epoch_end)) return;
    const auto now = std::chrono::steady_clock::now();
    const double seconds = std::chrono::duration<double>(now - window_start_).count();
    std::printf(
        "%sepoch %llu step %llu/%llu loss %.5f examples/s %.0f compute %.2f s comm %.2f s%s",
        in_place_ ? "\r" : "", static_cast<unsigned long long>(step / steps_per_epoch_ + 1),
        static_cast<unsigned long long>(step % steps_per_epoch_ + 1),
        static_cast<unsigned long long>(steps_per_epoch_),
        window_loss_ / static_cast<double>(window_steps_),
        static_cast<double>(window_steps_ * examples_per_step_) / seconds, window_times_.compute,
        window_times_.communication, in_place_ && !epoch_end ? "" : "\n");
    std::fflush(stdout);
    window_start_ = now;
    window_loss_ = 0.0;
    window_steps_ = 0;
    window_times_ = {};
  }

 private:
  bool in_place_;
  bool silent_;
  std::uint64_t steps_per_epoch_;
  std::uint64_t examples_per_step_;
  std::chrono::steady_clock::time_point window_start_ = std::chrono::steady_clock::now();
  double window_loss_ = 0.0;
  std::uint64_t window_steps_ = 0;
  StepTimes window_times_;
};

}  // namespace cohort
