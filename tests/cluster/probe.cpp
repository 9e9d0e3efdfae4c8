// A rank for the cohort-run tests. Writes <dir>/rank-<COHORT_RANK>.txt (NAME=value lines: its
// COHORT_* variables, the other launchers' variables it still sees, its pid, the resolved
// describe() line); exits with status 2 if its environment does not resolve, else behaves as
// told:
//
//   cluster_probe DIR [--fail-rank K --exit-code C] [--kill-rank K] [--sleep-s S]
//                     [--ignore-term] [--grandchild]
//
//   --fail-rank K    rank K waits until every rank has written its file, then exits with C
//   --kill-rank K    the same, but rank K kills itself with SIGKILL
//   --sleep-s S      every other rank sleeps S seconds, writes <dir>/rank-<COHORT_RANK>.slept (so
//                    that a test tells a rank that cohort-run ended from one it waited for), then
//                    exits 0 (default 0)
//   --ignore-term    ignore SIGTERM (cohort-run must then use SIGKILL)
//   --grandchild     fork a process that sleeps 60 s in this rank's process group first
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cohort/cluster/cluster.hpp>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <thread>

namespace fs = std::filesystem;

namespace {

std::string variable_or(const char* name, const char* missing) {
  const char* value = std::getenv(name);
  return value == nullptr ? missing : value;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return 2;
  const fs::path directory = argv[1];
  int fail_rank = -1;
  int kill_rank = -1;
  int exit_code = 1;
  double sleep_s = 0;
  bool ignore_term = false;
  bool grandchild = false;
  for (int i = 2; i < argc; ++i) {
    const std::string_view argument = argv[i];
    const bool has_value = i + 1 < argc;
    if (argument == "--fail-rank" && has_value) {
      fail_rank = std::atoi(argv[++i]);
    } else if (argument == "--kill-rank" && has_value) {
      kill_rank = std::atoi(argv[++i]);
    } else if (argument == "--exit-code" && has_value) {
      exit_code = std::atoi(argv[++i]);
    } else if (argument == "--sleep-s" && has_value) {
      sleep_s = std::atof(argv[++i]);
    } else if (argument == "--ignore-term") {
      ignore_term = true;
    } else if (argument == "--grandchild") {
      grandchild = true;
    } else {
      return 2;
    }
  }

  std::string described;
  int rank = -1;
  int size = 0;
  try {
    const cohort::cluster::Spec spec = cohort::cluster::resolve();
    described = cohort::cluster::describe(spec);
    rank = spec.rank;
    size = spec.size;
  } catch (const cohort::Error& error) {
    described = std::string("error: ") + error.what();
  }

  pid_t grandchild_pid = 0;
  if (grandchild) {
    grandchild_pid = ::fork();
    if (grandchild_pid == 0) {
      ::execlp("sleep", "sleep", "60", static_cast<char*>(nullptr));
      ::_exit(127);
    }
  }
  if (ignore_term) ::signal(SIGTERM, SIG_IGN);

  const std::string name = "rank-" + variable_or("COHORT_RANK", "unknown") + ".txt";
  {
    std::ofstream out(directory / (name + ".partial"));
    for (const char* variable :
         {"COHORT_RANK", "COHORT_WORLD_SIZE", "COHORT_LOCAL_RANK", "COHORT_LOCAL_WORLD_SIZE",
          "COHORT_MASTER_ADDR", "COHORT_MASTER_PORT", "COHORT_JOB_ID", "RANK", "WORLD_SIZE",
          "OMPI_COMM_WORLD_RANK", "TF_CONFIG"}) {
      out << variable << '=' << variable_or(variable, "(unset)") << '\n';
    }
    out << "pid=" << ::getpid() << '\n';
    out << "grandchild=" << grandchild_pid << '\n';
    out << "describe=" << described << '\n';
  }
  fs::rename(directory / (name + ".partial"), directory / name);  // whole files only
  // A rank whose environment does not resolve answers as every cohort program does: the reason on
  // stderr and exit status 2.
  if (rank < 0) {
    std::fprintf(stderr, "%s\n", described.c_str());
    return 2;
  }

  if (rank >= 0 && (rank == fail_rank || rank == kill_rank)) {
    // Fail once every sibling is running and has said so, so that the test knows their pids.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    for (int other = 0; other < size; ++other) {
      while (!fs::exists(directory / ("rank-" + std::to_string(other) + ".txt")) &&
             std::chrono::steady_clock::now() < deadline) {
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
    }
    if (rank == kill_rank) ::kill(::getpid(), SIGKILL);
    return exit_code;
  }
  std::this_thread::sleep_for(std::chrono::duration<double>(sleep_s));
  std::ofstream(directory / ("rank-" + std::to_string(rank) + ".slept")) << "slept\n";
  return 0;
}
