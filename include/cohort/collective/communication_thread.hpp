// CommunicationThread: a process's traffic between processes (a bucket's cross-worker all-reduce,
// a parameter-server worker's pushes) runs in submission order on a thread of its own, while the
// replica threads go on with the backward pass.
//
// Its priority decides whether that overlap happens. When every core computes, the scheduler lets
// a woken thread wait for the running one's time slice (milliseconds), and a transfer wakes its
// thread at every exchange, so at normal priority a bucket waits for the backward pass to end:
// across 2 hosts on shaped links, 6% of a 25M-parameter model's all-reduce hid behind its
// backward pass at normal priority, 75% at real-time priority (docs/benchmarks.md, "Overlap
// across hosts"). Real-time priority here is SCHED_FIFO 1, the lowest real-time priority: above
// every normal thread, below the kernel's real-time threads (interrupt threads, migration). The
// thread sleeps whenever it has nothing to move, and by default the kernel keeps 5% of the CPU
// time for normal threads (sched_rt_runtime_us). Where the traffic is CPU work instead (processes
// of one host that all-reduce through shared memory), real-time priority only preempts the
// backward pass sooner: run_at_normal_priority().
#pragma once

#include <pthread.h>
#include <sched.h>

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>

#include "cohort/collective/thread_priority.hpp"
#include "cohort/core/error.hpp"
#include "cohort/core/options.hpp"
#include "cohort/core/trace.hpp"

namespace cohort::collective {

// Runs cross-process operations in submission order on a thread of their own.
class CommunicationThread {
 public:
  // `field`: where the priority came from (an option or a variable), for the ConfigError of a
  // refused kRealtime.
  explicit CommunicationThread(ThreadPriority priority,
                               std::string_view field = "communication_priority")
      : thread_([this](std::stop_token stop) { serve(stop); }) {
    if (priority == ThreadPriority::kNormal) return;
    const sched_param realtime{.sched_priority = 1};
    const int error = ::pthread_setschedparam(thread_.native_handle(), SCHED_FIFO, &realtime);
    if (error == 0) {
      realtime_ = true;
      return;
    }
    refusal_ = std::string("real-time priority (SCHED_FIFO 1) was refused: ") +
               std::strerror(error) +
               "; a process may raise it with CAP_SYS_NICE or a real-time limit of at least 1 "
               "(ulimit -r, or rtprio in /etc/security/limits.conf)";
    if (priority == ThreadPriority::kRealtime) {
      stop();
      options::reject(field, name(priority), refusal_);
    }
  }

  ~CommunicationThread() { stop(); }

  CommunicationThread(const CommunicationThread&) = delete;
  CommunicationThread& operator=(const CommunicationThread&) = delete;

  bool realtime() const { return realtime_; }

  // Back to normal priority, for a process whose traffic turned out to be CPU work rather than a
  // wait on a network (MultiWorkerMirrored's workers of one host, which all-reduce through shared
  // memory): there real-time priority only preempts the backward pass sooner. Lowering a
  // thread's priority needs no permission.
  void run_at_normal_priority() {
    const sched_param normal{.sched_priority = 0};
    ::pthread_setschedparam(thread_.native_handle(), SCHED_OTHER, &normal);
    realtime_ = false;
  }

  // Why a kAuto thread runs at normal priority; empty when it runs at real-time priority or was
  // asked for normal.
  const std::string& refusal() const { return refusal_; }

  // Returns the work's ticket, for wait(ticket).
  std::size_t submit(std::function<void()> work) {
    std::lock_guard lock(mutex_);
    queue_.push_back({std::move(work), trace::Recorder::Clock::now()});
    ++submitted_;
    work_ready_.notify_all();
    return submitted_;
  }

  // Waits until the work of `ticket` and everything submitted before it has run; rethrows the
  // first failure.
  void wait(std::size_t ticket) {
    std::unique_lock lock(mutex_);
    done_.wait(lock, [&] { return completed_ >= ticket || failure_; });
    if (failure_) std::rethrow_exception(failure_);
  }

  // Waits until everything submitted has run; rethrows the first failure.
  void wait() {
    std::unique_lock lock(mutex_);
    const std::size_t ticket = submitted_;
    lock.unlock();
    wait(ticket);
  }

 private:
  struct Work {
    std::function<void()> run;
    trace::Recorder::Clock::time_point submitted;
  };

  void stop() {
    thread_.request_stop();
    {
      // Under the lock, so that the thread is either before its wait (and sees the request) or
      // inside it (and is woken).
      std::lock_guard lock(mutex_);
    }
    work_ready_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

  void serve(std::stop_token stop) {
    while (true) {
      Work work;
      std::size_t ticket = 0;
      {
        std::unique_lock lock(mutex_);
        work_ready_.wait(lock, [&] { return stop.stop_requested() || !queue_.empty(); });
        if (stop.stop_requested()) return;
        work = std::move(queue_.front());
        queue_.pop_front();
        ticket = completed_ + 1;
      }
      std::exception_ptr failure;
      if (!failure_) {  // after a failure, later work is dropped: the group is unusable
        trace::Recorder* const recorder = trace::current();
        if (recorder != nullptr && recorder != named_in_) {
          recorder->name_thread("communication");
          named_in_ = recorder;
        }
        if (recorder != nullptr) {
          recorder->record(trace::Phase::kBucketQueued, work.submitted,
                           trace::Recorder::Clock::now(), {.index = ticket});
        }
        try {
          const trace::Span wire(recorder, trace::Phase::kBucketWire, {.index = ticket});
          work.run();
        } catch (...) {
          failure = std::current_exception();
        }
      }
      std::lock_guard lock(mutex_);
      if (failure && !failure_) failure_ = failure;
      ++completed_;
      done_.notify_all();
    }
  }

  std::mutex mutex_;
  std::condition_variable work_ready_;
  std::condition_variable done_;
  std::deque<Work> queue_;
  std::size_t submitted_ = 0;
  std::size_t completed_ = 0;
  std::exception_ptr failure_;
  trace::Recorder* named_in_ = nullptr;  // the recorder that knows this thread's name
  bool realtime_ = false;
  std::string refusal_;
  std::jthread thread_;  // last: started after, and stopped before, the state it uses
};

}  // namespace cohort::collective
