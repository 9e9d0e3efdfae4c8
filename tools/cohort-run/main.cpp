// cohort-run: starts N ranks of a program on this host, as `torchrun --standalone` does.
//
//   cohort-run --np N [--min-np M] [--max-restarts K] [--ps S] [--port P] [--job-id ID]
//              [--timeout-s S] [--wait-s W] [--grace-s G] -- program args...
//
// With --ps S (a parameter-server job, strategy/parameter_server.hpp) it starts N workers and S
// servers of the same program: workers get COHORT_ROLE=worker, COHORT_RANK 0..N-1,
// COHORT_WORLD_SIZE=N and COHORT_PS_COUNT=S; servers get COHORT_ROLE=ps, COHORT_RANK 0..S-1,
// COHORT_WORLD_SIZE=S and COHORT_WORKER_COUNT=N. Messages name them "worker i" and "ps j".
//
// Each rank gets COHORT_RANK, COHORT_WORLD_SIZE, COHORT_LOCAL_RANK, COHORT_LOCAL_WORLD_SIZE,
// COHORT_MASTER_ADDR=127.0.0.1, COHORT_MASTER_PORT and COHORT_JOB_ID, and loses the rank variables
// of other launchers (cluster::variable::kOtherLaunchers): they describe the launch around
// cohort-run, if any, and cohort::cluster::resolve would refuse the disagreement. Without --port,
// the kernel picks a free port (bind to port 0, read it, close); another process may take it
// before rank 0 binds it, a race every launcher of this kind has.
//
// Ranks inherit stdout and stderr (no prefixes, as torchrun's default); stdin is /dev/null, so
// that N processes never compete for the terminal. Each rank runs in its own process group, so a
// signal reaches the rank and whatever it started.
//
// Lifetime: SIGINT, SIGTERM, SIGHUP, SIGQUIT and SIGUSR1 to cohort-run are forwarded to every
// rank; a second one sends SIGKILL. When a rank exits non-zero or is killed, cohort-run says which
// and how ("cohort-run: rank 1 exited with status 3"), gives the others a few seconds to end by
// themselves (--wait-s, 3 s, as srun --wait: they hear of the failure from the failed rank within
// milliseconds, and each prints its own line naming the cause before it ends), then sends SIGTERM
// to those still running, SIGKILL after the grace period (30 s: a preempted job's ranks save and
// end within their own, 20 s by default), and exits non-zero. A rank that exits with
// cohort::kExitPreempted (75) stopped for preemption (core/preemption.hpp) and is no failure: the
// others stop at the same step by themselves. With --min-np M (an elastic job: every rank gets
// COHORT_MIN_WORKERS=M, strategy/elastic.hpp), a rank that fails while at least M others run is
// lost, not fatal: the others go on without it ("cohort-run: rank 2 was killed by signal 9
// (Killed); 3 ranks go on without it (--min-np 2)"), and the job's exit status is theirs. With
// --max-restarts K as well, such a rank is started again, K times in all, with the same environment
// and COHORT_JOIN=1, and joins the running job at a step boundary (strategy/elastic.hpp;
// "cohort-run: rank 2 was killed by signal 9 (Killed); starting it again (restart 1 of 3)"), rank 0
// too: the job's next rank 0 keeps its door at the same address. A rank started again that the job
// ended without taking in is no failure of the job, and a rank that fails once the job's fit has
// ended (a rank exited 0: any of a job without servers, which end their fit together, or a
// parameter-server job's chief or a server) is not started again: it would find no job to join.
// With --ps S as well (a parameter-server job, strategy/parameter_server.hpp) any worker is lost
// without stopping the job: under Sync the workers left regroup without it, under Async and
// BoundedStaleness its servers take it back when a worker other than the chief is started again
// (and end the fit when the chief, which holds the job's door, is lost). Once the chief is lost,
// a failed worker is started again only after the job has gone on without it for --wait-s: under
// Sync the next chief keeps the door and takes it in, the chief's own process too ("it starts
// again in 3 s where the job goes on without its chief"); under Async and BoundedStaleness the
// servers end the fit meanwhile, and the job is started again whole. A server that fails stops
// the job (its shard lives nowhere else), as does a rank whose loss leaves fewer than --min-np.
// With --max-restarts K, a job that a failed rank stopped, elastic or not, is then started again
// whole, on a new port unless --port gives one ("cohort-run: the job stopped after ps 1 failed;
// starting every rank again (restart 1 of 3)"), as torchrun's --max-restarts does: a program that
// resumes from its newest checkpoint (Options::checkpoint, resume) goes on from there, to the bits
// of a run that never stopped; one that does not starts over. The K starts again count both: a
// rank's and the whole job's. When all ranks are done, anything left in their process groups is
// killed, and every rank has been waited for: no zombie, no orphan. Should cohort-run itself be
// killed with SIGKILL, each rank gets SIGTERM from the kernel (PR_SET_PDEATHSIG).
//
// Timeline: with COHORT_TRACE=DIR (which every rank inherits, as every COHORT_* setting that does
// not describe the rank's place), each rank writes its timeline there and cohort-run merges them
// into DIR/trace.json at the end, a track per process (core/trace.hpp).
//
// Exit status (of the last launch, where the job was started again): 0 when every rank exited 0;
// 75 when every rank exited 0 or 75 and some 75 (the job was preempted and saved: the same command
// continues it); else the first failed rank's exit status, or 128 + its signal; 128 + signal when
// stopped by a signal; 124 after --timeout-s; 127 (126) when the program cannot be found (run).
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cohort/cluster/environment.hpp>
#include <cohort/core/preemption.hpp>
#include <cohort/core/trace.hpp>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

extern char** environ;

namespace {

namespace variable = cohort::cluster::variable;
using Clock = std::chrono::steady_clock;

struct Options {
  int processes = 0;
  int min_processes = 0;  // --min-np: an elastic job's fewest ranks; 0: not elastic
  int max_restarts = 0;   // --max-restarts: how many times a failed rank (or the job) starts again
  int servers = 0;        // --ps: parameter servers started after the workers
  int port = 0;     // 0: pick a free one
  std::string job_id;
  double timeout_s = 0;  // 0: none
  double wait_s = 3;     // after a rank fails, before SIGTERM to the others
  double grace_s = 30;
  std::vector<std::string> command;
};

// One write per line: the ranks write to the same stderr, and a line written in pieces is cut by
// theirs.
void say(const std::string& line) {
  const std::string text = "cohort-run: " + line + "\n";
  [[maybe_unused]] const auto written = ::write(STDERR_FILENO, text.data(), text.size());
}

std::string errno_text(int error) { return std::strerror(error); }

// The port the kernel gives a socket bound to 127.0.0.1:0.
std::optional<std::uint16_t> pick_free_port() {
  const int socket = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (socket < 0) return std::nullopt;
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = 0;
  socklen_t length = sizeof address;
  std::optional<std::uint16_t> port;
  if (::bind(socket, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0 &&
      ::getsockname(socket, reinterpret_cast<sockaddr*>(&address), &length) == 0) {
    port = ntohs(address.sin_port);
  }
  ::close(socket);
  return port;
}

std::string make_job_id() {
  const auto now = std::chrono::system_clock::now().time_since_epoch();
  char text[64];
  std::snprintf(
      text, sizeof text, "cohort-run-%lld-%ld",
      static_cast<long long>(std::chrono::duration_cast<std::chrono::seconds>(now).count()),
      static_cast<long>(::getpid()));
  return text;
}

// The variables that describe a rank's place are cohort-run's to set: ours win, and no stale one
// of another launch survives. Shared settings (COHORT_SECRET, COHORT_TRACE, ...) pass through.
bool is_replaced(std::string_view entry) {
  const std::string_view name = entry.substr(0, entry.find('='));
  const auto among = [name](const auto& names) {
    return std::find(names.begin(), names.end(), name) != names.end();
  };
  return among(variable::kCohortDescription) || among(variable::kOtherLaunchers);
}

std::vector<std::string> rank_environment(const Options& options, int rank, std::uint16_t port) {
  std::vector<std::string> entries;
  for (char** entry = environ; *entry != nullptr; ++entry) {
    if (!is_replaced(*entry)) entries.emplace_back(*entry);
  }
  const auto set = [&](std::string_view name, const std::string& value) {
    entries.push_back(std::string(name) + "=" + value);
  };
  if (options.servers > 0) {
    const bool server = rank >= options.processes;
    const int index = server ? rank - options.processes : rank;
    const int size = server ? options.servers : options.processes;
    set(variable::kRole, server ? "ps" : "worker");
    set(variable::kRank, std::to_string(index));
    set(variable::kWorldSize, std::to_string(size));
    set(variable::kLocalRank, std::to_string(index));
    set(variable::kLocalWorldSize, std::to_string(size));
    set(server ? variable::kWorkerCount : variable::kPsCount,
        std::to_string(server ? options.processes : options.servers));
  } else {
    set(variable::kRank, std::to_string(rank));
    set(variable::kWorldSize, std::to_string(options.processes));
    set(variable::kLocalRank, std::to_string(rank));
    set(variable::kLocalWorldSize, std::to_string(options.processes));
  }
  set(variable::kMasterAddr, "127.0.0.1");
  set(variable::kMasterPort, std::to_string(port));
  set(variable::kJobId, options.job_id);
  if (options.min_processes > 0) set(variable::kMinWorkers, std::to_string(options.min_processes));
  return entries;
}

std::vector<char*> pointers(std::vector<std::string>& strings) {
  std::vector<char*> result;
  for (auto& s : strings) result.push_back(s.data());
  result.push_back(nullptr);
  return result;
}

constexpr int kHandledSignals[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1};

// Starts one rank in its own process group; returns its pid, or the errno of the failed exec.
struct Started {
  pid_t pid = -1;
  int error = 0;
};

Started start_rank(std::vector<std::string> command, std::vector<std::string> environment,
                   const sigset_t& original_mask) {
  std::vector<char*> argv = pointers(command);
  std::vector<char*> envp = pointers(environment);
  int error_pipe[2];
  if (::pipe2(error_pipe, O_CLOEXEC) != 0) return {-1, errno};
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) {
    const int error = errno;
    ::close(error_pipe[0]);
    ::close(error_pipe[1]);
    return {-1, error};
  }
  if (pid == 0) {
    // The child: only the launcher's one thread was copied, so this is safe to do here.
    ::setpgid(0, 0);
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (::getppid() != parent) ::_exit(128 + SIGTERM);  // the launcher died before prctl
    struct sigaction default_action {};
    default_action.sa_handler = SIG_DFL;
    for (const int signal : kHandledSignals) ::sigaction(signal, &default_action, nullptr);
    ::sigaction(SIGCHLD, &default_action, nullptr);
    ::sigprocmask(SIG_SETMASK, &original_mask, nullptr);
    const int null = ::open("/dev/null", O_RDONLY);
    if (null >= 0) {
      ::dup2(null, STDIN_FILENO);
      if (null != STDIN_FILENO) ::close(null);
    }
    ::execvpe(argv[0], argv.data(), envp.data());
    const int error = errno;
    [[maybe_unused]] const auto written = ::write(error_pipe[1], &error, sizeof error);
    ::_exit(127);
  }
  ::setpgid(pid, pid);  // also here, so the group exists before the launcher may signal it
  ::close(error_pipe[1]);
  int error = 0;
  ssize_t got = 0;
  do {
    got = ::read(error_pipe[0], &error, sizeof error);
  } while (got < 0 && errno == EINTR);
  ::close(error_pipe[0]);
  if (got == static_cast<ssize_t>(sizeof error)) {
    ::waitpid(pid, nullptr, 0);
    return {-1, error};
  }
  return {pid, 0};
}

std::string describe_status(int status) {
  if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    const int signal = WTERMSIG(status);
    return "was killed by signal " + std::to_string(signal) + " (" + ::strsignal(signal) + ")";
  }
  return "ended with wait status " + std::to_string(status);
}

int exit_code_of(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

// The signals cohort-run takes with sigtimedwait: those it forwards, and SIGCHLD.
sigset_t handled_signals() {
  sigset_t handled;
  ::sigemptyset(&handled);
  for (const int signal : kHandledSignals) ::sigaddset(&handled, signal);
  ::sigaddset(&handled, SIGCHLD);
  return handled;
}

// Blocks handled_signals() for the whole of cohort-run, every start of the job; returns the mask
// before, which each rank starts with.
sigset_t block_handled_signals() {
  const sigset_t handled = handled_signals();
  sigset_t original;
  ::sigprocmask(SIG_BLOCK, &handled, &original);
  // SIGCHLD must not be discarded while blocked: give it a handler (never run; sigtimedwait takes
  // it).
  struct sigaction on_child {};
  on_child.sa_handler = [](int) {};
  ::sigaction(SIGCHLD, &on_child, nullptr);
  return original;
}

class Launch {
 public:
  // `deadline`: where --timeout-s ends the run (of every start of the job); `original_mask`: the
  // signal mask each rank starts with (block_handled_signals); `restarts`: the starts again that
  // --max-restarts has counted before this launch.
  Launch(Options options, std::uint16_t port, std::optional<Clock::time_point> deadline,
         const sigset_t& original_mask, int restarts)
      : options_(std::move(options)),
        port_(port),
        restarts_(restarts),
        original_mask_(original_mask),
        timeout_at_(deadline) {}

  // The rank whose failure stopped the job ("ps 1"), if one did: not a signal to cohort-run, a
  // timeout, a preemption or a rank that could not start.
  const std::optional<std::string>& stopped_by() const { return stopped_by_; }
  // The starts again counted so far, this launch's ranks started again included.
  int restarts() const { return restarts_; }

  int run() {
    const sigset_t handled = handled_signals();
    say("starting " + std::to_string(options_.processes) + " ranks" +
        (options_.servers > 0 ? " (workers) and " + std::to_string(options_.servers) + " ps" : "") +
        " of '" + options_.command[0] + "', master 127.0.0.1:" + std::to_string(port_) + ", job '" +
        options_.job_id + "'");
    const auto start_wall = std::filesystem::file_time_type::clock::now();
    for (int rank = 0; rank < options_.processes + options_.servers; ++rank) {
      const Started started =
          start_rank(options_.command, rank_environment(options_, rank, port_), original_mask_);
      if (started.pid < 0) {
        say("cannot start rank " + std::to_string(rank) + ": '" + options_.command[0] +
            "': " + errno_text(started.error));
        exit_code_ = started.error == ENOENT ? 127 : 126;
        stop(SIGTERM);
        break;
      }
      ranks_.push_back({started.pid, std::nullopt});
    }

    while (running() > 0) {
      const std::optional<Clock::time_point> deadline = next_deadline();
      siginfo_t info{};
      int signal = 0;
      if (deadline) {
        const auto left = std::max(*deadline - Clock::now(), Clock::duration::zero());
        const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(left).count();
        const timespec wait{static_cast<time_t>(ns / 1'000'000'000),
                            static_cast<long>(ns % 1'000'000'000)};
        signal = ::sigtimedwait(&handled, &info, &wait);
      } else {
        signal = ::sigwaitinfo(&handled, &info);
      }
      reap();
      if (signal > 0 && signal != SIGCHLD) on_signal(signal);
      const Clock::time_point now = Clock::now();
      if (timeout_at_ && now >= *timeout_at_ && !stopping_) {
        say("timed out after " + format_seconds(options_.timeout_s) + " s; stopping " +
            std::to_string(running()) + " ranks");
        exit_code_ = 124;
        stop(SIGTERM);
      }
      if (hold_until_ && now >= *hold_until_) release_held();
      if (term_at_ && now >= *term_at_) {
        say(std::to_string(running()) + " ranks did not end within " +
            format_seconds(options_.wait_s) + " s; sending SIGTERM, SIGKILL after " +
            format_seconds(options_.grace_s) + " s");
        stop(SIGTERM);
      }
      if (kill_at_ && now >= *kill_at_) {
        for (std::size_t rank = 0; rank < ranks_.size(); ++rank) {
          if (ranks_[rank].status) continue;
          say(who(rank) + " did not stop within " + format_seconds(options_.grace_s) +
              " s; sending SIGKILL");
        }
        signal_all(SIGKILL);
        kill_at_.reset();
      }
    }
    signal_all(SIGKILL);  // whatever a rank left behind in its process group
    merge_timelines(start_wall);
    if (preempted_ > 0 && std::all_of(ranks_.begin(), ranks_.end(), [](const Rank& rank) {
          return rank.status && WIFEXITED(*rank.status) &&
                 (WEXITSTATUS(*rank.status) == 0 ||
                  WEXITSTATUS(*rank.status) == cohort::kExitPreempted);
        })) {
      say("the job was preempted (" + std::to_string(preempted_) + " of " +
          std::to_string(ranks_.size()) +
          " ranks stopped for it): the same command continues it from its checkpoint");
      exit_code_ = cohort::kExitPreempted;
    }
    return exit_code_;
  }

 private:
  // With COHORT_TRACE, each rank wrote its timeline into that directory (core/trace.hpp): one
  // file of them all, a track per process, beside them. Failed ranks' timelines included.
  static void merge_timelines(std::filesystem::file_time_type since) {
    const char* directory = std::getenv("COHORT_TRACE");
    if (directory == nullptr || *directory == '\0') return;
    const std::filesystem::path merged = std::filesystem::path(directory) / "trace.json";
    std::vector<std::filesystem::path> files;
    std::error_code error;
    for (const auto& entry : std::filesystem::directory_iterator(directory, error)) {
      std::error_code ignored;
      if (entry.path().extension() == ".json" && entry.path() != merged &&
          entry.last_write_time(ignored) >= since) {
        files.push_back(entry.path());
      }
    }
    if (files.empty()) return;
    std::sort(files.begin(), files.end());
    try {
      cohort::trace::merge(files, merged);
      say("timeline of " + std::to_string(files.size()) + " processes: " + merged.string() +
          " (open it in ui.perfetto.dev or chrome://tracing)");
    } catch (const cohort::Error& failure) {
      say(std::string("no merged timeline: ") + failure.what());
    }
  }

  struct Rank {
    pid_t pid;
    std::optional<int> status;  // set once waited for
    bool restarted = false;     // started again (--max-restarts)
  };

  // --max-restarts: starts failed rank `rank` of an elastic job again, which joins the job;
  // whether it did.
  bool restart(std::size_t rank, int status) {
    if (restarts_ >= options_.max_restarts) return false;
    std::vector<std::string> environment =
        rank_environment(options_, static_cast<int>(rank), port_);
    environment.push_back(std::string(variable::kJoin) + "=1");
    const Started started = start_rank(options_.command, std::move(environment), original_mask_);
    if (started.pid < 0) return false;
    ++restarts_;
    say(who(rank) + " " + describe_status(status) + "; starting it again (restart " +
        std::to_string(restarts_) + " of " + std::to_string(options_.max_restarts) + ")");
    ranks_[rank] = {started.pid, std::nullopt, true};
    return true;
  }

  // The rank whose exit 0 says that the job's fit has ended, if one did: any rank of a job without
  // servers (they end their fit together); in a parameter-server job the chief (it ends its fit
  // with the other workers') or a server (it serves until every worker is done).
  std::optional<std::size_t> fit_ended_by() const {
    for (std::size_t rank = 0; rank < ranks_.size(); ++rank) {
      const bool ends_with_job = options_.servers == 0 || !replaceable(rank);
      const std::optional<int>& status = ranks_[rank].status;
      if (ends_with_job && status && WIFEXITED(*status) && WEXITSTATUS(*status) == 0) return rank;
    }
    return std::nullopt;
  }

  // Whether every rank but `rank` exited 0: a job that ended.
  bool others_succeeded(std::size_t rank) const {
    for (std::size_t other = 0; other < ranks_.size(); ++other) {
      if (other == rank) continue;
      const std::optional<int>& status = ranks_[other].status;
      if (!status || !WIFEXITED(*status) || WEXITSTATUS(*status) != 0) return false;
    }
    return true;
  }

  static std::string format_seconds(double seconds) {
    char text[32];
    std::snprintf(text, sizeof text, "%g", seconds);
    return text;
  }

  // "rank 3", or in a parameter-server job "worker 3" and "ps 1".
  std::string who(std::size_t rank) const {
    const int index = static_cast<int>(rank);
    if (options_.servers == 0) return "rank " + std::to_string(index);
    if (index < options_.processes) return "worker " + std::to_string(index);
    return "ps " + std::to_string(index - options_.processes);
  }

  int running() const {
    return static_cast<int>(
        std::count_if(ranks_.begin(), ranks_.end(), [](const Rank& rank) { return !rank.status; }));
  }

  // The ranks that run and train: all of them, less a parameter-server job's servers.
  int running_workers() const {
    const auto workers = ranks_.begin() + options_.processes;
    return static_cast<int>(
        std::count_if(ranks_.begin(), workers, [](const Rank& rank) { return !rank.status; }));
  }

  // Whether an elastic job (--min-np) goes on without failed rank `rank`, while at least --min-np
  // of the ranks that train run: any rank of a job without servers; in a parameter-server job any
  // worker, the chief too (under Sync the workers left regroup without it; under Async and
  // BoundedStaleness the servers end the fit, which cannot end without it, and so the job).
  bool may_lose(std::size_t rank) const {
    return options_.min_processes != 0 && running_workers() >= options_.min_processes &&
           rank < static_cast<std::size_t>(options_.processes);
  }

  // Whether failed worker `rank` of an elastic parameter-server job waits before it is started
  // again: while the chief is lost and the job has not shown that it goes on without it. Under
  // Sync it does, and the next chief keeps the door; under Async and BoundedStaleness the servers
  // end the fit, which cannot end without the chief, and the job is started again whole. The
  // launcher cannot tell the consistency, so it waits --wait-s for the servers: their failure
  // stops the job, and a worker that failed of the chief's loss before them has spent no start
  // again that the whole job's start needs.
  bool waits_for_the_servers(std::size_t rank) const {
    return options_.servers > 0 && !goes_on_without_chief_ && (rank == 0 || ranks_[0].status);
  }

  // Holds failed worker `rank` (waits_for_the_servers) until --wait-s after the first held one.
  void hold(std::size_t rank, int status) {
    held_.emplace_back(rank, status);
    if (!hold_until_) {
      hold_until_ = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                       std::chrono::duration<double>(options_.wait_s));
    }
    say(who(rank) + " " + describe_status(status) + "; " + std::to_string(running_workers()) +
        " workers go on without it (--min-np " + std::to_string(options_.min_processes) +
        "); it starts again in " + format_seconds(options_.wait_s) +
        " s where the job goes on without its chief (Sync)");
  }

  // Once --wait-s has passed since a held worker failed: the job went on without its chief unless
  // it is stopping, so the held workers start again, as any lost worker from now on.
  void release_held() {
    hold_until_.reset();
    const std::vector<std::pair<std::size_t, int>> held = std::exchange(held_, {});
    if (stopping_) return;
    goes_on_without_chief_ = true;
    for (const auto& [rank, status] : held) judge(rank, status);
  }

  // Whether an elastic job may go on without rank `rank` and take it in again: any rank of a job
  // without servers; in a parameter-server job a worker other than the chief.
  bool replaceable(std::size_t rank) const {
    return options_.servers == 0 ||
           (rank > 0 && rank < static_cast<std::size_t>(options_.processes));
  }

  // The timeout until stopping; while stopping, the SIGTERM deadline, then the SIGKILL one.
  std::optional<Clock::time_point> next_deadline() const {
    if (!stopping_) {
      if (timeout_at_ && hold_until_) return std::min(*timeout_at_, *hold_until_);
      return hold_until_ ? hold_until_ : timeout_at_;
    }
    return term_at_ ? term_at_ : kill_at_;
  }

  // Sends `signal` to every rank's process group, ranks already waited for included: their
  // group may still hold what they started.
  void signal_all(int signal) {
    for (const Rank& rank : ranks_) ::kill(-rank.pid, signal);
  }

  // SIGTERM (or a forwarded signal) to every rank now, SIGKILL after the grace period.
  void stop(int signal) {
    stopping_ = true;
    term_at_.reset();
    signal_all(signal);
    kill_at_ = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                  std::chrono::duration<double>(options_.grace_s));
  }

  // Waits --wait-s for the other ranks to end by themselves, then stop(SIGTERM).
  void stop_after_wait() {
    stopping_ = true;
    term_at_ = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                  std::chrono::duration<double>(options_.wait_s));
  }

  void on_signal(int signal) {
    if (kill_at_) {
      say("got signal " + std::to_string(signal) +
          " while stopping: sending SIGKILL to every rank");
      signal_all(SIGKILL);
      return;
    }
    if (!stopping_) exit_code_ = 128 + signal;
    say("got signal " + std::to_string(signal) + " (" + ::strsignal(signal) +
        "); forwarding it to every rank");
    stop(signal);
  }

  // Every rank that ended since the last call, judged once all of them are known: servers first,
  // then the other ranks the job cannot go on without, and among each the ones a signal ended
  // first, so that where a failure stops the job, it is named by the likeliest cause (a server's
  // loss fails every worker's next push), and a worker that failed beside it is not started again.
  //
  // A rank that exited with an error may be answering another rank's death that has not been
  // reported yet: a process killed by a signal closes its sockets before the kernel makes it a
  // zombie, and on a busy host its peers can exit first. So where ranks exited with an error and
  // none ended by a signal, the ranks still running get kSettle to show theirs before any is
  // judged.
  void reap() {
    std::vector<std::size_t> ended;
    collect_ended(ended);
    const auto failed_alone = [&] {
      const auto signalled = [&](std::size_t rank) { return WIFSIGNALED(*ranks_[rank].status); };
      const auto failed = [&](std::size_t rank) {
        return WIFEXITED(*ranks_[rank].status) && WEXITSTATUS(*ranks_[rank].status) != 0 &&
               WEXITSTATUS(*ranks_[rank].status) != cohort::kExitPreempted;
      };
      return !stopping_ && running() > 0 && std::ranges::any_of(ended, failed) &&
             std::ranges::none_of(ended, signalled);
    };
    for (const auto until = Clock::now() + kSettle; failed_alone() && Clock::now() < until;) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      collect_ended(ended);
    }
    const auto order = [&](std::size_t rank) {
      const int signalled_first = WIFSIGNALED(*ranks_[rank].status) ? 0 : 1;
      if (rank >= static_cast<std::size_t>(options_.processes)) return signalled_first;  // a server
      return (replaceable(rank) ? 4 : 2) + signalled_first;
    };
    std::ranges::stable_sort(ended, {}, order);
    for (const std::size_t rank : ended) judge(rank, *ranks_[rank].status);
  }

  // Appends the ranks that ended since the last call, with their status.
  void collect_ended(std::vector<std::size_t>& ended) {
    for (;;) {
      int status = 0;
      const pid_t pid = ::waitpid(-1, &status, WNOHANG);
      if (pid <= 0) return;
      const auto rank = std::ranges::find(ranks_, pid, &Rank::pid);
      if (rank == ranks_.end()) continue;
      rank->status = status;
      ended.push_back(static_cast<std::size_t>(rank - ranks_.begin()));
    }
  }

  // What rank `rank`'s end with `status` does to the job.
  void judge(std::size_t rank, int status) {
    const bool success = WIFEXITED(status) && WEXITSTATUS(status) == 0;
    if (WIFEXITED(status) && WEXITSTATUS(status) == cohort::kExitPreempted) {
      ++preempted_;
      return;
    }
    if (!success && !stopping_ && ranks_[rank].restarted && others_succeeded(rank)) {
      say(who(rank) + ", started again, " + describe_status(status) +
          " after the job ended without taking it in");
      return;
    }
    const bool expendable = !success && !stopping_ && may_lose(rank);
    const std::optional<std::size_t> ended = fit_ended_by();
    if (expendable && !ended && restarts_ < options_.max_restarts) {
      if (waits_for_the_servers(rank)) {
        hold(rank, status);
        return;
      }
      if (restart(rank, status)) return;
    }
    if (expendable) {
      std::string line = who(rank) + " " + describe_status(status) + "; ";
      if (ended && restarts_ < options_.max_restarts) {
        line += "not started again, as the job's fit has ended (" + who(*ended) + " exited 0); ";
      }
      say(line + std::to_string(running_workers()) +
          (options_.servers == 0 ? " ranks" : " workers") + " go on without it (--min-np " +
          std::to_string(options_.min_processes) + ")");
      return;
    }
    if (!success && !stopping_) {
      exit_code_ = std::max(exit_code_of(status), 1);
      stopped_by_ = who(rank);
      std::string line = who(rank) + " " + describe_status(status);
      if (running() > 0) {
        const std::string wait = format_seconds(options_.wait_s) + " s to end by ";
        line += running() == 1 ? "; the other rank gets " + wait + "itself, then SIGTERM"
                               : "; the " + std::to_string(running()) + " other ranks get " + wait +
                                     "themselves, then SIGTERM";
      }
      say(line);
      stop_after_wait();
    }
  }

  // How long the ranks still running get to show a signal's death beside an error (reap).
  static constexpr std::chrono::milliseconds kSettle{250};

  Options options_;
  std::uint16_t port_;
  std::vector<Rank> ranks_;
  bool stopping_ = false;
  int exit_code_ = 0;
  int preempted_ = 0;  // ranks that exited with cohort::kExitPreempted
  int restarts_;       // starts again (--max-restarts), the job's before this launch included
  std::optional<std::string> stopped_by_;
  sigset_t original_mask_;
  std::optional<Clock::time_point> timeout_at_;
  std::optional<Clock::time_point> term_at_;  // set while the others get --wait-s
  std::optional<Clock::time_point> kill_at_;
  // Failed workers held while a parameter-server job's chief is lost (hold), and until when.
  std::vector<std::pair<std::size_t, int>> held_;
  std::optional<Clock::time_point> hold_until_;
  bool goes_on_without_chief_ = false;  // the job went on --wait-s after its chief was lost
};

}  // namespace

int main(int argc, char** argv) {
  Options options;
  CLI::App app{
      "Starts N ranks of a cohort program on this host, each with COHORT_RANK, COHORT_WORLD_SIZE,\n"
      "COHORT_LOCAL_RANK, COHORT_LOCAL_WORLD_SIZE, COHORT_MASTER_ADDR, COHORT_MASTER_PORT and\n"
      "COHORT_JOB_ID set (docs/launching.md).",
      "cohort-run"};
  app.add_option("--np", options.processes, "number of ranks to start")
      ->required()
      ->check(CLI::Range(1, 1 << 16));
  app.add_option("--min-np", options.min_processes,
                 "an elastic job: a rank that fails while at least this many others run is lost, "
                 "and they go on without it (COHORT_MIN_WORKERS for every rank; with --ps, a "
                 "worker, not a server; default: not elastic, a failed rank stops the others)")
      ->check(CLI::Range(0, 1 << 16));
  app.add_option("--max-restarts", options.max_restarts,
                 "start again, this many times in all: with --min-np, a rank the job goes on "
                 "without, which joins the running job (COHORT_MAX_WORKERS stays the --np it "
                 "started with); and after a failed rank stopped the job, every rank (a program "
                 "that resumes from its checkpoint goes on from there)")
      ->check(CLI::Range(0, 1 << 16));
  app.add_option("--ps", options.servers,
                 "also start this many parameter servers (COHORT_ROLE=ps; the --np ranks are "
                 "workers)")
      ->check(CLI::Range(0, 1 << 16));
  app.add_option("--port", options.port, "rendezvous port (default: a free port)")
      ->check(CLI::Range(0, 65535));
  app.add_option("--job-id", options.job_id,
                 "COHORT_JOB_ID for every rank (default: cohort-run-<time>-<pid>)");
  app.add_option("--timeout-s", options.timeout_s,
                 "stop every rank after this many seconds and exit 124 (default: no limit)")
      ->check(CLI::Range(0.0, 1e9));
  app.add_option("--wait-s", options.wait_s,
                 "seconds the other ranks get to end by themselves after a rank fails, before "
                 "SIGTERM (each prints its own line naming the cause); with --ps, --min-np and "
                 "--max-restarts, how long workers lost with the chief wait before they start "
                 "again, where the job goes on without it")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 3600.0));
  app.add_option("--grace-s", options.grace_s,
                 "seconds between SIGTERM and SIGKILL when stopping ranks")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 3600.0));
  app.footer(
      "The program and its arguments follow the options, after --:\n"
      "  cohort-run --np 4 -- ./train --epochs 3\n");
  app.prefix_command();  // everything from the program on is the program's
  CLI11_PARSE(app, argc, argv);

  options.command = app.remaining();
  if (!options.command.empty() && options.command.front() == "--") {
    options.command.erase(options.command.begin());
  }
  if (options.command.empty()) {
    std::cerr << "cohort-run: no program given\n" << app.help();
    return 2;
  }
  if (options.min_processes > options.processes) {
    say("--min-np " + std::to_string(options.min_processes) + " exceeds --np " +
        std::to_string(options.processes));
    return 2;
  }
  if (options.job_id.empty()) options.job_id = make_job_id();
  std::optional<Clock::time_point> deadline;
  if (options.timeout_s > 0) {
    deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                  std::chrono::duration<double>(options.timeout_s));
  }
  const sigset_t original_mask = block_handled_signals();
  // --max-restarts counts every start again: of a rank an elastic job goes on without (--min-np),
  // and of the whole job after a failed rank stopped it.
  for (int restarts = 0;;) {
    std::uint16_t port = static_cast<std::uint16_t>(options.port);
    if (port == 0) {
      const std::optional<std::uint16_t> picked = pick_free_port();
      if (!picked) {
        say("cannot find a free port on 127.0.0.1: " + errno_text(errno) + "; pass --port");
        return 1;
      }
      port = *picked;
    }
    Launch launch(options, port, deadline, original_mask, restarts);
    const int status = launch.run();
    restarts = launch.restarts();
    if (!launch.stopped_by() || restarts >= options.max_restarts) return status;
    ++restarts;
    say("the job stopped after " + *launch.stopped_by() + " failed; starting every rank again " +
        "(restart " + std::to_string(restarts) + " of " + std::to_string(options.max_restarts) +
        ")");
  }
}
