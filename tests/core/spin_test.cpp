#include "cohort/core/spin.hpp"

#include <doctest/doctest.h>
#include <sched.h>

#include <atomic>
#include <chrono>
#include <thread>

namespace {

using Clock = std::chrono::steady_clock;

// Pins the calling thread to `cpu`.
void pin_to(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  REQUIRE(::sched_setaffinity(0, sizeof set, &set) == 0);
}

// Pins the calling thread to the first CPU it may use, for as long as it lives.
class PinnedToOneCpu {
 public:
  PinnedToOneCpu() {
    CPU_ZERO(&allowed_);
    REQUIRE(::sched_getaffinity(0, sizeof allowed_, &allowed_) == 0);
    while (!CPU_ISSET(cpu_, &allowed_)) ++cpu_;
    pin_to(cpu_);
  }
  ~PinnedToOneCpu() { ::sched_setaffinity(0, sizeof allowed_, &allowed_); }
  int cpu() const { return cpu_; }

 private:
  cpu_set_t allowed_;
  int cpu_ = 0;
};

// Another program that keeps this thread's CPU busy, for as long as it lives.
class BusyNeighbour {
 public:
  explicit BusyNeighbour(int cpu)
      : thread_([this, cpu] {
          pin_to(cpu);
          while (!stop_.load(std::memory_order_relaxed)) {
          }
        }) {}
  ~BusyNeighbour() {
    stop_ = true;
    thread_.join();
  }

 private:
  std::atomic<bool> stop_ = false;
  std::thread thread_;
};

// Yields until one yield gives the neighbour a time slice (takes 2 ms or more), telling the spinner
// after each that the wait ended; false if none did in 500 tries.
bool yield_until_one_is_slow(cohort::waiting::Spinner& spinner) {
  for (int attempt = 0; attempt < 500; ++attempt) {
    const auto before = Clock::now();
    if (!spinner.yield()) return false;
    const bool slow = Clock::now() - before >= std::chrono::milliseconds(2);
    spinner.looked(true);
    if (slow) return true;
  }
  return false;
}

// Yields, telling the spinner after each that the wait goes on, until it stops yielding: a yield
// was slow by its own measure (the neighbour's time slice, or another program's on a busy
// machine); false if it yielded 500 times.
bool yield_until_it_stops(cohort::waiting::Spinner& spinner) {
  for (int attempt = 0; attempt < 500; ++attempt) {
    if (!spinner.yield()) return true;
    spinner.looked(false);
  }
  return false;
}

}  // namespace

TEST_CASE(
    "a spinner stops yielding after a yield that another program took, and tries again later") {
  const PinnedToOneCpu pinned;
  const BusyNeighbour neighbour(pinned.cpu());
  cohort::waiting::Spinner spinner(false);

  // A slow yield after which the wait ended served the peer: yielding goes on.
  REQUIRE(yield_until_one_is_slow(spinner));
  CHECK(spinner.yield());
  spinner.looked(true);

  // A slow yield after which the rank still waits went to someone else: sleep at once for now.
  REQUIRE(yield_until_it_stops(spinner));
  CHECK_FALSE(spinner.yield());
  int looks = 0;
  CHECK_FALSE(spinner.until([&] { return ++looks > 1000; }, std::chrono::microseconds(100)));
  CHECK(looks == 2);  // before and after the yield it did not make

  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // past the back-off
  CHECK(spinner.yield());
}

TEST_CASE("a spinner looks once on a zero budget, and at once when the wait has ended") {
  for (const bool own_cpu : {false, true}) {
    CAPTURE(own_cpu);
    cohort::waiting::Spinner spinner(own_cpu);
    int looks = 0;
    CHECK_FALSE(spinner.until([&] { return ++looks < 0; }, std::chrono::microseconds(0)));
    CHECK(looks == 1);
    CHECK(spinner.until([] { return true; }, std::chrono::microseconds(100)));
  }
}
