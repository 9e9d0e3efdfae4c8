// cohort-run, the local launcher, started for real with copies of cluster_probe (probe.cpp).
// Every run is bounded: a launcher still running after kLimit is killed and the test fails.
#include <doctest/doctest.h>

#if defined(COHORT_RUN)

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "error_message.hpp"
#include "processes.hpp"

namespace {

namespace fs = std::filesystem;
using cohort::testing::contains;
using Clock = std::chrono::steady_clock;

constexpr auto kLimit = std::chrono::seconds(30);

struct TemporaryDirectory {
  fs::path path;
  TemporaryDirectory() {
    static int count = 0;
    path = fs::temp_directory_path() /
           ("cohort-run-test-" + std::to_string(::getpid()) + "-" + std::to_string(count++));
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TemporaryDirectory() { fs::remove_all(path); }
};

std::string text_of(const fs::path& file) {
  std::ifstream in(file);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// The NAME=value lines a probe wrote.
// Whether the probe of `rank` slept its whole --sleep-s: cohort-run waited for it instead of
// ending it.
bool slept(const fs::path& directory, int rank) {
  return fs::exists(directory / ("rank-" + std::to_string(rank) + ".slept"));
}

std::map<std::string, std::string> probe_report(const fs::path& directory, int rank) {
  std::map<std::string, std::string> report;
  std::ifstream in(directory / ("rank-" + std::to_string(rank) + ".txt"));
  for (std::string line; std::getline(in, line);) {
    const auto equals = line.find('=');
    if (equals != std::string::npos) report[line.substr(0, equals)] = line.substr(equals + 1);
  }
  return report;
}

// Gone for good: no such process, or (for a process whose parent has died) a zombie left to an
// init that does not reap, which runs nothing.
bool is_gone(pid_t pid) {
  if (::kill(pid, 0) != 0) return errno == ESRCH;
  const std::string stat = text_of("/proc/" + std::to_string(pid) + "/stat");
  const auto close = stat.rfind(')');
  return close != std::string::npos && close + 2 < stat.size() && stat[close + 2] == 'Z';
}

class Launcher {
 public:
  // Starts `cohort-run arguments... -- command...` with its output in files of `directory`;
  // `environment` ("NAME=value") is added to the launcher's own.
  Launcher(const fs::path& directory, std::vector<std::string> arguments,
           std::vector<std::string> command, std::vector<std::string> environment = {})
      : directory_(directory) {
    std::vector<std::string> argv{COHORT_RUN};
    argv.insert(argv.end(), arguments.begin(), arguments.end());
    argv.push_back("--");
    argv.insert(argv.end(), command.begin(), command.end());
    std::vector<char*> pointers;
    for (auto& argument : argv) pointers.push_back(argument.data());
    pointers.push_back(nullptr);
    const std::string output = (directory / "launcher.out").string();
    const std::string error = (directory / "launcher.err").string();
    start_ = Clock::now();
    pid_ = ::fork();
    REQUIRE(pid_ >= 0);
    if (pid_ == 0) {
      for (auto& variable : environment) ::putenv(variable.data());
      const int out = ::open(output.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      const int err = ::open(error.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      ::dup2(out, STDOUT_FILENO);
      ::dup2(err, STDERR_FILENO);
      ::execv(pointers[0], pointers.data());
      ::_exit(127);
    }
  }

  ~Launcher() {
    if (!status_) {  // a failed REQUIRE: leave nothing running
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }

  pid_t pid() const { return pid_; }

  // Waits for the launcher (at most kLimit) and returns its wait status.
  int wait() {
    while (!status_) {
      int status = 0;
      const pid_t done = ::waitpid(pid_, &status, WNOHANG);
      REQUIRE(done >= 0);
      if (done == pid_) {
        status_ = status;
      } else if (Clock::now() - start_ > kLimit) {
        FAIL("cohort-run still running after the test's limit");
      } else {
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
    }
    return *status_;
  }

  // Waits until every one of `ranks` probes has written its report.
  void wait_for_reports(int ranks) const {
    for (int rank = 0; rank < ranks; ++rank) {
      const fs::path report = directory_ / ("rank-" + std::to_string(rank) + ".txt");
      while (!fs::exists(report)) {
        REQUIRE(Clock::now() - start_ < kLimit);
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
    }
  }

  std::string error_text() const { return text_of(directory_ / "launcher.err"); }

 private:
  fs::path directory_;
  pid_t pid_ = -1;
  Clock::time_point start_;
  std::optional<int> status_;
};

int exit_status(int status) { return WIFEXITED(status) ? WEXITSTATUS(status) : -1; }

// The probe's command line: it reports into `directory` and behaves as `arguments` say.
std::vector<std::string> probe(const fs::path& directory, std::vector<std::string> arguments = {}) {
  arguments.insert(arguments.begin(), {COHORT_CLUSTER_PROBE, directory.string()});
  return arguments;
}

}  // namespace

TEST_CASE("cohort-run starts 3 ranks that see ranks 0 to 2, one port and one job id") {
  TemporaryDirectory directory;
  // Another launcher's variables around cohort-run must not reach the ranks.
  Launcher launcher(directory.path, {"--np", "3", "--job-id", "job-42"}, probe(directory.path),
                    {"RANK=7", "WORLD_SIZE=9", "OMPI_COMM_WORLD_RANK=1", "TF_CONFIG={oops",
                     "COHORT_MASTER_ADDR=10.9.9.9"});
  const int status = launcher.wait();
  INFO(launcher.error_text());
  REQUIRE(exit_status(status) == 0);

  const auto first = probe_report(directory.path, 0);
  const std::string port = first.at("COHORT_MASTER_PORT");
  CHECK(std::stoi(port) > 0);
  for (int rank = 0; rank < 3; ++rank) {
    CAPTURE(rank);
    const auto report = probe_report(directory.path, rank);
    CHECK(report.at("COHORT_RANK") == std::to_string(rank));
    CHECK(report.at("COHORT_WORLD_SIZE") == "3");
    CHECK(report.at("COHORT_LOCAL_RANK") == std::to_string(rank));
    CHECK(report.at("COHORT_LOCAL_WORLD_SIZE") == "3");
    CHECK(report.at("COHORT_MASTER_ADDR") == "127.0.0.1");
    CHECK(report.at("COHORT_MASTER_PORT") == port);
    CHECK(report.at("COHORT_JOB_ID") == "job-42");
    CHECK(report.at("RANK") == "(unset)");
    CHECK(report.at("WORLD_SIZE") == "(unset)");
    CHECK(report.at("OMPI_COMM_WORLD_RANK") == "(unset)");
    CHECK(report.at("TF_CONFIG") == "(unset)");
    CHECK(report.at("describe") == "rank " + std::to_string(rank) + " of 3 (local " +
                                       std::to_string(rank) + " of 3), role worker, master " +
                                       "127.0.0.1:" + port +
                                       ", job 'job-42', from COHORT_* variables");
  }
  CHECK(contains(launcher.error_text(), "cohort-run: starting 3 ranks"));
}

TEST_CASE("cohort-run uses --port when given and makes up a job id when not") {
  TemporaryDirectory directory;
  Launcher launcher(directory.path, {"--np", "2", "--port", "23456"}, probe(directory.path));
  REQUIRE(exit_status(launcher.wait()) == 0);
  for (int rank = 0; rank < 2; ++rank) {
    const auto report = probe_report(directory.path, rank);
    CHECK(report.at("COHORT_MASTER_PORT") == "23456");
    CHECK(report.at("COHORT_JOB_ID").starts_with("cohort-run-"));
    CHECK(report.at("COHORT_JOB_ID") == probe_report(directory.path, 0).at("COHORT_JOB_ID"));
  }
}

TEST_CASE("a rank that exits 3 stops cohort-run, which names it and ends a sibling sleeping 60 s") {
  TemporaryDirectory directory;
  Launcher launcher(
      directory.path, {"--np", "3"},
      probe(directory.path, {"--fail-rank", "1", "--exit-code", "3", "--sleep-s", "60"}));
  const int status = launcher.wait();
  const std::string errors = launcher.error_text();
  INFO(errors);
  CHECK(exit_status(status) == 3);
  CHECK(contains(errors, "cohort-run: rank 1 exited with status 3"));
  for (const int sibling : {0, 2}) {
    CAPTURE(sibling);
    CHECK_FALSE(slept(directory.path, sibling));
    CHECK(is_gone(std::stoi(probe_report(directory.path, sibling).at("pid"))));
  }
}

TEST_CASE("a rank killed by a signal is reported with the signal, and cohort-run exits 128 + it") {
  TemporaryDirectory directory;
  Launcher launcher(directory.path, {"--np", "2"},
                    probe(directory.path, {"--kill-rank", "0", "--sleep-s", "60"}));
  const int status = launcher.wait();
  const std::string errors = launcher.error_text();
  INFO(errors);
  CHECK(exit_status(status) == 128 + SIGKILL);
  CHECK(contains(errors, "cohort-run: rank 0 was killed by signal 9"));
  CHECK(is_gone(std::stoi(probe_report(directory.path, 1).at("pid"))));
}

// The others hear of a failure from the failed rank and end with their own line naming the cause;
// a SIGTERM at once would cut that line off.
TEST_CASE("after a rank fails, the others get --wait-s to end by themselves before SIGTERM") {
  TemporaryDirectory directory;
  Launcher launcher(
      directory.path, {"--np", "2", "--wait-s", "25"},
      probe(directory.path, {"--fail-rank", "0", "--exit-code", "3", "--sleep-s", "2"}));
  const int status = launcher.wait();
  const std::string errors = launcher.error_text();
  INFO(errors);
  CHECK(exit_status(status) == 3);
  CHECK(contains(errors,
                 "rank 0 exited with status 3; the other rank gets 25 s to end by itself, "
                 "then SIGTERM"));
  CHECK(slept(directory.path, 1));
  CHECK_FALSE(contains(errors, "SIGTERM,"));
}

// A job that is not elastic starts again whole, as torchrun's --max-restarts does; each start's
// ranks get the signal mask cohort-run itself was started with, not the one it waits with.
TEST_CASE(
    "--max-restarts without --min-np starts every rank again after a failed one stopped the job, "
    "with no signal blocked, until its restarts are spent") {
  for (const int budget : {2, 1}) {
    CAPTURE(budget);
    TemporaryDirectory directory;
    // Each start records its blocked signals, and fails until the third.
    const std::string script = "cd '" + directory.path.string() +
                               "' && grep SigBlk /proc/self/status >> starts.txt && "
                               "[ \"$(wc -l < starts.txt)\" -ge 3 ] || exit 3";
    Launcher launcher(directory.path, {"--np", "1", "--max-restarts", std::to_string(budget)},
                      {"/bin/bash", "-c", script});
    const int status = launcher.wait();
    const std::string errors = launcher.error_text();
    INFO(errors);
    CHECK(exit_status(status) == (budget == 2 ? 0 : 3));
    for (int restart = 1; restart <= budget; ++restart) {
      CHECK(contains(errors,
                     "cohort-run: the job stopped after rank 0 failed; starting every rank "
                     "again (restart " +
                         std::to_string(restart) + " of " + std::to_string(budget) + ")"));
    }
    std::ifstream starts(directory.path / "starts.txt");
    int count = 0;
    for (std::string line; std::getline(starts, line); ++count) {
      CHECK(line == "SigBlk:\t0000000000000000");
    }
    CHECK(count == budget + 1);
  }
}

// A rank started again once the job's fit has ended would find no job to join: it waits for the
// rendezvous deadline and fails.
TEST_CASE(
    "--min-np --max-restarts does not start again a rank that fails once another ended the job's "
    "fit") {
  TemporaryDirectory directory;
  // Rank 0 ends at once; rank 1 fails once cohort-run has reaped it (a zombie still answers
  // kill -0); ranks 2 and 3 run on a second after that.
  const std::string script =
      "cd '" + directory.path.string() +
      "' && case \"$COHORT_RANK\" in "
      "0) echo $$ > rank0.pid; exit 0 ;; "
      "1) for i in $(seq 400); do [ -s rank0.pid ] && ! kill -0 \"$(cat rank0.pid)\" "
      "2>/dev/null && break; sleep 0.05; done; touch rank1.failed; exit 3 ;; "
      "*) for i in $(seq 400); do [ -e rank1.failed ] && break; sleep 0.05; done; sleep 1 ;; "
      "esac";
  Launcher launcher(directory.path, {"--np", "4", "--min-np", "2", "--max-restarts", "1"},
                    {"/bin/bash", "-c", script});
  const int status = launcher.wait();
  const std::string errors = launcher.error_text();
  INFO(errors);
  CHECK(exit_status(status) == 0);
  CHECK(contains(errors,
                 "cohort-run: rank 1 exited with status 3; not started again, as the job's fit "
                 "has ended (rank 0 exited 0); 2 ranks go on without it (--min-np 2)"));
  CHECK_FALSE(contains(errors, "starting it again"));
}

// One budget: a worker started again spends one restart, the whole job started again another.
TEST_CASE("--min-np --max-restarts counts a rank's start again and the whole job's in one budget") {
  TemporaryDirectory directory;
  // First start: worker 1 fails and is started again; once it is back, ps 0 fails, which stops
  // the job. Second start: every rank exits 0.
  const std::string script =
      "cd '" + directory.path.string() +
      "' && if [ -e ps.failed ]; then exit 0; fi; "
      "case \"$COHORT_ROLE-$COHORT_RANK-${COHORT_JOIN:-0}\" in "
      "worker-1-0) exit 3 ;; "
      "worker-1-1) touch worker1.back; sleep 30 ;; "
      "ps-0-0) for i in $(seq 400); do [ -e worker1.back ] && break; sleep 0.05; done; "
      "touch ps.failed; exit 4 ;; "
      "*) sleep 30 ;; "
      "esac";
  Launcher launcher(
      directory.path,
      {"--np", "2", "--ps", "1", "--min-np", "1", "--max-restarts", "2", "--wait-s", "0.2"},
      {"/bin/bash", "-c", script});
  const int status = launcher.wait();
  const std::string errors = launcher.error_text();
  INFO(errors);
  CHECK(exit_status(status) == 0);
  CHECK(contains(errors,
                 "cohort-run: worker 1 exited with status 3; starting it again (restart 1 of 2)"));
  CHECK(contains(errors,
                 "cohort-run: the job stopped after ps 0 failed; starting every rank "
                 "again (restart 2 of 2)"));
}

TEST_CASE("the others still running after --wait-s get SIGTERM") {
  TemporaryDirectory directory;
  Launcher launcher(directory.path, {"--np", "3", "--wait-s", "0.2"},
                    probe(directory.path, {"--fail-rank", "2", "--sleep-s", "60"}));
  const int status = launcher.wait();
  const std::string errors = launcher.error_text();
  INFO(errors);
  CHECK(exit_status(status) == 1);
  CHECK(contains(errors, "2 ranks did not end within 0.2 s; sending SIGTERM, SIGKILL after 30 s"));
  for (int rank = 0; rank < 2; ++rank) {
    CHECK_FALSE(slept(directory.path, rank));
    CHECK(is_gone(std::stoi(probe_report(directory.path, rank).at("pid"))));
  }
}

TEST_CASE("a rank that ignores SIGTERM gets SIGKILL after the grace period") {
  TemporaryDirectory directory;
  Launcher launcher(directory.path, {"--np", "2", "--grace-s", "0.3"},
                    probe(directory.path, {"--fail-rank", "0", "--exit-code", "1", "--sleep-s",
                                           "60", "--ignore-term"}));
  const int status = launcher.wait();
  const std::string errors = launcher.error_text();
  INFO(errors);
  CHECK(exit_status(status) == 1);
  CHECK(contains(errors, "rank 1 did not stop within 0.3 s; sending SIGKILL"));
  CHECK_FALSE(slept(directory.path, 1));
  CHECK(is_gone(std::stoi(probe_report(directory.path, 1).at("pid"))));
}

TEST_CASE("SIGTERM to cohort-run reaches every rank, and it exits 128 + SIGTERM") {
  TemporaryDirectory directory;
  Launcher launcher(directory.path, {"--np", "3"}, probe(directory.path, {"--sleep-s", "60"}));
  launcher.wait_for_reports(3);
  REQUIRE(::kill(launcher.pid(), SIGTERM) == 0);
  const int status = launcher.wait();
  const std::string errors = launcher.error_text();
  INFO(errors);
  CHECK(exit_status(status) == 128 + SIGTERM);
  CHECK(contains(errors, "got signal 15"));
  for (int rank = 0; rank < 3; ++rank) {
    CHECK_FALSE(slept(directory.path, rank));
    CHECK(is_gone(std::stoi(probe_report(directory.path, rank).at("pid"))));
  }
}

TEST_CASE("what a rank leaves running in its process group is killed when cohort-run ends") {
  TemporaryDirectory directory;
  Launcher launcher(directory.path, {"--np", "2"}, probe(directory.path, {"--grandchild"}));
  const int status = launcher.wait();
  INFO(launcher.error_text());
  CHECK(exit_status(status) == 0);
  for (int rank = 0; rank < 2; ++rank) {
    const pid_t grandchild = std::stoi(probe_report(directory.path, rank).at("grandchild"));
    REQUIRE(grandchild > 0);
    // SIGKILL is delivered at once but the kernel may take a moment to finish the process.
    const auto deadline = Clock::now() + std::chrono::seconds(5);
    while (!is_gone(grandchild) && Clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    CHECK(is_gone(grandchild));
  }
}

TEST_CASE("--timeout-s stops the ranks and cohort-run exits 124") {
  TemporaryDirectory directory;
  Launcher launcher(directory.path, {"--np", "2", "--timeout-s", "0.5"},
                    probe(directory.path, {"--sleep-s", "60"}));
  const int status = launcher.wait();
  const std::string errors = launcher.error_text();
  INFO(errors);
  CHECK(exit_status(status) == 124);
  CHECK(contains(errors, "timed out after 0.5 s"));
  for (int rank = 0; rank < 2; ++rank) CHECK_FALSE(slept(directory.path, rank));
}

TEST_CASE("a program that does not exist makes cohort-run exit 127 and say so") {
  TemporaryDirectory directory;
  Launcher launcher(directory.path, {"--np", "2"}, {(directory.path / "no-such-program").string()});
  const int status = launcher.wait();
  const std::string errors = launcher.error_text();
  INFO(errors);
  CHECK(exit_status(status) == 127);
  CHECK(contains(errors, "cannot start rank 0"));
  CHECK(contains(errors, "No such file or directory"));
}

TEST_CASE("a program whose TF_CONFIG holds a number no double holds exits with status 2") {
  TemporaryDirectory directory;
  // The environment around the test must not resolve first.
  std::map<std::string, std::string> environment = {
      {"TF_CONFIG",
       R"({"cluster": {"worker": ["127.0.0.1:2222"]}, "task": {"type": "worker"}, "x": 1e999})"}};
  for (const char* name : {"COHORT_RANK", "COHORT_WORLD_SIZE", "RANK", "WORLD_SIZE",
                           "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"}) {
    environment[name] = "";
  }
  const auto finished = cohort::testing::run_to_completion(
      probe(directory.path), directory.path / "probe.log", environment, kLimit);
  REQUIRE(finished.has_value());
  const auto& [exit, output] = *finished;
  INFO(output);
  CHECK(exit.exited);
  CHECK(exit.code == 2);
  CHECK(contains(output, "error: TF_CONFIG = \"{\"cluster\""));
  CHECK(contains(output, "number overflow"));
}

#else

TEST_CASE("cohort-run tests (skipped: built with COHORT_BUILD_TOOLS=OFF)" * doctest::skip()) {}

#endif
