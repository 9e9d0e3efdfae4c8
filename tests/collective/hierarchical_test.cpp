#include <doctest/doctest.h>
#include <linux/capability.h>
#include <pthread.h>
#include <sched.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cohort/collective/communication_thread.hpp>
#include <cohort/collective/deterministic.hpp>
#include <cohort/collective/hierarchical.hpp>
#include <cohort/collective/local.hpp>
#include <cohort/transport/loopback.hpp>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "collective_checks.hpp"

namespace {

using cohort::ReduceOp;
using Cross = cohort::collective::Deterministic<cohort::transport::Loopback::Endpoint>;
using HostsCommunicator =
    cohort::collective::Hierarchical<cohort::collective::LocalCommunicator, Cross>;

// Runs body on workers x local_size threads wired as the strategy wires them; returns failures.
std::vector<std::string> on_workers(int workers, int local_size, std::size_t bucket_bytes,
                                    const std::function<void(HostsCommunicator&)>& body) {
  cohort::transport::Loopback network({.ranks = workers, .timeout = std::chrono::seconds(20)});
  std::vector<std::string> failures(static_cast<std::size_t>(workers * local_size));
  std::vector<std::jthread> processes;
  for (int worker = 0; worker < workers; ++worker) {
    processes.emplace_back([&, worker] {
      Cross cross(network.endpoint(worker));
      cohort::collective::CommunicationThread thread(cohort::collective::ThreadPriority::kNormal);
      cohort::collective::Local local({.ranks = local_size});
      std::vector<std::jthread> replicas;
      for (int l = 0; l < local_size; ++l) {
        replicas.emplace_back([&, l] {
          HostsCommunicator communicator(local.communicator(l), cross, thread, bucket_bytes);
          try {
            body(communicator);
          } catch (const std::exception& error) {
            failures[static_cast<std::size_t>(communicator.rank())] = error.what();
            communicator.abort(error.what());
          }
        });
      }
    });
  }
  processes.clear();
  return failures;
}

}  // namespace

TEST_CASE("hierarchical all-reduce gives the canonical tree's bits over all replicas") {
  for (auto [workers, local_size] :
       {std::pair{2, 2}, std::pair{4, 1}, std::pair{2, 4}, std::pair{1, 4}}) {
    CAPTURE(workers);
    CAPTURE(local_size);
    const int ranks = workers * local_size;
    const std::size_t length = 70'001;  // several buckets of 64 KiB
    const auto inputs = cohort::testing::cancelling_inputs(ranks, length, 3);
    const std::vector<float> expected = cohort::testing::canonical_sum(inputs);

    const auto failures = on_workers(workers, local_size, 64 * 1024, [&](HostsCommunicator& c) {
      auto buffer = inputs[static_cast<std::size_t>(c.rank())];
      c.all_reduce(std::span<float>(buffer), ReduceOp::kSum);
      if (std::memcmp(buffer.data(), expected.data(), length * sizeof(float)) != 0) {
        throw std::runtime_error("bits differ from the canonical tree");
      }
      std::vector<double> root_value{c.rank() == ranks - 1 ? 42.0 : 0.0};
      c.broadcast(std::span<double>(root_value), ranks - 1);
      if (root_value[0] != 42.0) throw std::runtime_error("wrong broadcast");
      std::vector<std::int64_t> gathered(static_cast<std::size_t>(ranks));
      const std::int64_t mine = c.rank();
      c.all_gather(std::span<const std::int64_t>(&mine, 1), std::span<std::int64_t>(gathered));
      for (int r = 0; r < ranks; ++r) {
        if (gathered[static_cast<std::size_t>(r)] != r)
          throw std::runtime_error("wrong all_gather");
      }
      c.barrier();
    });
    for (const auto& failure : failures) CHECK(failure == "");
  }
}

TEST_CASE("a failing replica in one worker releases every replica of every worker") {
  const auto failures = on_workers(2, 2, 1024, [](HostsCommunicator& c) {
    std::vector<float> buffer(5000, 1.0f);
    c.all_reduce(std::span<float>(buffer), ReduceOp::kSum);
    if (c.rank() == 3) throw std::runtime_error("replica 3 failed");
    c.all_reduce(std::span<float>(buffer), ReduceOp::kSum);
  });
  CHECK(failures[3] == "replica 3 failed");
  for (int rank : {0, 1, 2}) {
    CAPTURE(rank);
    CHECK(failures[static_cast<std::size_t>(rank)] != "");
  }
}

namespace {

using cohort::collective::CommunicationThread;
using cohort::collective::ThreadPriority;

// The scheduling policy and priority the thread runs at, as it sees itself.
std::pair<int, int> scheduling_of(CommunicationThread& thread) {
  int policy = -1;
  sched_param parameter{};
  thread.wait(
      thread.submit([&] { ::pthread_getschedparam(::pthread_self(), &policy, &parameter); }));
  return {policy, parameter.sched_priority};
}

// For its lifetime, the calling thread may not raise a thread to real-time priority: CAP_SYS_NICE
// leaves its effective capabilities and its real-time limit is 0 (both are what the kernel checks;
// a process without the capability has only the limit).
class WithoutRealtimePermission {
 public:
  WithoutRealtimePermission() {
    ::getrlimit(RLIMIT_RTPRIO, &limit_);
    const rlimit none{.rlim_cur = 0, .rlim_max = limit_.rlim_max};
    REQUIRE(::setrlimit(RLIMIT_RTPRIO, &none) == 0);
    REQUIRE(::syscall(SYS_capget, &header_, capabilities_) == 0);
    had_capability_ = (capabilities_[0].effective & (1u << CAP_SYS_NICE)) != 0;
    set_capability(false);
  }
  ~WithoutRealtimePermission() {
    set_capability(had_capability_);
    ::setrlimit(RLIMIT_RTPRIO, &limit_);
  }

 private:
  void set_capability(bool on) {
    __user_cap_data_struct changed[2] = {capabilities_[0], capabilities_[1]};
    if (on) {
      changed[0].effective |= 1u << CAP_SYS_NICE;
    } else {
      changed[0].effective &= ~(1u << CAP_SYS_NICE);
    }
    REQUIRE(::syscall(SYS_capset, &header_, changed) == 0);
  }

  rlimit limit_{};
  __user_cap_header_struct header_{.version = _LINUX_CAPABILITY_VERSION_3, .pid = 0};
  __user_cap_data_struct capabilities_[2]{};
  bool had_capability_ = false;
};

}  // namespace

TEST_CASE("a communication thread asked for normal priority runs as the process's other threads") {
  CommunicationThread thread(ThreadPriority::kNormal);
  CHECK_FALSE(thread.realtime());
  CHECK(thread.refusal().empty());
  CHECK(scheduling_of(thread).first == SCHED_OTHER);
}

TEST_CASE("a communication thread runs at the lowest real-time priority where the process may") {
  CommunicationThread automatic(ThreadPriority::kAuto);
  if (!automatic.realtime()) {
    MESSAGE("skipped: this process may not raise a thread to real-time priority (",
            automatic.refusal(), "); the next test covers that case");
    return;
  }
  CHECK(automatic.refusal().empty());
  CHECK(scheduling_of(automatic) == std::pair{SCHED_FIFO, 1});
  CommunicationThread realtime(ThreadPriority::kRealtime);
  CHECK(scheduling_of(realtime) == std::pair{SCHED_FIFO, 1});
}

TEST_CASE("without permission, kAuto stays normal and says why, and kRealtime is refused") {
  const WithoutRealtimePermission without;
  CommunicationThread automatic(ThreadPriority::kAuto);
  CHECK_FALSE(automatic.realtime());
  CHECK(scheduling_of(automatic).first == SCHED_OTHER);
  CHECK(automatic.refusal().find("real-time priority (SCHED_FIFO 1) was refused") !=
        std::string::npos);
  CHECK(automatic.refusal().find("CAP_SYS_NICE") != std::string::npos);
  CHECK_THROWS_WITH_AS(
      CommunicationThread(ThreadPriority::kRealtime, "COHORT_COMMUNICATION_PRIORITY"),
      doctest::Contains("COHORT_COMMUNICATION_PRIORITY = realtime: real-time priority (SCHED_FIFO "
                        "1) was refused"),
      cohort::ConfigError);
}
