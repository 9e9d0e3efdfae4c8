// Preemption: what SIGTERM or SIGUSR1 does to a process while it trains.
//
// Kubernetes and Slurm send SIGTERM (Slurm's --signal, often SIGUSR1) some time before they kill a
// process. While a Trainer lives with Trainer::Options::preemption enabled (the default):
//   1. The signal is latched (preemption::requested()) and the process goes on; the signal
//      handler prints one line and arms the grace period.
//   2. Before the first step of a fit, then about every 0.1 s (or 256 steps, where they are
//      faster), the replicas of the whole job agree whether any process was signalled
//      (trainer/vote.hpp: one all-reduce; under ParameterServer a signalled server marks its
//      answers, so that the workers hear of it).
//      They all stop at the same step; a signal between two fits stops the next one before its
//      first step.
//   3. fit returns with Report::preempted, after the chief saved the training state to
//      Preemption::checkpoint, when one is given (a parameter-server job: every server its shard,
//      then the chief the manifest). Restoring it continues the run bit for bit.
//   4. The program ends with kExitPreempted, as the examples do. A process still alive `grace`
//      after the signal (a peer that died, a save that hangs, a program that goes on) is ended
//      by SIGALRM with 128 + the signal's number, as if the signal had killed it.
// Where no Trainer with preemption enabled lives, the signals do what they did before (by
// default, end the process). The grace period uses SIGALRM (alarm(2)), once a signal has been latched.
#pragma once

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>

namespace cohort {

// The exit status of a process that stopped for preemption: "try again later" (sysexits.h's
// EX_TEMPFAIL), as its state is saved and a restart continues it. Launchers and job controllers
// that restart on failure do so; cohort-run reports it as preempted.
inline constexpr int kExitPreempted = 75;

// Trainer::Options::preemption.
struct Preemption {
  bool enabled = true;  // latch SIGTERM and SIGUSR1 during fit (above)
  // Where the chief saves the training state at the agreed step (empty: nothing is saved, the
  // work since the program's own last save is lost).
  std::filesystem::path checkpoint{};
  // From the signal to the process's end, at most; below Kubernetes' default of 30 s.
  std::chrono::seconds grace{20};
};

namespace preemption {
namespace detail {

inline constexpr int kSignals[] = {SIGTERM, SIGUSR1};

// Shared with the signal handlers: lock-free atomics only.
inline std::atomic<int> requested_signal{0};
inline std::atomic<int> watches{0};  // Trainers living with preemption enabled
inline std::atomic<unsigned> grace_seconds{20};
inline std::atomic<bool> installed{false};
inline struct sigaction previous[std::size(kSignals)];

static_assert(std::atomic<int>::is_always_lock_free && std::atomic<bool>::is_always_lock_free);

inline void say(const char* text) {
  const ssize_t ignored = ::write(STDERR_FILENO, text, std::strlen(text));
  (void)ignored;
}

extern "C" inline void on_grace_expired(int) {
  say("cohort: the preemption grace period ended before the process did; exiting\n");
  ::_exit(128 + requested_signal.load());
}

extern "C" inline void on_signal(int signal) {
  if (watches.load() == 0) {
    // No Trainer watches: what the process did before with this signal.
    for (std::size_t i = 0; i < std::size(kSignals); ++i) {
      if (kSignals[i] == signal) ::sigaction(signal, &previous[i], nullptr);
    }
    installed.store(false);
    ::raise(signal);
    return;
  }
  int none = 0;
  if (!requested_signal.compare_exchange_strong(none, signal)) return;  // latched already
  struct sigaction expire {};
  expire.sa_handler = &on_grace_expired;
  ::sigaction(SIGALRM, &expire, nullptr);
  ::alarm(grace_seconds.load());
  say(signal == SIGTERM ? "cohort: SIGTERM: the job stops after the step all its processes agree "
                          "on (preemption)\n"
                        : "cohort: SIGUSR1: the job stops after the step all its processes agree "
                          "on (preemption)\n");
}

inline void install() {
  if (installed.exchange(true)) return;
  struct sigaction action {};
  action.sa_handler = &on_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  for (std::size_t i = 0; i < std::size(kSignals); ++i) {
    ::sigaction(kSignals[i], &action, &previous[i]);
  }
}

}  // namespace detail

// Whether a signal asked this process to stop: its number, or 0.
inline int requested() { return detail::requested_signal.load(std::memory_order_relaxed); }

// While a Watch lives (a Trainer with preemption enabled), SIGTERM and SIGUSR1 are latched as
// above.
class Watch {
 public:
  explicit Watch(const Preemption& preemption) : enabled_(preemption.enabled) {
    if (!enabled_) return;
    detail::grace_seconds.store(static_cast<unsigned>(preemption.grace.count()));
    detail::watches.fetch_add(1);
    detail::install();
  }
  ~Watch() {
    if (enabled_) detail::watches.fetch_sub(1);
  }
  Watch(const Watch&) = delete;
  Watch& operator=(const Watch&) = delete;

 private:
  bool enabled_;
};

}  // namespace preemption
}  // namespace cohort
