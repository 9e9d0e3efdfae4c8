// Preemption (core/preemption.hpp) across real processes: a job started by the local launcher
// (cohort-run) is sent SIGTERM in the middle of an epoch, as Kubernetes or Slurm would send it to
// the launcher; every process stops at the same step, the state is saved, every process exits
// with kExitPreempted, and the same command run again continues to the parameters of a run that
// was never interrupted, bit for bit. Under Mirrored, MultiWorkerMirrored and ParameterServer<Sync>.
#include <doctest/doctest.h>

#include <cohort/checkpoint/checkpoint.hpp>
#include <cohort/core/preemption.hpp>
#include <filesystem>
#include <string>
#include <vector>

#include "jobs.hpp"
#include "processes.hpp"

namespace {

namespace fs = std::filesystem;
using cohort::testing::completed;
using cohort::testing::read_file;
using cohort::testing::TemporaryDirectory;

// 97 epochs of the small task at 64 examples per step: long enough that the vote after the signal
// (about 0.1 s later, trainer/vote.hpp) comes before the end.
constexpr std::uint64_t kPreemptedJobSteps = 3000;

struct LaunchedJob {
  std::vector<std::string> launcher;  // cohort-run and its options, through "--"
  std::vector<std::string> program;   // the program and its arguments before OUT-dependent ones
};

// Runs `job` three times: uninterrupted; preempted after the chief's micro-batch `preempt_after`
// with a checkpoint; then again with that checkpoint, to the end. The last run's parameters
// must be the first's.
void check_preemption(const LaunchedJob& job, const std::string& preempt_after,
                      const std::vector<std::string>& checkpoint_arguments,
                      const std::vector<std::string>& resume_arguments, const fs::path& directory) {
  const auto command = [&](const fs::path& out, const std::vector<std::string>& extra) {
    std::vector<std::string> command = job.launcher;
    command.insert(command.end(), job.program.begin(), job.program.end());
    command.push_back(std::to_string(kPreemptedJobSteps));
    command.push_back(out);
    command.insert(command.end(), extra.begin(), extra.end());
    return command;
  };
  const fs::path reference = directory / "reference.bin";
  {
    const auto [exit, output] = completed(command(reference, {}), directory / "reference.log");
    CAPTURE(output);
    REQUIRE(exit.exited);
    REQUIRE(exit.code == 0);
  }

  const fs::path checkpoint = directory / "run.ckpt";
  const fs::path resumed = directory / "resumed.bin";
  std::vector<std::string> preempting = checkpoint_arguments;
  preempting.push_back("--preempt-after");
  preempting.push_back(preempt_after);
  {
    const auto [exit, output] =
        completed(command(resumed, preempting), directory / "preempted.log");
    CAPTURE(output);
    REQUIRE(exit.exited);
    CHECK(exit.code == cohort::kExitPreempted);
    CHECK(output.find("cohort-run: got signal 15") != std::string::npos);
    CHECK(output.find("cohort: SIGTERM: the job stops") != std::string::npos);
    CHECK(output.find("cohort: preempted: the job stopped before step") != std::string::npos);
    CHECK(output.find("cohort-run: the job was preempted") != std::string::npos);
    CHECK_FALSE(fs::exists(resumed));
    REQUIRE(fs::exists(checkpoint));
    // Stopped in the middle of the run (an epoch is 31 steps), after the signal, which every
    // case below sends at step 100.
    const std::uint64_t step = cohort::checkpoint::read<float>(checkpoint).step;
    CHECK(step >= 100);
    CHECK(step < kPreemptedJobSteps);
  }
  {
    const auto [exit, output] =
        completed(command(resumed, resume_arguments), directory / "resumed.log");
    CAPTURE(output);
    REQUIRE(exit.exited);
    REQUIRE(exit.code == 0);
  }
  CHECK(read_file(resumed) == read_file(reference));
}

}  // namespace

TEST_CASE("SIGTERM mid-epoch under Mirrored: the saved run resumes to an uninterrupted run's bits") {
  TemporaryDirectory directory("cohort-preemption-mirrored");
  const fs::path checkpoint = directory.path / "run.ckpt";
  // 2 replica threads, 8 micro-batches: 8 calls of batch() per step.
  const LaunchedJob job{{COHORT_RUN, "--np", "1", "--timeout-s", "100", "--"},
                        {COHORT_TRAINER, "2"}};
  check_preemption(job, "800", {"--mirrored", "--checkpoint", checkpoint},
                   {"--mirrored", "--checkpoint", checkpoint}, directory.path);
}

TEST_CASE(
    "SIGTERM mid-epoch under MultiWorkerMirrored: every worker stops at one step, saves, and "
    "resumes to an uninterrupted run's bits") {
  TemporaryDirectory directory("cohort-preemption-multi-worker");
  const fs::path checkpoint = directory.path / "run.ckpt";
  // 2 workers of 1 replica: the chief computes 4 micro-batches per step.
  const LaunchedJob job{{COHORT_RUN, "--np", "2", "--timeout-s", "100", "--"},
                        {COHORT_TRAINER, "1"}};
  check_preemption(job, "400", {"--checkpoint", checkpoint}, {"--checkpoint", checkpoint},
                   directory.path);
}

TEST_CASE(
    "SIGTERM mid-epoch under ParameterServer<Sync>: the servers save their shards, the chief the "
    "manifest, and the job resumes to an uninterrupted run's bits") {
  TemporaryDirectory directory("cohort-preemption-ps");
  const fs::path checkpoint = directory.path / "run.ckpt";
  const LaunchedJob job{{COHORT_RUN, "--np", "2", "--ps", "2", "--timeout-s", "100", "--"},
                        {COHORT_PS_TRAINER, "sync"}};
  check_preemption(job, "400", {"--checkpoint", checkpoint},
                   {"--restore", checkpoint, "--checkpoint", checkpoint}, directory.path);
}
