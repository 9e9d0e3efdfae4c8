// A team of threads that a model owns: run(task) calls task(0) on the calling thread and task(1)
// .. task(size() - 1) on the team's own threads, all at once, and returns when every call has.
//
// Each model replica owns its team, so replicas that train side by side (Mirrored runs one
// replica per thread) never share threads or a thread count. A copy is a new team of the same
// size. A waiting thread waits as collective::Local's ranks do, with the same spinner
// (cohort/core/spin.hpp, which says how it spins): it spins up to 100 us, then sleeps (C++20
// atomic wait, a futex). A model's threads meet several times per micro-batch, and a wake-up from
// sleep costs tens of microseconds (measured, 2 threads on 784-1024-1024-10: 17,600-17,800
// examples/s sleeping at once, 19,900-20,300 spinning first); an idle team costs no processor
// time.
//
// A task must not throw: an exception on a team thread ends the program (std::terminate).
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "cohort/core/spin.hpp"

namespace example {

class ThreadTeam {
 public:
  explicit ThreadTeam(std::size_t size) : state_(std::make_unique<State>()) {
    state_->own_cpus = size <= std::max(1u, std::thread::hardware_concurrency());
    state_->caller = cohort::waiting::Spinner(state_->own_cpus);
    threads_.reserve(size > 0 ? size - 1 : 0);
    for (std::size_t index = 1; index < size; ++index) {
      threads_.emplace_back([state = state_.get(), index] { serve(*state, index); });
    }
  }
  ThreadTeam(const ThreadTeam& other) : ThreadTeam(other.size()) {}
  ThreadTeam(ThreadTeam&& other) noexcept = default;
  ThreadTeam& operator=(ThreadTeam other) noexcept {
    std::swap(state_, other.state_);
    std::swap(threads_, other.threads_);
    return *this;
  }
  ~ThreadTeam() {
    if (threads_.empty()) return;
    state_->stopping = true;
    state_->generation.fetch_add(1, std::memory_order_release);
    state_->generation.notify_all();
    for (std::thread& thread : threads_) thread.join();
  }

  std::size_t size() const { return threads_.size() + 1; }

  template <class Task>
  void run(Task&& task) {
    if (threads_.empty()) {
      task(std::size_t{0});
      return;
    }
    State& state = *state_;
    state.task = const_cast<void*>(static_cast<const void*>(&task));
    state.call = [](void* erased, std::size_t index) {
      (*static_cast<std::remove_reference_t<Task>*>(erased))(index);
    };
    state.pending.store(static_cast<std::uint32_t>(threads_.size()), std::memory_order_relaxed);
    state.generation.fetch_add(1, std::memory_order_release);
    state.generation.notify_all();
    task(std::size_t{0});
    state.caller.until([&] { return state.pending.load(std::memory_order_acquire) == 0; }, kSpin);
    for (std::uint32_t pending; (pending = state.pending.load(std::memory_order_acquire)) != 0;) {
      state.pending.wait(pending, std::memory_order_acquire);
    }
  }

 private:
  // 32-bit counters: the width the kernel's futex waits on directly.
  struct State {
    std::atomic<std::uint32_t> generation{0};  // one more per run (and for the stop)
    std::atomic<std::uint32_t> pending{0};     // team threads still in the current run
    void* task = nullptr;
    void (*call)(void*, std::size_t) = nullptr;
    bool stopping = false;
    bool own_cpus = false;  // whether every thread of the team can have a hardware thread
    cohort::waiting::Spinner caller{false};  // run()'s, on the team's owner thread
  };

  static void serve(State& state, std::size_t index) noexcept {
    std::uint32_t seen = 0;
    cohort::waiting::Spinner spinner(state.own_cpus);
    for (;;) {
      spinner.until([&] { return state.generation.load(std::memory_order_acquire) != seen; },
                    kSpin);
      state.generation.wait(seen, std::memory_order_acquire);
      seen = state.generation.load(std::memory_order_acquire);
      if (state.stopping) return;
      state.call(state.task, index);
      if (state.pending.fetch_sub(1, std::memory_order_acq_rel) == 1) state.pending.notify_one();
    }
  }

  static constexpr std::chrono::microseconds kSpin{100};

  std::unique_ptr<State> state_;
  std::vector<std::thread> threads_;
};

}  // namespace example
