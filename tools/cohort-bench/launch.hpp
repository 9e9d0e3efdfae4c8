// cohort-bench as its own launcher: when a multi-process backend runs outside any launcher, the
// program starts --np copies of itself with the COHORT_* variables cohort-run would give them
// (docs/launching.md), with the same arguments, and waits for them. For a parameter-server job
// (--ps S) it starts --np workers and then S servers, with the roles cohort-run --ps S gives them.
//
// With `bind`, rank r runs on the r-th CPU this program may use, as mpirun binds ranks to cores
// where there are no more ranks than cores: a comparison with Open MPI then places both
// libraries' ranks alike, and no two busy ranks can share a core. Where ranks outnumber the CPUs
// nothing is bound.
//
// Ranks share this process's stdout and stderr; only rank 0 prints the table. Each rank dies with
// SIGKILL if the launcher dies (PR_SET_PDEATHSIG), so nothing outlives a killed benchmark. When a
// rank fails, the others get `grace` to notice (their collectives fail once its connections
// close) and are then killed. Exit status: 0 when every rank exited 0; else the first failed
// rank's status (128 + signal when killed); 124 when the timeout stopped the run.
#pragma once

#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "cohort/cluster/environment.hpp"
#include "machine.hpp"

extern char** environ;

namespace cohort::bench {

// Set in every rank this launcher starts to how it started them ("cohort-bench --np 2 --bind
// core"), so that the header can say who launched it and where its ranks run.
inline constexpr std::string_view kLaunchedVariable = "COHORT_BENCH_LAUNCHED";

// Whether launch_self started this process (then its timeout bounds this rank already).
inline bool launched_by_self() {
  return std::getenv(std::string(kLaunchedVariable).c_str()) != nullptr;
}

struct LaunchOptions {
  int processes = 2;
  int servers = 0;       // parameter servers started after the `processes` workers; 0: no roles
  double timeout_s = 0;  // 0: none
  bool bind = false;     // a CPU of its own for each rank, where there are enough (top of file)
  std::chrono::seconds grace{10};
};

namespace detail {

// The port the kernel gives a socket bound to 127.0.0.1:0 (another program may take it before
// rank 0 binds it, the race every launcher of this kind has; the rendezvous then fails loudly).
inline std::optional<std::uint16_t> free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return std::nullopt;
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof address;
  std::optional<std::uint16_t> port;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) == 0) {
    port = ntohs(address.sin_port);
  }
  ::close(fd);
  return port;
}

// This environment without any launcher's rank variables (ours are added afterwards).
inline std::vector<std::string> inherited_environment() {
  namespace variable = cluster::variable;
  const std::string_view ours[] = {
      variable::kRank,           variable::kWorldSize,  variable::kLocalRank,
      variable::kLocalWorldSize, variable::kMasterAddr, variable::kMasterPort,
      variable::kJobId,          kLaunchedVariable,     variable::kRole,
      variable::kPsCount,        variable::kWorkerCount};
  std::vector<std::string> entries;
  for (char** entry = environ; *entry != nullptr; ++entry) {
    const std::string_view text = *entry;
    const std::string_view name = text.substr(0, text.find('='));
    bool dropped = false;
    for (const std::string_view n : ours) dropped = dropped || n == name;
    for (const std::string_view n : variable::kOtherLaunchers) dropped = dropped || n == name;
    if (!dropped) entries.emplace_back(text);
  }
  return entries;
}

inline std::string describe_status(int status) {
  if (WIFSIGNALED(status)) {
    return "was killed by signal " + std::to_string(WTERMSIG(status)) + " (" +
           ::strsignal(WTERMSIG(status)) + ")";
  }
  return "exited with status " + std::to_string(WEXITSTATUS(status));
}

}  // namespace detail

// Bounds a run in this process (threads, or one rank started by another launcher): after `seconds`
// (0: never) it says so and exits 124 at once, as launch_self's timeout does for the ranks it
// starts. Stopped when destroyed.
class Watchdog {
 public:
  explicit Watchdog(double seconds) {
    if (seconds <= 0) return;
    thread_ = std::jthread([seconds](std::stop_token stop) {
      std::mutex mutex;
      std::condition_variable_any wake;
      std::unique_lock lock(mutex);
      if (!wake.wait_for(lock, stop, std::chrono::duration<double>(seconds),
                         [&] { return stop.stop_requested(); })) {
        std::fprintf(stderr, "cohort-bench: timed out after %g s; stopping\n", seconds);
        std::fflush(stdout);
        std::_Exit(124);
      }
    });
  }

 private:
  std::jthread thread_;
};

// Starts options.processes copies of this program with `arguments` (argv, argv[0] included) and
// waits for them; returns the exit status described above.
inline int launch_self(const std::vector<std::string>& arguments, const LaunchOptions& options) {
  using Clock = std::chrono::steady_clock;
  const auto say = [](const std::string& line) {
    std::fprintf(stderr, "cohort-bench: %s\n", line.c_str());
  };
  char exe[4096] = {};
  const ssize_t length = ::readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (length <= 0) {
    say(std::string("cannot find this program (/proc/self/exe): ") + std::strerror(errno));
    return 1;
  }
  const std::optional<std::uint16_t> port = detail::free_port();
  if (!port) {
    say(std::string("cannot find a free port on 127.0.0.1: ") + std::strerror(errno));
    return 1;
  }
  const std::string job_id = "cohort-bench-" +
                             std::to_string(std::chrono::duration_cast<std::chrono::seconds>(
                                                std::chrono::system_clock::now().time_since_epoch())
                                                .count()) +
                             "-" + std::to_string(::getpid());
  std::fflush(stdout);
  std::fflush(stderr);

  const int total = options.processes + options.servers;
  const std::vector<int> cpus = usable_cpus();
  const bool bound = options.bind && total <= static_cast<int>(cpus.size());
  std::string launched = "cohort-bench --np " + std::to_string(options.processes) +
                         (options.servers > 0 ? " --ps " + std::to_string(options.servers) : "") +
                         (bound ? " --bind core" : " --bind none");
  if (options.bind && !bound) {
    launched += " (" + std::to_string(total) + " ranks, " + std::to_string(cpus.size()) + " CPUs)";
  }

  namespace variable = cluster::variable;
  const pid_t parent = ::getpid();
  std::vector<pid_t> ranks;
  for (int rank = 0; rank < total; ++rank) {
    std::vector<std::string> environment = detail::inherited_environment();
    const auto set = [&](std::string_view name, const std::string& value) {
      environment.push_back(std::string(name) + "=" + value);
    };
    // As cohort-run --ps: workers 0 .. W-1 and servers 0 .. S-1, each counted in its own role.
    const bool server = rank >= options.processes;
    const int index = server ? rank - options.processes : rank;
    const int size = server ? options.servers : options.processes;
    if (options.servers > 0) {
      set(variable::kRole, server ? "ps" : "worker");
      set(server ? variable::kWorkerCount : variable::kPsCount,
          std::to_string(server ? options.processes : options.servers));
    }
    set(variable::kRank, std::to_string(index));
    set(variable::kWorldSize, std::to_string(size));
    set(variable::kLocalRank, std::to_string(index));
    set(variable::kLocalWorldSize, std::to_string(size));
    set(variable::kMasterAddr, "127.0.0.1");
    set(variable::kMasterPort, std::to_string(*port));
    set(variable::kJobId, job_id);
    set(kLaunchedVariable, launched);
    std::vector<std::string> argv_strings = arguments;
    std::vector<char*> argv;
    for (std::string& a : argv_strings) argv.push_back(a.data());
    argv.push_back(nullptr);
    std::vector<char*> envp;
    for (std::string& e : environment) envp.push_back(e.data());
    envp.push_back(nullptr);

    const pid_t pid = ::fork();
    if (pid < 0) {
      say(std::string("cannot start rank ") + std::to_string(rank) + ": " + std::strerror(errno));
      for (const pid_t started : ranks) ::kill(started, SIGKILL);
      for (const pid_t started : ranks) ::waitpid(started, nullptr, 0);
      return 1;
    }
    if (pid == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(128 + SIGKILL);  // the launcher died before prctl
      if (bound) {
        cpu_set_t set;
        CPU_ZERO(&set);
        CPU_SET(cpus[static_cast<std::size_t>(rank)], &set);
        ::sched_setaffinity(0, sizeof set, &set);  // a refusal leaves the rank unbound
      }
      ::execve(exe, argv.data(), envp.data());
      ::_exit(127);
    }
    ranks.push_back(pid);
  }

  const auto start = Clock::now();
  Clock::time_point kill_at = Clock::time_point::max();  // after a rank failed
  int exit_code = 0;
  std::size_t running = ranks.size();
  std::vector<bool> done(ranks.size(), false);
  while (running > 0) {
    int status = 0;
    const pid_t pid = ::waitpid(-1, &status, WNOHANG);
    if (pid > 0) {
      for (std::size_t rank = 0; rank < ranks.size(); ++rank) {
        if (ranks[rank] != pid || done[rank]) continue;
        done[rank] = true;
        --running;
        const bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
        if (!ok && exit_code == 0) {
          exit_code = WIFSIGNALED(status) ? 128 + WTERMSIG(status) : WEXITSTATUS(status);
          if (WIFSIGNALED(status))
            say("rank " + std::to_string(rank) + " " + detail::describe_status(status));
          kill_at = Clock::now() + options.grace;
        }
      }
      continue;
    }
    const auto now = Clock::now();
    if (options.timeout_s > 0 && exit_code != 124 &&
        now - start > std::chrono::duration<double>(options.timeout_s)) {
      char seconds[32];
      std::snprintf(seconds, sizeof seconds, "%g", options.timeout_s);
      say(std::string("timed out after ") + seconds + " s; stopping every rank");
      exit_code = 124;
      for (std::size_t rank = 0; rank < ranks.size(); ++rank) {
        if (!done[rank]) ::kill(ranks[rank], SIGKILL);
      }
    }
    if (now >= kill_at) {
      for (std::size_t rank = 0; rank < ranks.size(); ++rank) {
        if (done[rank]) continue;
        say("rank " + std::to_string(rank) + " still running " +
            std::to_string(options.grace.count()) + " s after another failed; killing it");
        ::kill(ranks[rank], SIGKILL);
      }
      kill_at = Clock::time_point::max();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return exit_code;
}

}  // namespace cohort::bench
