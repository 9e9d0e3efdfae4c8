// The real cohort-bench, end to end: it starts its own processes over TCP (ranks, or workers and
// parameter servers for push_pull), prints the table with #wrong 0 and exits 0; with the corrupted
// reduction it prints wrong counts and exits non-zero. Every run is bounded (--timeout-s, and a
// deadline here after which the test kills it).
#include <doctest/doctest.h>

#if defined(COHORT_BENCH)

#include <sched.h>

#include <chrono>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "processes.hpp"

namespace {

namespace fs = std::filesystem;
using cohort::testing::Process;

struct Result {
  int code = -1;  // exit status; -1 when killed or still running at the deadline
  std::string output;
};

Result run_bench(const std::vector<std::string>& arguments,
                 const std::map<std::string, std::string>& environment = {}) {
  static int runs = 0;
  cohort::testing::TemporaryDirectory directory("cohort-bench-test-" + std::to_string(runs++));
  const fs::path output = directory.path / "output.txt";
  std::vector<std::string> argv{COHORT_BENCH};
  argv.insert(argv.end(), arguments.begin(), arguments.end());
  Result result;
  {
    Process bench(argv, environment, output);
    const auto exit = bench.wait(std::chrono::seconds(120));
    REQUIRE_MESSAGE(exit.has_value(), "cohort-bench did not finish within 120 s");
    if (exit->exited) result.code = exit->code;
  }
  result.output = cohort::testing::read_file(output);
  return result;
}

// The #wrong columns (out-of-place, in-place) of every row of the table.
std::vector<std::pair<std::string, std::string>> wrong_columns(const std::string& output) {
  std::vector<std::pair<std::string, std::string>> columns;
  std::istringstream lines(output);
  for (std::string line; std::getline(lines, line);) {
    if (line.empty() || line[0] == '#' || line.rfind("cohort", 0) == 0) continue;
    std::istringstream fields(line);
    std::vector<std::string> f;
    for (std::string field; fields >> field;) f.push_back(field);
    if (f.size() < 13) continue;
    columns.emplace_back(f[8], f[12]);  // size count type redop root | time algbw busbw #wrong x2
  }
  return columns;
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

}  // namespace

TEST_CASE("cohort-bench all_reduce over tcp with 2 processes checks clean and exits 0") {
  cohort::testing::TemporaryDirectory directory("cohort-bench-json");
  const fs::path json = directory.path / "report.json";
  const Result r = run_bench({"all_reduce", "--backend", "tcp", "--np", "2", "-b", "8", "-e", "64K",
                              "-f", "8", "-c", "1", "--timeout-s", "100", "--json", json.string()});
  INFO(r.output);
  CHECK(r.code == 0);
  const auto columns = wrong_columns(r.output);
  CHECK(columns.size() == 5);  // 8, 64, 512, 4K, 32K
  for (const auto& [out_of_place, in_place] : columns) {
    CHECK(out_of_place == "0");
    CHECK(in_place == "0");
  }
  CHECK(contains(r.output, "# Out of bounds values : 0 OK"));
  CHECK(contains(r.output, "# Avg bus bandwidth    : "));
  CHECK(contains(r.output, "backend tcp, algorithm deterministic"));
  CHECK(contains(r.output, "launched by cohort-bench --np 2"));

  const nlohmann::json report = nlohmann::json::parse(cohort::testing::read_file(json));
  CHECK(report["ranks"] == 2);
  CHECK(report["results"].size() == 5);
  CHECK(report["ok"] == true);
}

TEST_CASE(
    "cohort-bench runs each rank it starts on a CPU of its own, or where the scheduler puts "
    "them with --bind none") {
  cpu_set_t usable;
  CPU_ZERO(&usable);
  REQUIRE(::sched_getaffinity(0, sizeof usable, &usable) == 0);
  const int cpus = CPU_COUNT(&usable);
  for (const std::string bind : {"core", "none"}) {
    CAPTURE(bind);
    cohort::testing::TemporaryDirectory directory("cohort-bench-bind");
    const fs::path json = directory.path / "report.json";
    const Result r = run_bench({"all_reduce", "--backend", "tcp", "--np", "2", "-b", "4", "-e", "4",
                                "--bind", bind, "--timeout-s", "100", "--json", json.string()});
    INFO(r.output);
    REQUIRE(r.code == 0);
    const nlohmann::json ranks =
        nlohmann::json::parse(cohort::testing::read_file(json))["rank_info"];
    REQUIRE(ranks.size() == 2);
    if (bind == "core" && cpus >= 2) {
      CHECK(contains(r.output, "launched by cohort-bench --np 2 --bind core"));
      const std::string first = ranks[0]["cpus"];
      const std::string second = ranks[1]["cpus"];
      CHECK(first.find_first_of(",-") == std::string::npos);  // one CPU each
      CHECK(second.find_first_of(",-") == std::string::npos);
      CHECK(first != second);
    } else {
      CHECK(contains(r.output, "launched by cohort-bench --np 2 --bind none"));
      CHECK(ranks[0]["cpus"] == ranks[1]["cpus"]);  // this test's own CPUs, unchanged
    }
  }
}

TEST_CASE("cohort-bench catches a corrupted reduction, prints it and exits non-zero") {
  for (const bool through_environment : {false, true}) {
    CAPTURE(through_environment);
    std::vector<std::string> arguments{"all_reduce", "--backend", "tcp", "--np",        "2",
                                       "-b",         "8",         "-e",  "64K",         "-f",
                                       "8",          "-c",        "1",   "--timeout-s", "100"};
    std::map<std::string, std::string> environment;
    if (through_environment) {
      environment["COHORT_BENCH_CORRUPT"] = "1";
    } else {
      arguments.push_back("--corrupt-reduction");
    }
    const Result r = run_bench(arguments, environment);
    INFO(r.output);
    CHECK(r.code == 1);
    const auto columns = wrong_columns(r.output);
    REQUIRE(columns.size() == 5);
    for (const auto& [out_of_place, in_place] : columns) {
      CHECK(out_of_place == "1");
      CHECK(in_place == "1");
    }
    CHECK(contains(r.output, "# Out of bounds values : 10 FAILED"));
  }
}

TEST_CASE(
    "cohort-bench with the ring algorithm, the shared-memory backend (also in the shared buffer) "
    "and the local backend checks clean too") {
  for (const std::string collective : {"reduce_scatter", "all_reduce"}) {
    for (const std::vector<std::string>& backend :
         {std::vector<std::string>{"--backend", "tcp", "--algorithm", "ring"},
          std::vector<std::string>{"--backend", "shm"},
          std::vector<std::string>{"--backend", "shm", "--shared-buffer"},
          std::vector<std::string>{"--backend", "local"}}) {
      CAPTURE(collective);
      CAPTURE(backend);
      std::vector<std::string> arguments{collective, "--np", "3",  "-b",          "4",  "-e",
                                         "4M",       "-f",   "16", "-n",          "3",  "-c",
                                         "1",        "-w",   "1",  "--timeout-s", "100"};
      arguments.insert(arguments.end(), backend.begin(), backend.end());
      const Result r = run_bench(arguments);
      INFO(r.output);
      CHECK(r.code == 0);
      CHECK(contains(r.output, "# Out of bounds values : 0 OK"));
      if (backend[1] == "shm") {
        CHECK(contains(r.output, backend.size() == 3
                                     ? "all-reduce through shared memory in the shared buffer, "
                                       "the rest over TCP"
                                     : "all-reduce through shared memory, the rest over TCP"));
      }
    }
  }
}

TEST_CASE("push_pull over the ps backend: 2 workers and 2 servers check clean and exit 0") {
  const Result r = run_bench({"push_pull", "--backend", "ps", "--np", "2", "--ps", "2", "-b", "4K",
                              "-e", "256K", "-f", "8", "-c", "1", "--timeout-s", "100"});
  INFO(r.output);
  CHECK(r.code == 0);
  const auto columns = wrong_columns(r.output);
  CHECK(columns.size() == 3);  // 4K, 32K, 256K
  for (const auto& [out_of_place, in_place] : columns) {
    CHECK(out_of_place == "0");
    CHECK(in_place == "0");
  }
  CHECK(contains(r.output, "# Out of bounds values : 0 OK"));
  CHECK(contains(r.output, "push_pull over 2 ranks, backend ps, algorithm sync (2 parameter"));
  CHECK(contains(r.output, "algbw = (push + pull) bytes / time"));
  CHECK(contains(r.output, "launched by cohort-bench --np 2 --ps 2"));
  CHECK(contains(r.output, "        4096          1024     float     sum      -1 "));
}

TEST_CASE("push_pull catches a corrupted update, prints it and exits non-zero") {
  const Result r =
      run_bench({"push_pull", "--backend", "ps", "--np", "2", "--ps", "2", "-b", "4K", "-e", "256K",
                 "-f", "8", "-c", "1", "--timeout-s", "100", "--corrupt-reduction"});
  INFO(r.output);
  CHECK(r.code == 1);
  const auto columns = wrong_columns(r.output);
  REQUIRE(columns.size() == 3);
  for (const auto& [out_of_place, in_place] : columns) {
    CHECK(out_of_place == "1");
    CHECK(in_place == "1");
  }
  CHECK(contains(r.output, "# Out of bounds values : 6 FAILED"));
}

TEST_CASE(
    "push_pull runs on the ps backend only, the ps backend runs nothing else, and a backend's own "
    "flags are refused with another") {
  const Result local = run_bench({"push_pull", "--backend", "local", "-b", "4K", "-e", "4K"});
  INFO(local.output);
  CHECK(local.code == 2);
  CHECK(contains(local.output, "the local backend does not run push_pull"));
  CHECK(wrong_columns(local.output).empty());

  const Result ps = run_bench({"all_reduce", "--backend", "ps", "-b", "4K", "-e", "4K"});
  INFO(ps.output);
  CHECK(ps.code == 2);
  CHECK(contains(ps.output, "the ps backend does not run all_reduce"));

  const Result flag =
      run_bench({"all_reduce", "--backend", "tcp", "--ps", "2", "-b", "4K", "-e", "4K"});
  INFO(flag.output);
  CHECK(flag.code == 2);
  CHECK(contains(flag.output, "--ps applies to the ps backend only"));

  const Result shared =
      run_bench({"all_reduce", "--backend", "tcp", "--shared-buffer", "-b", "4K", "-e", "4K"});
  INFO(shared.output);
  CHECK(shared.code == 2);
  CHECK(contains(shared.output, "--shared-buffer applies to the shm backend only"));
}

// In a CUDA build on a GPU machine the nccl backend measures; elsewhere it must say which of the
// two is missing, and print no number.
TEST_CASE(
    "the nccl backend checks clean on a GPU, and elsewhere says why and exits 2, printing no "
    "numbers") {
  for (const std::string algorithm : {"deterministic", "nccl"}) {
    CAPTURE(algorithm);
    const Result r = run_bench({"all_reduce", "--backend", "nccl", "--algorithm", algorithm, "--np",
                                "1", "-b", "8", "-e", "8", "--timeout-s", "100"});
    INFO(r.output);
#if defined(COHORT_BENCH_NCCL)
    const bool measured = !contains(r.output, "nccl backend: no GPU: ");
#else
    const bool measured = false;
    CHECK(contains(r.output, "nccl backend: not built: this cohort-bench was built without CUDA"));
#endif
    if (measured) {
      CHECK(r.code == 0);
      CHECK(contains(r.output, "backend nccl, algorithm " + algorithm));
      CHECK(contains(r.output, " device 0 ["));
      const auto columns = wrong_columns(r.output);
      REQUIRE(columns.size() == 1);
      CHECK(columns[0] == std::pair<std::string, std::string>("0", "0"));
    } else {
      CHECK(r.code == 2);
      CHECK(wrong_columns(r.output).empty());
      CHECK_FALSE(contains(r.output, "Avg bus bandwidth"));
    }
  }
}

TEST_CASE("cohort-bench refuses --np that disagrees with its launcher") {
  const Result r = run_bench({"all_reduce", "--backend", "tcp", "--np", "4", "-b", "8", "-e", "8"},
                             {{"COHORT_RANK", "0"}, {"COHORT_WORLD_SIZE", "2"}});
  INFO(r.output);
  CHECK(r.code == 2);
  CHECK(contains(r.output, "--np 4 but this process was started as rank 0 of 2"));
}

TEST_CASE("cohort-bench step times both strategies, with overlap, against the plain all-reduce") {
  for (const char* strategy : {"mirrored", "multi_worker_mirrored"}) {
    CAPTURE(strategy);
    cohort::testing::TemporaryDirectory directory("cohort-bench-step");
    const fs::path json = directory.path / "step.json";
    const Result r =
        run_bench({"step", "--strategy", strategy, "--np", "2", "--params", "10K,100K", "--steps",
                   "2", "--backward-us", "2000", "--layers", "4", "--bucket-bytes", "64K",
                   "--timeout-s", "100", "--json", json.string()});
    INFO(r.output);
    CHECK(r.code == 0);
    CHECK(contains(r.output, "       10000         40000 "));
    CHECK(contains(r.output, "      100000        400000 "));
    const nlohmann::json report = nlohmann::json::parse(cohort::testing::read_file(json));
    CHECK(report["mode"] == "step");
    CHECK(report["strategy"] == strategy);
    CHECK(report["replicas"] == 2);
    REQUIRE(report["results"].size() == 2);
    CHECK(report["results"][1]["sync"]["iterations_us"].size() == 2);
    CHECK(report["results"][1]["plain"]["time_us"].get<double>() > 0.0);
    CHECK(report["backward_us"] == 2000.0);
    CHECK(report["results"][1]["step"]["time_us"].get<double>() > 0.0);
    CHECK(report["results"][1].contains("hidden"));
  }
}

TEST_CASE("cohort-bench predict fits its report, checks it, and refuses impossible inputs") {
  cohort::testing::TemporaryDirectory directory("cohort-bench-predict");
  const std::string json = (directory.path / "tcp.json").string();
  const Result measured =
      run_bench({"all_reduce", "--backend", "tcp", "--np", "2", "-b", "64K", "-e", "1M", "-f", "4",
                 "-n", "3", "-w", "1", "--timeout-s", "100", "--json", json});
  INFO(measured.output);
  REQUIRE(measured.code == 0);

  const Result predicted =
      run_bench({"predict", "--measured", json, "--check", json, "--params", "1M,10M",
                 "--compute-ms", "20", "--hosts", "1,4,1024", "--per-host", "2", "--gbits", "10"});
  INFO(predicted.output);
  CHECK(predicted.code == 0);
  CHECK(contains(predicted.output, "fitted to 3 measurements"));
  CHECK(contains(predicted.output, "largest error from 64 KiB"));
  CHECK(contains(predicted.output, "10000000 parameters (38.147 MiB on the wire)"));
  // No report through shared memory: by host has no segment costs to predict with.
  CHECK(contains(predicted.output, "| by host"));
  CHECK(contains(predicted.output, "     -          -      -         -\n"));

  // Without --measured it measures this host first, and says where it keeps the reports: in the
  // temporary directory (here the test's, which it removes).
  const Result here = run_bench(
      {"predict", "--params", "1M", "--compute-ms", "10", "--hosts", "2", "--gbits", "25"},
      {{"TMPDIR", directory.path.string()}});
  INFO(here.output);
  CHECK(here.code == 0);
  CHECK(contains(here.output, "# measured this host: 2 ranks over TCP and through shared memory"));
  CHECK(contains(here.output, "(" + (directory.path / "cohort-bench-predict-").string()));
  CHECK(contains(here.output, "fitted to 18 measurements"));
  CHECK_FALSE(contains(here.output, "#wrong"));  // the sweeps' tables are not shown

  // Through shared memory outside the shared buffer: not the path the model is of.
  const std::string slots = (directory.path / "shm.json").string();
  const Result through_slots =
      run_bench({"all_reduce", "--backend", "shm", "--np", "2", "-b", "64K", "-e", "64K", "-n", "1",
                 "-w", "0", "--timeout-s", "100", "--json", slots});
  INFO(through_slots.output);
  REQUIRE(through_slots.code == 0);

  const std::vector<std::pair<std::vector<std::string>, std::string>> refusals{
      {{"--measured", json + ".missing"}, "tcp.json.missing': cannot read it"},
      {{"--measured", json + "@3x2"}, "3 hosts of 2 make 6 ranks, but the report has 2"},
      {{"--measured", json + "@4"}, "the shape after @ must be HxP"},
      {{"--measured", json, "--check", json + "@2x1"}, "spans hosts, but no --measured report"},
      {{"--measured", json, "--per-host", "0"}, "--per-host 0: at least 1 rank"},
      {{"--measured", json, "--hosts", "4,0"}, "--hosts 0: at least 1 host"},
      {{"--measured", json, "--gbits", "0"}, "a link's rate is more than 0 Gbit/s"},
      {{"--measured", json, "--params", "1M"}, "--params needs --compute-ms"},
      {{"--measured", json, "--bucket-bytes", "2"}, "at least one element"},
      {{"--measured", json, "--cores", "-1"}, "--cores -1: at least 1 core"},
      {{"--measured", json + "," + slots},
       "shm.json': through shared memory but not in the shared "
       "buffer"},
  };
  for (const auto& [arguments, sentence] : refusals) {
    std::vector<std::string> argv{"predict"};
    argv.insert(argv.end(), arguments.begin(), arguments.end());
    const Result refused = run_bench(argv);
    CAPTURE(sentence);
    INFO(refused.output);
    CHECK(refused.code == 2);
    CHECK(contains(refused.output, sentence));
  }
}

#else

TEST_CASE("cohort-bench end-to-end tests" * doctest::skip()) {}

#endif
