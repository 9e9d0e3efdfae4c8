// How a waiting thread spins before it sleeps, whether the peers it waits for are threads
// (collective/local.hpp) or processes (collective/detail/shared_segment.hpp, the TCP transport's
// busy poll), and the cache line that keeps two threads' counters apart.
//
// A waiting rank pauses the core between looks for kPause where every rank can have a CPU, then
// yields between looks, so that a peer waiting for this CPU runs at once (4 processes on
// 2 cores: a 4-byte all-reduce in 2.9 us yielding, 330 us pausing). But the kernel runs a thread
// that yields after every other runnable one: beside other busy programs (a data loader, a second
// job) each yield costs a whole time slice of theirs, where a sleeping rank that its peer wakes
// runs at once. So a yield that took longer than kSlowYield and after which the rank still waits
// (the time went to someone other than the peer it waits for) makes the rank sleep at once for
// kSleepAtOnce; then it tries yielding again. Measured beside two busy loops on 2 cores, yielding
// always vs this way: the Eigen MLP on a thread team of 3, 2,678 forward-backward passes,
// 15-75 s vs 0.06-3.7 s (0.06 s without the loops); 2 to 3 worker processes training it,
// 19.6 s vs 5-6.5 s (0.55 s). Without the loops the same cases took as long both ways (0.06 s,
// 0.53-0.59 s).
#pragma once

#include <chrono>
#include <cstddef>
#include <thread>
#include <utility>

namespace cohort::waiting {

inline constexpr std::size_t kCacheLine = 64;

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// One waiting thread's spinning; not shared between threads.
class Spinner {
 public:
  using Clock = std::chrono::steady_clock;

  // `own_cpu`: whether every rank that this one waits for can have a CPU of its own.
  explicit Spinner(bool own_cpu) : own_cpu_(own_cpu) {}

  // Looks at `done()` until it holds or `budget` has passed, or yielding stops; whether it holds.
  // A zero budget looks once.
  template <class Done>
  bool until(const Done& done, std::chrono::microseconds budget) {
    if (done()) return true;
    if (budget.count() <= 0) return false;
    const auto start = Clock::now();
    bool pausing = own_cpu_;
    for (unsigned looks = 1;; ++looks) {
      if (pausing) {
        cpu_relax();
      } else if (!yield()) {
        return done();
      }
      const bool ended = done();
      looked(ended);
      if (ended) return true;
      if (!pausing || looks % 64 == 0) {
        const auto spun = Clock::now() - start;
        if (spun >= budget) return false;
        pausing = pausing && spun < kPause;
      }
    }
  }

  // Yields the CPU once, unless yielding has stopped for now; whether it yielded. The caller looks
  // at what it waits for next and says whether the wait ended (looked).
  bool yield() {
    const auto now = Clock::now();
    if (now < sleep_at_once_until_) return false;
    std::this_thread::yield();
    yielded_at_ = now;
    yielded_ = true;
    return true;
  }

  // After a yield: whether the wait ended. A slow yield after which it did not stops yielding for
  // kSleepAtOnce.
  void looked(bool ended) {
    if (!std::exchange(yielded_, false) || ended) return;
    const auto now = Clock::now();
    if (now - yielded_at_ >= kSlowYield) sleep_at_once_until_ = now + kSleepAtOnce;
  }

 private:
  static constexpr std::chrono::microseconds kPause{10};
  static constexpr std::chrono::microseconds kSlowYield{500};
  static constexpr std::chrono::milliseconds kSleepAtOnce{100};

  bool own_cpu_;
  bool yielded_ = false;  // a yield awaits looked()
  Clock::time_point yielded_at_{};
  Clock::time_point sleep_at_once_until_{};
};

}  // namespace cohort::waiting
