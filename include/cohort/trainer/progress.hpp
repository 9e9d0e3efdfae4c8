// Progress lines printed by the chief while training.
//
// On a terminal the periodic line is rewritten in place and each epoch ends with a line of its
// own; when stdout is a file or a pipe (a cluster log), every report is a line, so logs stay
// greppable.
#pragma once

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "cohort/strategy/elastic.hpp"

namespace cohort {

enum class Progress {
  kAuto,    // in place on a terminal, lines otherwise
  kLines,   // one line per report
  kSilent,  // nothing
};

// Seconds a step spent computing (forward, backward and the fold of its micro-batches: everything
// before the replica's finish_step) and communicating (finish_step: the part of the reduction
// not hidden behind the backward pass, waiting for the slowest replica, and the optimizer step;
// and the all-reduce of the losses).
struct StepTimes {
  double compute = 0.0;
  double communication = 0.0;

  StepTimes& operator+=(const StepTimes& other) {
    compute += other.compute;
    communication += other.communication;
    return *this;
  }
};

// The end of a fit, on the chief: per_replica holds each replica's (compute, communication)
// seconds over the fit's `steps` steps, and name_of(r) names replica r ("worker 1 (rank 1),
// replica 2"). The straggler is the replica that waited least at synchronization, since the
// others waited for it; it is named only where that cost the others something: where their mean
// wait exceeds its own by at least kStragglerShare of a replica's mean time (compute and
// synchronization), and by kStragglerLeastSeconds, a difference the line's hundredths of a second
// show. Otherwise waits that differ by noise would always name someone, in a fit of a small
// model as "it waited 0.00 s, the others 0.00 s".
inline constexpr double kStragglerShare = 0.05;
inline constexpr double kStragglerLeastSeconds = 0.01;

template <class NameOf>
std::string fit_summary(const std::vector<double>& per_replica, std::uint64_t steps,
                        NameOf name_of) {
  const std::size_t replicas = per_replica.size() / 2;
  if (replicas == 0) return {};
  double compute = 0.0;
  double communication = 0.0;
  std::size_t straggler = 0;
  double most = 0.0;  // the longest wait of any replica
  for (std::size_t r = 0; r < replicas; ++r) {
    compute += per_replica[2 * r];
    communication += per_replica[2 * r + 1];
    if (per_replica[2 * r + 1] < per_replica[2 * straggler + 1]) straggler = r;
    most = std::max(most, per_replica[2 * r + 1]);
  }
  const auto n = static_cast<double>(replicas);
  char line[256];
  std::snprintf(line, sizeof line,
                "fit: %llu steps on %zu replica(s), per replica: compute %.2f s, synchronization "
                "%.2f s",
                static_cast<unsigned long long>(steps), replicas, compute / n, communication / n);
  std::string summary = line;
  if (replicas == 1) return summary;
  const double waited = per_replica[2 * straggler + 1];
  const double others_waited = (communication - waited) / (n - 1);
  if (others_waited - waited <
      std::max(kStragglerShare * (compute + communication) / n, kStragglerLeastSeconds)) {
    std::snprintf(line, sizeof line,
                  "; no straggler (every replica waited %.2f to %.2f s at synchronization)", waited,
                  most);
    return summary + line;
  }
  std::snprintf(line, sizeof line, " (it waited %.2f s, the others %.2f s on average)", waited,
                others_waited);
  return summary + "; the others waited most for " + name_of(straggler) + line;
}

// One change of an elastic job's membership, as the chief prints it when it happens and in the
// fit's summary: "workers 4 -> 3 at step 17 (rank 2 lost: <the failure that began it>)", and
// where the state was rebuilt from what the lost membership kept, that too. A grow that failed
// lost no member: "workers 3 -> 3 at step 72 (none taken in: <the failure>)".
inline std::string membership_text(const strategy::MembershipChange& change) {
  std::string why;
  for (const int rank : change.lost) {
    why += (why.empty() ? "rank " : ", rank ") + std::to_string(rank);
  }
  if (!change.lost.empty()) {
    why += " lost: " + change.cause;
  } else if (!change.cause.empty()) {
    why = "none taken in: " + change.cause;
  }
  if (change.from_kept_state) why += "; the state kept at that step rebuilt";
  if (change.joined != 0) {
    why += (why.empty() ? "" : "; ") + std::to_string(change.joined) + " joined";
  }
  char seconds[32];
  std::snprintf(seconds, sizeof seconds, "%.3f", change.seconds);
  return "workers " + std::to_string(change.workers_before) + " -> " +
         std::to_string(change.workers_after) + " at step " + std::to_string(change.step) + " (" +
         why + "), " + seconds + " s";
}

// The figures of one progress line.
struct ProgressLine {
  std::uint64_t step = 0;  // steps done
  double epochs = 0.0;     // epochs done, a fraction within one
  double loss = 0.0;       // mean per example over the line's steps
  double examples_per_second = 0.0;
};

class ProgressPrinter {
 public:
  ProgressPrinter(Progress mode, std::uint64_t steps_per_epoch, std::uint64_t examples_per_step)
      : in_place_(mode == Progress::kAuto && ::isatty(::fileno(stdout))),
        silent_(mode == Progress::kSilent),
        steps_per_epoch_(steps_per_epoch),
        examples_per_step_(examples_per_step) {}

  // After step `step` (0-based, counted since the run began) with its mean loss: the line's
  // figures where a line is due (printed unless silent).
  std::optional<ProgressLine> report(std::uint64_t step, double loss, const StepTimes& times,
                                     bool periodic) {
    window_loss_ += loss;
    ++window_steps_;
    window_times_ += times;
    const bool epoch_end = (step + 1) % steps_per_epoch_ == 0;
    if (!(periodic || epoch_end)) return std::nullopt;
    const auto now = std::chrono::steady_clock::now();
    const double seconds = std::chrono::duration<double>(now - window_start_).count();
    const ProgressLine line{
        .step = step + 1,
        .epochs = static_cast<double>(step + 1) / static_cast<double>(steps_per_epoch_),
        .loss = window_loss_ / static_cast<double>(window_steps_),
        .examples_per_second = static_cast<double>(window_steps_ * examples_per_step_) / seconds};
    if (!silent_) print(line, epoch_end);
    window_start_ = now;
    window_loss_ = 0.0;
    window_steps_ = 0;
    window_times_ = {};
    return line;
  }

  // The next line's examples/s counts from now: after a pause that is not training (an
  // evaluation of held-out data).
  void restart_clock() { window_start_ = std::chrono::steady_clock::now(); }

 private:
  void print(const ProgressLine& line, bool epoch_end) const {
    const std::uint64_t step = line.step - 1;
    std::printf(
        "%sepoch %llu step %llu/%llu loss %.5f examples/s %.0f compute %.2f s comm %.2f s%s",
        in_place_ ? "\r" : "", static_cast<unsigned long long>(step / steps_per_epoch_ + 1),
        static_cast<unsigned long long>(step % steps_per_epoch_ + 1),
        static_cast<unsigned long long>(steps_per_epoch_), line.loss, line.examples_per_second,
        window_times_.compute, window_times_.communication, in_place_ && !epoch_end ? "" : "\n");
    std::fflush(stdout);
  }

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
