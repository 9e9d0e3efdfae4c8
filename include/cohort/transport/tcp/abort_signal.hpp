// AbortSignal: the request, from any thread, that the thread running a Tcp's transfers stop and
// leave with a reason (Tcp::abort). The first reason wins. An eventfd in every poll of the
// transfer loop wakes that thread at once: shutting the sockets down would wake it too, but would
// tell every peer "closed" before the reason could reach them.
#pragma once

#include <sys/eventfd.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>

namespace cohort::transport::tcp {

class AbortSignal {
 public:
  // Without an eventfd (the system refused one) the signal still works, noticed when the
  // transfer thread next wakes for its sockets or its deadline.
  AbortSignal() noexcept : wake_(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {}
  AbortSignal(AbortSignal&& other) noexcept
      : wake_(std::exchange(other.wake_, -1)),
        reason_(std::move(other.reason_)),
        claimed_(other.claimed_.load()),
        raised_(other.raised_.load()) {}
  AbortSignal& operator=(AbortSignal&&) = delete;
  ~AbortSignal() {
    if (wake_ >= 0) ::close(wake_);
  }

  // Safe from any thread, at any time; only the first call's reason is kept.
  void raise(std::string_view reason) noexcept {
    if (claimed_.exchange(true)) return;
    try {
      reason_ = reason;
    } catch (...) {  // out of memory: the abort goes on without its reason
    }
    raised_.store(true, std::memory_order_release);
    if (wake_ >= 0) {
      const std::uint64_t one = 1;
      [[maybe_unused]] const auto written = ::write(wake_, &one, sizeof one);
    }
  }

  bool raised() const noexcept { return raised_.load(std::memory_order_acquire); }
  // The first reason; read only once raised().
  const std::string& reason() const noexcept { return reason_; }
  // Readable from the first raise() on, for poll(); -1 where there is no eventfd (poll skips it).
  int descriptor() const noexcept { return wake_; }

 private:
  int wake_;
  std::string reason_;
  std::atomic<bool> claimed_ = false;  // a raise() has begun: the reason is the first caller's
  std::atomic<bool> raised_ = false;   // the reason is written
};

}  // namespace cohort::transport::tcp
