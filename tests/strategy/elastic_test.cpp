// Elastic MultiWorkerMirrored (strategy/elastic.hpp) across real processes on 127.0.0.1: a
// worker SIGKILLed at a random point of the fit, the chief included, or stopped, and the others go
// on to the parameters of a job that lost nobody, over TCP and through shared memory, also where
// a second worker is lost while they regroup, or one is lost while they construct their strategy;
// a worker started again rejoins, to the same bits, the rank 0 that started the job included;
// below min_workers, the job stops naming who is left.
#include <doctest/doctest.h>
#include <signal.h>

#include <chrono>
#include <filesystem>
#include <map>
#include <memory>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "cohort/cluster/environment.hpp"
#include "cohort/strategy/detail/environment_options.hpp"
#include "cohort/strategy/mirrored.hpp"
#include "error_message.hpp"
#include "processes.hpp"
#include "rendezvous_attacks.hpp"

namespace {

namespace fs = std::filesystem;
using cohort::testing::Process;
using cohort::testing::read_file;
using cohort::testing::TemporaryDirectory;
using namespace std::chrono_literals;

constexpr std::uint64_t kSteps = 40;

// Elastic worker `rank` of a job of `count` workers of `local` replicas at `port`, started by
// hand, training kSteps steps with a pause in each micro-batch (so that a kill lands in the middle
// of the fit); it logs to rank<rank><suffix>.log, and the chief writes parameters.bin and the
// metrics file metrics.jsonl. Its workers share the update from a gradient of share_update_from
// bytes (COHORT_SHARE_UPDATE_FROM; empty: the default, under which this small model's are not
// shared over TCP).
std::unique_ptr<Process> start_elastic_worker(const fs::path& directory, int rank, int count,
                                              const std::string& port, int min_workers,
                                              const std::string& shared_memory,
                                              const std::string& local,
                                              const std::vector<std::string>& more,
                                              const std::string& suffix = "",
                                              const std::string& share_update_from = "0") {
  std::vector<std::string> command{COHORT_TRAINER,
                                   local,
                                   std::to_string(kSteps),
                                   directory / "parameters.bin",
                                   "--pause-ms",
                                   "4",
                                   "--elastic",
                                   std::to_string(min_workers)};
  command.insert(command.end(), more.begin(), more.end());
  return std::make_unique<Process>(
      command,
      std::map<std::string, std::string>{{"COHORT_RANK", std::to_string(rank)},
                                         {"COHORT_WORLD_SIZE", std::to_string(count)},
                                         {"COHORT_MASTER_ADDR", "127.0.0.1"},
                                         {"COHORT_MASTER_PORT", port},
                                         {"COHORT_JOB_ID", "elastic-test"},
                                         {"COHORT_SECRET", "correct horse battery staple"},
                                         {"COHORT_SHARED_MEMORY", shared_memory},
                                         {"COHORT_SHARE_UPDATE_FROM", share_update_from},
                                         {"COHORT_METRICS", directory / "metrics.jsonl"}},
      directory / ("rank" + std::to_string(rank) + suffix + ".log"));
}

// `count` elastic workers (start_elastic_worker) at a free port, returned once every one has met
// the others; `port` is where they met.
std::vector<std::unique_ptr<Process>> start_elastic_workers(
    const fs::path& directory, int count, int min_workers, const std::string& shared_memory,
    const std::string& local = "1", const std::vector<std::string>& more = {},
    std::string* port_out = nullptr, const std::string& share_update_from = "0") {
  const std::string port = std::to_string(cohort::testing::free_port());
  if (port_out) *port_out = port;
  std::vector<std::unique_ptr<Process>> workers;
  for (int rank = 0; rank < count; ++rank) {
    workers.push_back(start_elastic_worker(directory, rank, count, port, min_workers, shared_memory,
                                           local, more, "", share_update_from));
  }
  for (int rank = 0; rank < count; ++rank) {
    const fs::path log = directory / ("rank" + std::to_string(rank) + ".log");
    REQUIRE_MESSAGE(
        cohort::testing::when_logged(log, "multi_worker_trainer: connected", 60s).has_value(),
        read_file(log));
  }
  return workers;
}

std::string log_of(const fs::path& directory, int rank) {
  return read_file(directory / ("rank" + std::to_string(rank) + ".log"));
}

// Waits for `process` (60 s at most) and checks how it exited, 0 or not (`succeeded`); its log,
// read from `log`.
std::string ended(Process& process, const fs::path& log, bool succeeded) {
  const auto exit = process.wait(60s);
  const std::string text = read_file(log);
  CAPTURE(text);
  REQUIRE(exit.has_value());
  CHECK(exit->exited);
  CHECK((exit->code == 0) == succeeded);
  return text;
}

// The same for worker `rank`, its log rank<rank>.log.
std::string ended(std::vector<std::unique_ptr<Process>>& workers, const fs::path& directory,
                  int rank, bool succeeded) {
  return ended(*workers[static_cast<std::size_t>(rank)],
               directory / ("rank" + std::to_string(rank) + ".log"), succeeded);
}

// The reference: the same program's Mirrored with 4 replicas in one process, which lost nobody;
// trained once per test program.
const std::string& uninterrupted_parameters() {
  static const std::string parameters = [] {
    TemporaryDirectory directory("cohort-elastic-reference");
    const fs::path out = directory.path / "uninterrupted.bin";
    const auto result = cohort::testing::run_to_completion(
        {COHORT_TRAINER, "4", std::to_string(kSteps), out, "--mirrored"},
        directory.path / "mirrored.log", {});
    REQUIRE(result.has_value());
    REQUIRE(result->first.exited);
    REQUIRE(result->first.code == 0);
    return read_file(out);
  }();
  return parameters;
}

}  // namespace

TEST_CASE(
    "an elastic job that loses a worker at a random step, the chief included, ends with the "
    "parameters of a job that lost nobody and a metrics file to the last step: 4 workers over TCP "
    "(sharing the update or each applying the whole) and through shared memory, and 3 workers of "
    "2 replicas") {
  const std::string& expected = uninterrupted_parameters();
  std::mt19937 random(std::random_device{}());
  struct Job {
    int workers;
    std::string local;
    std::string shared_memory;
    int lost;
    std::string share_update_from = "0";
  };
  for (const Job& job : {Job{4, "1", "0", 2}, Job{4, "1", "0", 0}, Job{4, "1", "0", 1, ""},
                         Job{4, "1", "1", 2}, Job{4, "1", "1", 0}, Job{3, "2", "1", 1}}) {
    CAPTURE(job.workers);
    CAPTURE(job.local);
    CAPTURE(job.shared_memory);
    CAPTURE(job.lost);
    CAPTURE(job.share_update_from);
    TemporaryDirectory directory("cohort-elastic");
    auto workers = start_elastic_workers(directory.path, job.workers, 2, job.shared_memory,
                                         job.local, {}, nullptr, job.share_update_from);
    // A random point of the fit: a step, or between two.
    const auto delay = std::chrono::milliseconds(std::uniform_int_distribution(20, 300)(random));
    CAPTURE(delay.count());
    std::this_thread::sleep_for(delay);
    workers[static_cast<std::size_t>(job.lost)]->kill(SIGKILL);
    const std::string change = "membership " + std::to_string(job.workers) + " -> " +
                               std::to_string(job.workers - 1) + " at step ";
    for (int rank = 0; rank < job.workers; ++rank) {
      if (rank == job.lost) continue;
      CAPTURE(rank);
      const std::string log = ended(workers, directory.path, rank, true);
      CAPTURE(log);
      // A kill after the fit's last step leaves nobody to go on without.
      const std::size_t at = log.find(change);
      REQUIRE(at != std::string::npos);
      const std::string line = log.substr(at, log.find('\n', at) - at);
      CAPTURE(line);
      // With one replica each, where the workers share the update, every worker updates only its
      // part of the state (its stripes through shared memory, the elements it owns over TCP):
      // once any has completed a step, the survivors rebuild the state that every worker kept,
      // the lost one's part included. Over TCP each worker makes the state whole as it keeps it
      // (strategy/detail/keep_schedule.hpp): a loss before the next update is applied finds it
      // whole, and nothing is rebuilt. This model's gradient is under the default size from which
      // the update is shared over TCP: each worker applies the whole, and a loss rebuilds nothing.
      const bool from_kept_state = line.ends_with(", the state kept at that step rebuilt");
      const std::uint64_t step = std::stoull(line.substr(change.size()));
      if (job.local == "1" && job.share_update_from == "0") {
        CHECK((from_kept_state || step == 0 || (job.shared_memory == "0" && step % 16 == 0)));
      } else {
        CHECK(!from_kept_state);
      }
    }
    CHECK(read_file(directory.path / "parameters.bin") == expected);
    // Whoever is the chief at the end wrote the metrics file's last line, the fit's last step.
    const std::string metrics = read_file(directory.path / "metrics.jsonl");
    CAPTURE(metrics);
    CHECK(metrics.rfind("{\"step\": " + std::to_string(kSteps) + ",") != std::string::npos);
  }
}

TEST_CASE(
    "workers given different sizes from which to share the update are refused before the first "
    "step, naming the option and the rank, rather than regrouping at every retry") {
  TemporaryDirectory directory("cohort-elastic-share-from");
  const std::string port = std::to_string(cohort::testing::free_port());
  std::vector<std::unique_ptr<Process>> workers;
  for (const auto& [rank, share_update_from] : {std::pair{0, "0"}, std::pair{1, ""}}) {
    workers.push_back(start_elastic_worker(directory.path, rank, 2, port, 1, "0", "1", {}, "",
                                           share_update_from));
  }
  const std::string chief = ended(workers, directory.path, 0, false);
  CHECK(chief.find("share_update_from_bytes = 0 bytes: rank 1 has none: every worker must be "
                   "given the same") != std::string::npos);
  CHECK(chief.find("regrouping") == std::string::npos);
  const std::string other = ended(workers, directory.path, 1, false);
  CHECK(other.find("share_update_from_bytes = none: rank 0 has 0 bytes") != std::string::npos);
}

TEST_CASE(
    "an elastic job that loses a worker while the others construct their strategy goes on without "
    "it from the first fit, to the parameters of a job that lost nobody: over TCP and through "
    "shared memory") {
  const std::string& expected = uninterrupted_parameters();
  for (const std::string shared_memory : {"0", "1"}) {
    CAPTURE(shared_memory);
    TemporaryDirectory directory("cohort-elastic-construction");
    const std::string port = std::to_string(cohort::testing::free_port());
    std::vector<std::unique_ptr<Process>> workers;
    for (int rank = 0; rank < 4; ++rank) {
      // Worker 3 meets the others and ends before they have learned who shares their hosts.
      const std::vector<std::string> more =
          rank == 3 ? std::vector<std::string>{"--leaves-after-rendezvous"}
                    : std::vector<std::string>{};
      workers.push_back(
          start_elastic_worker(directory.path, rank, 4, port, 2, shared_memory, "1", more));
    }
    CHECK(ended(workers, directory.path, 3, true).find("connected") != std::string::npos);
    for (int rank = 0; rank < 3; ++rank) {
      CAPTURE(rank);
      const std::string log = ended(workers, directory.path, rank, true);
      CHECK(log.find("membership 4 -> 3 at step 0") != std::string::npos);
    }
    CHECK(log_of(directory.path, 0).find("cohort: workers 4 -> 3 at step 0 (rank 3 lost: ") !=
          std::string::npos);
    CHECK(read_file(directory.path / "parameters.bin") == expected);
  }
}

TEST_CASE(
    "an elastic job that loses a second worker while the workers left regroup and take the "
    "newest state goes on with two, to the parameters of a job that lost nobody: over TCP and "
    "through shared memory") {
  const std::string& expected = uninterrupted_parameters();
  std::mt19937 random(std::random_device{}());
  for (const std::string shared_memory : {"0", "1", "0", "1"}) {
    CAPTURE(shared_memory);
    TemporaryDirectory directory("cohort-elastic-second");
    auto workers = start_elastic_workers(directory.path, 4, 2, shared_memory);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    workers[2]->kill(SIGKILL);
    // Within the regroup that follows (the roll call, the new mesh, the newest state's agreement
    // and transfer) or the step retried after it: wherever it lands, the two left go on.
    REQUIRE(cohort::testing::when_logged(directory.path / "rank1.log", "regrouping after", 60s));
    const auto delay = std::chrono::milliseconds(std::uniform_int_distribution(0, 30)(random));
    CAPTURE(delay.count());
    std::this_thread::sleep_for(delay);
    workers[3]->kill(SIGKILL);
    for (const int rank : {0, 1}) {
      CAPTURE(rank);
      const std::string log = ended(workers, directory.path, rank, true);
      CHECK(log.find(" -> 2 at step ") != std::string::npos);
    }
    CHECK(read_file(directory.path / "parameters.bin") == expected);
  }
}

TEST_CASE(
    "an elastic job that rebuilds an earlier state it kept, and computes its steps again, reports "
    "each step once: in Report::loss and in the metrics file; through shared memory and over "
    "TCP") {
  const std::string& expected = uninterrupted_parameters();
  for (const std::string shared_memory : {"1", "0"}) {
    CAPTURE(shared_memory);
    TemporaryDirectory directory("cohort-elastic-once");
    const std::string port = std::to_string(cohort::testing::free_port());
    std::vector<std::unique_ptr<Process>> workers;
    for (int rank = 0; rank < 4; ++rank) {
      std::vector<std::string> more{"--log-every", "1"};
      // Its model fails in step 20 (3 readiness reports a step), after the state of step 16 was
      // kept: the others go on from step 16, and compute steps 17 to 19 again.
      if (rank == 2) more.insert(more.end(), {"--fail-in-backward", "60"});
      workers.push_back(
          start_elastic_worker(directory.path, rank, 4, port, 2, shared_memory, "1", more));
    }
    CHECK(ended(workers, directory.path, 2, false).find("backward failed at readiness report 60") !=
          std::string::npos);
    for (const int rank : {0, 1, 3}) {
      CAPTURE(rank);
      const std::string log = ended(workers, directory.path, rank, true);
      CHECK(log.find("membership 4 -> 3 at step 16, the state kept at that step rebuilt") !=
            std::string::npos);
      if (rank == 0) {
        CHECK(log.find("losses " + std::to_string(kSteps) + "\n") != std::string::npos);
      }
    }
    const std::string metrics = read_file(directory.path / "metrics.jsonl");
    CAPTURE(metrics);
    std::vector<std::uint64_t> steps;
    for (std::size_t at = metrics.find("{\"step\": "); at != std::string::npos;
         at = metrics.find("{\"step\": ", at + 1)) {
      steps.push_back(std::stoull(metrics.substr(at + 9)));
    }
    std::vector<std::uint64_t> each_once(kSteps);
    std::iota(each_once.begin(), each_once.end(), 1);
    CHECK(steps == each_once);
    CHECK(read_file(directory.path / "parameters.bin") == expected);
  }
}

TEST_CASE(
    "an elastic job whose worker is stopped mid-fit (SIGSTOP: its kernel still accepts "
    "connections) counts it out after the timeout and ends with the parameters of a job that "
    "lost nobody: over TCP, and through shared memory with the chief stopped") {
  const std::string& expected = uninterrupted_parameters();
  struct Job {
    std::string shared_memory;
    int stopped;
  };
  for (const Job& job : {Job{"0", 2}, Job{"1", 0}}) {
    CAPTURE(job.shared_memory);
    CAPTURE(job.stopped);
    TemporaryDirectory directory("cohort-elastic-stopped");
    auto workers =
        start_elastic_workers(directory.path, 4, 2, job.shared_memory, "1", {"--timeout-s", "2"});
    std::this_thread::sleep_for(100ms);
    Process& stopped = *workers[static_cast<std::size_t>(job.stopped)];
    stopped.kill(SIGSTOP);
    for (int rank = 0; rank < 4; ++rank) {
      if (rank == job.stopped) continue;
      CAPTURE(rank);
      const std::string log = ended(workers, directory.path, rank, true);
      CHECK(log.find("membership 4 -> 3 at step ") != std::string::npos);
    }
    CHECK(read_file(directory.path / "parameters.bin") == expected);
    stopped.kill(SIGKILL);
    stopped.wait(10s);
  }
}

TEST_CASE(
    "a worker SIGKILLed mid-fit and started again rejoins at a step boundary, and the job ends "
    "with the parameters of a job that lost nobody: over TCP and through shared memory, and while "
    "the chief checkpoints every step") {
  const std::string& expected = uninterrupted_parameters();
  std::mt19937 random(std::random_device{}());
  struct Job {
    std::string shared_memory;
    bool checkpoints;
  };
  for (const Job& job : {Job{"0", false}, Job{"1", false}, Job{"0", true}}) {
    CAPTURE(job.shared_memory);
    CAPTURE(job.checkpoints);
    TemporaryDirectory directory("cohort-elastic-rejoin");
    // Longer pauses, so that the fit outlasts the restart on a busy machine.
    std::vector<std::string> more{"--pause-ms", "25"};
    if (job.checkpoints) {
      // A snapshot written in the background between every two steps: the join meets one.
      more.insert(more.end(), {"--checkpoint-directory", (directory.path / "checkpoints").string(),
                               "--checkpoint-every", "1"});
    }
    std::string port;
    auto workers = start_elastic_workers(directory.path, 3, 2, job.shared_memory, "1", more, &port);
    const auto delay = std::chrono::milliseconds(std::uniform_int_distribution(20, 200)(random));
    CAPTURE(delay.count());
    std::this_thread::sleep_for(delay);
    workers[2]->kill(SIGKILL);
    workers[2]->wait(10s);
    // The same command and environment again, as a launcher's restart policy would.
    workers[2] =
        start_elastic_worker(directory.path, 2, 3, port, 2, job.shared_memory, "1", more, "-again");
    for (const int rank : {0, 1}) {
      CAPTURE(rank);
      const std::string log = ended(workers, directory.path, rank, true);
      CHECK(log.find("membership 3 -> 2 at step ") != std::string::npos);
      CHECK(log.find("membership 2 -> 3 at step ") != std::string::npos);
    }
    const std::string log = ended(*workers[2], directory.path / "rank2-again.log", true);
    CHECK(log.find("cohort: rank 2 joined the job of 3 workers at step ") != std::string::npos);
    CHECK(read_file(directory.path / "parameters.bin") == expected);
  }
}

TEST_CASE(
    "strangers at the door of an elastic job with room to grow neither stop nor steer it: a "
    "worker started again still joins through that door, and the job ends with the bits of one "
    "nobody attacked") {
  const std::string& expected = uninterrupted_parameters();
  TemporaryDirectory directory("cohort-elastic-attacked");
  // Long pauses: the fit outlasts the attacks and the join on a busy machine.
  const std::vector<std::string> more{"--pause-ms", "60"};
  std::string port;
  auto workers = start_elastic_workers(directory.path, 3, 2, "0", "1", more, &port);
  // Worker 2 lost: the job of 2 has room to grow, so rank 0 polls its door at every vote. Every
  // attack of tests/transport's rendezvous test, twice, at that door, once the 2 have regrouped,
  // while they train on (before, their regroup's rendezvous on the same listener may end with a
  // stranger's hello in it unanswered: tests/transport attacks a rendezvous); the connections the
  // door keeps until its handshake deadline stay open while worker 2, started again, joins
  // through the same door.
  workers[2]->kill(SIGKILL);
  workers[2]->wait(10s);
  REQUIRE_MESSAGE(cohort::testing::when_logged(directory.path / "rank0.log",
                                               "cohort: workers 3 -> 2 at step ", 60s)
                      .has_value(),
                  log_of(directory.path, 0));
  INFO("rank 0: " << log_of(directory.path, 0));
  INFO("rank 1: " << log_of(directory.path, 1));
  std::vector<cohort::testing::RawSocket> open;
  for (int round = 0; round < 2; ++round) {
    for (auto& socket :
         cohort::testing::attack_rendezvous(static_cast<std::uint16_t>(std::stoi(port)))) {
      open.push_back(std::move(socket));
    }
  }
  workers[2] = start_elastic_worker(directory.path, 2, 3, port, 2, "0", "1", more, "-again");
  for (const int rank : {0, 1}) {
    CAPTURE(rank);
    const std::string log = ended(workers, directory.path, rank, true);
    CHECK(log.find("membership 3 -> 2 at step ") != std::string::npos);
    CHECK(log.find("membership 2 -> 3 at step ") != std::string::npos);
    CHECK(log.find("compromised") == std::string::npos);
  }
  const std::string log = ended(*workers[2], directory.path / "rank2-again.log", true);
  CHECK(log.find("cohort: rank 2 joined the job of 3 workers at step ") != std::string::npos);
  CHECK(read_file(directory.path / "parameters.bin") == expected);
  for (const cohort::testing::RawSocket& socket : open)
    CHECK(cohort::testing::closed_in_silence(socket));
}

namespace {

// A job under cohort-run with `options` (before --) whose rank `lost` is SIGKILLed 100 ms after
// every rank met the others, the trainer's micro-batches pausing `pause_ms`: how cohort-run
// exited, what it and every rank printed, and the parameters the chief wrote.
struct LaunchedRun {
  std::optional<cohort::testing::Exit> exit;
  std::string log;
  std::string parameters;
};
LaunchedRun kill_rank_under_cohort_run(const std::vector<std::string>& options,
                                       const std::string& pause_ms, int lost = 1) {
  TemporaryDirectory directory("cohort-elastic-run");
  const fs::path out = directory.path / "parameters.bin";
  const fs::path log = directory.path / "log.txt";
  std::vector<std::string> command{COHORT_RUN};
  command.insert(command.end(), options.begin(), options.end());
  command.insert(command.end(), {"--", COHORT_TRAINER, "1", std::to_string(kSteps), out.string(),
                                 "--pause-ms", pause_ms});
  Process launcher(command, {}, log);
  REQUIRE(cohort::testing::when_logged(log, "multi_worker_trainer: connected", 60s).has_value());
  std::this_thread::sleep_for(100ms);
  const auto rank =
      cohort::testing::child_with(launcher.pid(), {"COHORT_RANK=" + std::to_string(lost)});
  REQUIRE(rank.has_value());
  ::kill(*rank, SIGKILL);
  // In this order (designated initializers are evaluated in order): the files once it ended.
  return {.exit = launcher.wait(60s), .log = read_file(log), .parameters = read_file(out)};
}

}  // namespace

TEST_CASE(
    "a process started for a full elastic job waits at its door: at its deadline it is told that "
    "the job runs with no place for it, and a standby takes the place of a worker lost later, the "
    "job ending with the bits of one that lost nobody") {
  const std::string& expected = uninterrupted_parameters();
  TemporaryDirectory directory("cohort-elastic-standby");
  // 2 workers, at most 2 (the workers it started with), a fit of about 8 s of pauses (4
  // micro-batches a worker and step).
  const std::vector<std::string> more{"--pause-ms", "50"};
  std::string port;
  auto workers = start_elastic_workers(directory.path, 2, 1, "1", "1", more, &port);
  // Two more processes for rank 1 while both workers live: one that gives up after 3 s, and a
  // standby.
  std::vector<std::string> late_more = more;
  late_more.insert(late_more.end(), {"--connect-timeout-s", "3"});
  auto late = start_elastic_worker(directory.path, 1, 2, port, 1, "1", "1", late_more, "-late");
  workers.push_back(
      start_elastic_worker(directory.path, 1, 2, port, 1, "1", "1", more, "-standby"));
  const std::string late_log = ended(*late, directory.path / "rank1-late.log", false);
  CHECK(late_log.find("runs already, and took this rank in at no step boundary") !=
        std::string::npos);
  // Worker 1 lost: the standby, at the door all along, takes its place.
  workers[1]->kill(SIGKILL);
  workers[1]->wait(10s);
  const std::string chief = ended(workers, directory.path, 0, true);
  CHECK(chief.find("membership 2 -> 1 at step ") != std::string::npos);
  CHECK(chief.find("membership 1 -> 2 at step ") != std::string::npos);
  const std::string standby_log = ended(*workers[2], directory.path / "rank1-standby.log", true);
  CHECK(standby_log.find("joined the job of 2 workers at step ") != std::string::npos);
  CHECK(read_file(directory.path / "parameters.bin") == expected);
}

TEST_CASE(
    "an elastic job started with one worker grows: a process started for it joins at a step "
    "boundary, and the job ends with the bits of one that never changed") {
  const std::string& expected = uninterrupted_parameters();
  TemporaryDirectory directory("cohort-elastic-grow-from-one");
  const std::vector<std::string> more{"--pause-ms", "50"};
  std::vector<std::string> chief_more = more;
  chief_more.insert(chief_more.end(), {"--max-workers", "2"});
  std::string port;
  auto workers = start_elastic_workers(directory.path, 1, 1, "1", "1", chief_more, &port);
  workers.push_back(start_elastic_worker(directory.path, 1, 2, port, 1, "1", "1", more));
  const std::string joiner = ended(workers, directory.path, 1, true);
  CHECK(joiner.find("joined the job of 2 workers at step ") != std::string::npos);
  const std::string chief = ended(workers, directory.path, 0, true);
  CHECK(chief.find("membership 1 -> 2 at step ") != std::string::npos);
  CHECK(read_file(directory.path / "parameters.bin") == expected);
}

TEST_CASE(
    "under cohort-run --min-np, a rank SIGKILLed mid-fit is lost, not fatal: the others end with "
    "the parameters of a job that lost nobody, and the launcher exits 0") {
  const std::string& expected = uninterrupted_parameters();
  const LaunchedRun run = kill_rank_under_cohort_run({"--np", "4", "--min-np", "3"}, "4");
  CAPTURE(run.log);
  REQUIRE(run.exit.has_value());
  CHECK(run.exit->exited);
  CHECK(run.exit->code == 0);
  CHECK(run.log.find("cohort-run: rank 1 was killed by signal 9 (Killed); 3 ranks go on "
                     "without it (--min-np 3)") != std::string::npos);
  CHECK(run.log.find("cohort: workers 4 -> 3 at step ") != std::string::npos);
  CHECK(run.parameters == expected);
}

TEST_CASE(
    "under cohort-run --min-np --max-restarts, a rank SIGKILLed mid-fit is started again and "
    "rejoins, rank 0 too: the job ends with the parameters of a job that lost nobody, and exits "
    "0") {
  const std::string& expected = uninterrupted_parameters();
  for (const int lost : {1, 0}) {
    CAPTURE(lost);
    // Longer pauses, so that the fit outlasts the restart on a busy machine.
    const LaunchedRun run = kill_rank_under_cohort_run(
        {"--np", "3", "--min-np", "2", "--max-restarts", "1"}, "25", lost);
    CAPTURE(run.log);
    REQUIRE(run.exit.has_value());
    CHECK(run.exit->exited);
    CHECK(run.exit->code == 0);
    CHECK(run.log.find("cohort-run: rank " + std::to_string(lost) +
                       " was killed by signal 9 (Killed); starting it again (restart 1 of 1)") !=
          std::string::npos);
    CHECK(run.log.find("cohort: workers 3 -> 2 at step ") != std::string::npos);
    CHECK(run.log.find("cohort: workers 2 -> 3 at step ") != std::string::npos);
    CHECK(run.log.find("cohort: rank 2 joined the job of 3 workers at step ") != std::string::npos);
    // Where the rank 0 that started the job is lost, its successor keeps the door.
    CHECK((run.log.find("cohort: rank 0: keeps the job's door at 127.0.0.1:") !=
           std::string::npos) == (lost == 0));
    CHECK(run.parameters == expected);
  }
}

TEST_CASE(
    "an elastic job that falls below min_workers stops every worker naming who is left, each "
    "saves its last whole step into the checkpoint directory, and the same command goes on from "
    "there to the bits of a job that lost nobody: over TCP and through shared memory") {
  const std::string& expected = uninterrupted_parameters();
  // With one replica each, each worker's state is current only on its part (its stripes through
  // shared memory, the elements it owns over TCP): each saves the newest state every worker kept.
  for (const std::string shared_memory : {"0", "1"}) {
    CAPTURE(shared_memory);
    TemporaryDirectory directory("cohort-elastic-below");
    const fs::path checkpoints = directory.path / "checkpoints";
    const std::vector<std::string> checkpointing{"--checkpoint-directory", checkpoints,
                                                 "--checkpoint-every", "1000"};
    auto workers = start_elastic_workers(directory.path, 3, 3, shared_memory, "1", checkpointing);
    std::this_thread::sleep_for(50ms);
    workers[1]->kill(SIGKILL);
    for (const int rank : {0, 2}) {
      CAPTURE(rank);
      const std::string log = ended(workers, directory.path, rank, false);
      CAPTURE(log);
      CHECK(log.find("error: rank " + std::to_string(rank) + ": regroup: ") != std::string::npos);
      CHECK(log.find("fewer than the 3 the job needs") != std::string::npos);
      CHECK(log.find("cohort: rank " + std::to_string(rank) +
                     ": the job fell below min_workers: its state after step ") !=
            std::string::npos);
    }
    CHECK_FALSE(fs::is_empty(checkpoints));
    // The same command again: every worker resumes from the newest step saved.
    workers = start_elastic_workers(directory.path, 3, 3, shared_memory, "1", checkpointing);
    for (int rank = 0; rank < 3; ++rank) {
      CAPTURE(rank);
      ended(workers, directory.path, rank, true);
    }
    CHECK(log_of(directory.path, 0).find("cohort: resuming from ") != std::string::npos);
    CHECK(read_file(directory.path / "parameters.bin") == expected);
  }
}

TEST_CASE(
    "an elastic job's minimum, and a process that joins a job that is not elastic, are refused "
    "before the rendezvous") {
  TemporaryDirectory directory("cohort-elastic-refused");
  // Alone, rank 1 of 4 would wait 30 s for the others: it is refused at once instead.
  const auto refused = [&](const std::map<std::string, std::string>& variables,
                           const std::vector<std::string>& flags) {
    std::vector<std::string> command{COHORT_TRAINER, "1", "1", directory.path / "none.bin"};
    command.insert(command.end(), flags.begin(), flags.end());
    std::map<std::string, std::string> environment{{"COHORT_RANK", "1"},
                                                   {"COHORT_WORLD_SIZE", "4"},
                                                   {"COHORT_MASTER_ADDR", "127.0.0.1"},
                                                   {"COHORT_MASTER_PORT", "29999"}};
    environment.insert(variables.begin(), variables.end());
    const auto result =
        cohort::testing::run_to_completion(command, directory.path / "log.txt", environment, 20s);
    REQUIRE(result.has_value());
    CHECK(result->first.code != 0);
    return result->second;
  };
  CHECK(refused({}, {"--elastic", "5"})
            .find("elastic.min_workers = 5: exceeds the 4 workers the job starts with") !=
        std::string::npos);
  CHECK(refused({{"COHORT_MIN_WORKERS", "-1"}}, {})
            .find("COHORT_MIN_WORKERS = \"-1\": expected a count, 0 or more") != std::string::npos);
  // A process that comes to join a running job that is not elastic: nobody would take it in.
  CHECK(refused({{"COHORT_JOIN", "1"}}, {})
            .find("elastic.joins_running_job = true: needs elastic.min_workers "
                  "(COHORT_MIN_WORKERS): only an elastic job takes a process in") !=
        std::string::npos);
  CHECK(refused({{"COHORT_JOIN", "yes"}}, {"--elastic", "2"}).find("COHORT_JOIN = \"yes\"") !=
        std::string::npos);
}

TEST_CASE(
    "a strategy whose job cannot go on without a lost worker refuses the variables that make a "
    "job elastic, naming the one set") {
  // Mirrored's options: no elastic field.
  using Options = cohort::strategy::Mirrored<>::Options;
  using cohort::strategy::detail::with_environment;
  const auto message = [](std::string name, std::string value) {
    return cohort::testing::config_error_message([&] {
      (void)with_environment(Options{}, cohort::cluster::environment_from({{name, value}}));
    });
  };
  const std::string refusal =
      "this strategy's job cannot go on without a lost worker (elastic jobs: "
      "MultiWorkerMirrored and ParameterServer, on CPUs and GPUs; not Mirrored)";
  CHECK(message("COHORT_MIN_WORKERS", "3").starts_with("COHORT_MIN_WORKERS = \"3\": " + refusal));
  CHECK(message("COHORT_MAX_WORKERS", "8").starts_with("COHORT_MAX_WORKERS = \"8\": " + refusal));
  CHECK(message("COHORT_JOIN", "1").starts_with("COHORT_JOIN = \"1\": " + refusal));
  // What says "not elastic" is taken, and a malformed value is named as everywhere.
  CHECK(message("COHORT_MIN_WORKERS", "0") == "(no error)");
  CHECK(message("COHORT_JOIN", "0") == "(no error)");
  CHECK(message("COHORT_MIN_WORKERS", "") == "(no error)");
  CHECK(message("COHORT_MIN_WORKERS", "x").starts_with("COHORT_MIN_WORKERS = \"x\": "));
}
