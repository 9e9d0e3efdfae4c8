#include "cohort/cluster/cluster.hpp"

#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "error_message.hpp"

using namespace cohort::cluster;
using cohort::testing::config_error_message;
using cohort::testing::contains;
using Tasks = std::vector<std::string>;

namespace {

Spec resolve_from(const Variables& variables, const Explicit& given = {}) {
  return resolve(given, environment_from(variables));
}

std::string error_from(const Variables& variables, const Explicit& given = {}) {
  return config_error_message([&] { resolve_from(variables, given); });
}

const char* const kTfConfigThreeWorkers = R"({
  "cluster": {"chief": ["chief0:2222"],
              "worker": ["worker0:2222", "worker1:2222", "worker2:2222"],
              "ps": ["ps0:2222", "ps1:2222"]},
  "task": {"type": "worker", "index": 1}})";

// Every source present and saying rank 1 of 4 (TF_CONFIG: worker 0 after the chief).
Variables every_source_agreeing() {
  return {
      {"COHORT_RANK", "1"},
      {"COHORT_WORLD_SIZE", "4"},
      {"TF_CONFIG", R"({"cluster": {"chief": ["tf0:2222"], "worker": ["tf1:2222", "tf2:2222",
                       "tf3:2222"]}, "task": {"type": "worker", "index": 0}})"},
      {"RANK", "1"},
      {"WORLD_SIZE", "4"},
      {"MASTER_ADDR", "torch0"},
      {"MASTER_PORT", "29400"},
      {"OMPI_COMM_WORLD_RANK", "1"},
      {"OMPI_COMM_WORLD_SIZE", "4"},
      {"SLURM_PROCID", "1"},
      {"SLURM_NTASKS", "4"},
      {"SLURM_JOB_NODELIST", "slurm[0-3]"},
  };
}

}  // namespace

TEST_CASE("no source at all means a single process, rank 0 of 1") {
  const Spec spec = resolve_from({});
  CHECK(spec.rank == 0);
  CHECK(spec.size == 1);
  CHECK(spec.local_rank == 0);
  CHECK(spec.local_size == 1);
  CHECK(spec.role == cohort::Role::kWorker);
  CHECK(spec.master_address == "127.0.0.1");
  CHECK(spec.master_port == kDefaultMasterPort);
  CHECK(spec.job_id.empty());
  CHECK(spec.source == source::kNone);
  CHECK(describe(spec) ==
        "rank 0 of 1 (local 0 of 1), role worker, master 127.0.0.1:29500, no job id, from "
        "defaults (no launcher variables)");
}

TEST_CASE("variables set to the empty string count as not set") {
  const Spec spec = resolve_from({{"RANK", ""}, {"WORLD_SIZE", ""}, {"TF_CONFIG", ""}});
  CHECK(spec.source == source::kNone);
  CHECK(resolve_from({{"TF_CONFIG", " { } "}}).source == source::kNone);  // TensorFlow's "none"
}

TEST_CASE("explicit options alone decide, with one host unless told otherwise") {
  const Spec spec = resolve_from({}, {.rank = 2, .size = 4});
  CHECK(spec.rank == 2);
  CHECK(spec.size == 4);
  CHECK(spec.local_rank == 2);
  CHECK(spec.local_size == 4);
  CHECK(spec.task_index == 2);
  CHECK(spec.master_address == "127.0.0.1");
  CHECK(spec.source == source::kExplicit);

  const Spec across = resolve_from({}, {.rank = 3,
                                        .size = 4,
                                        .local_rank = 1,
                                        .local_size = 2,
                                        .master_address = "head",
                                        .master_port = 4000,
                                        .job_id = "mine"});
  CHECK(across.local_rank == 1);
  CHECK(across.local_size == 2);
  CHECK(describe(across) ==
        "rank 3 of 4 (local 1 of 2), role worker, master head:4000, job 'mine', from explicit "
        "options");
}

TEST_CASE("explicit options are checked, each error naming the field") {
  CHECK(error_from({}, {.rank = 1}) ==
        "Explicit::rank = 1: Explicit::size is not set; the two come together");
  CHECK(error_from({}, {.size = 2}) ==
        "Explicit::size = 2: Explicit::rank is not set; the two come together");
  CHECK(error_from({}, {.rank = 4, .size = 4}) ==
        "Explicit::rank = 4: must be less than Explicit::size = 4");
  CHECK(error_from({}, {.rank = -1, .size = 4}) == "Explicit::rank = -1: must not be negative");
  CHECK(error_from({}, {.rank = 0, .size = 0}) == "Explicit::size = 0: must be at least 1");
  CHECK(error_from({}, {.rank = 0, .size = 2, .local_rank = 0}) ==
        "Explicit::local_rank = 0: Explicit::local_size is not set; the two come together");
  CHECK(error_from({}, {.rank = 0, .size = 2, .local_rank = 0, .local_size = 3}) ==
        "Explicit::local_size = 3: must not exceed Explicit::size = 2");
  CHECK(error_from({}, {.rank = 0, .size = 2, .master_port = 0}) ==
        "Explicit::master_port = 0: out of range: a port lies in [1, 65535]");
  CHECK(error_from({}, {.rank = 0, .size = 2, .master_address = "a b"}) ==
        "Explicit::master_address = \"a b\": not a host name or address");
  CHECK(contains(error_from({}, {.rank = 0, .size = 4, .local_rank = 0, .local_size = 2}),
                 "COHORT_MASTER_ADDR: not set"));
}

TEST_CASE("explicit rendezvous fields apply whichever source decides") {
  const Spec spec = resolve_from({{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "torch0"}},
                                 {.master_address = "10.0.0.1", .master_port = 3000});
  CHECK(spec.source == source::kTorchrun);
  CHECK(spec.master_address == "10.0.0.1");
  CHECK(spec.master_port == 3000);
}

TEST_CASE("COHORT_* variables alone decide") {
  const Spec spec = resolve_from({{"COHORT_RANK", "3"},
                                  {"COHORT_WORLD_SIZE", "8"},
                                  {"COHORT_LOCAL_RANK", "1"},
                                  {"COHORT_LOCAL_WORLD_SIZE", "2"},
                                  {"COHORT_MASTER_ADDR", "head.example.org"},
                                  {"COHORT_MASTER_PORT", "41000"},
                                  {"COHORT_JOB_ID", "run-7"}});
  CHECK(spec.rank == 3);
  CHECK(spec.size == 8);
  CHECK(spec.local_rank == 1);
  CHECK(spec.local_size == 2);
  CHECK(spec.master_address == "head.example.org");
  CHECK(spec.master_port == 41000);
  CHECK(spec.job_id == "run-7");
  CHECK(spec.source == source::kCohort);

  const Spec one_host = resolve_from({{"COHORT_RANK", "1"}, {"COHORT_WORLD_SIZE", "3"}});
  CHECK(one_host.local_rank == 1);
  CHECK(one_host.local_size == 3);
  CHECK(one_host.master_address == "127.0.0.1");
}

TEST_CASE("COHORT_* variables are checked, each error naming the variable and the value") {
  CHECK(error_from({{"COHORT_RANK", "1"}}) ==
        "COHORT_RANK = \"1\": COHORT_WORLD_SIZE is not set; the two come together");
  CHECK(error_from({{"COHORT_RANK", "one"}, {"COHORT_WORLD_SIZE", "2"}}) ==
        "COHORT_RANK = \"one\": not an integer");
  CHECK(error_from({{"COHORT_LOCAL_RANK", "0"}, {"COHORT_LOCAL_WORLD_SIZE", "2"}}) ==
        "COHORT_LOCAL_RANK = 0: set without COHORT_RANK and COHORT_WORLD_SIZE");
  CHECK(error_from(
            {{"COHORT_RANK", "0"}, {"COHORT_WORLD_SIZE", "2"}, {"COHORT_MASTER_PORT", "65536"}}) ==
        "COHORT_MASTER_PORT = 65536: out of range: a port lies in [1, 65535]");
}

TEST_CASE("TF_CONFIG maps chief to rank 0, workers after it, and ps tasks to their own ranks") {
  const auto spec_of = [](const std::string& type, int index) {
    Variables variables{{"TF_CONFIG", kTfConfigThreeWorkers}};
    const std::string needle = R"("task": {"type": "worker", "index": 1})";
    std::string& text = variables["TF_CONFIG"];
    text.replace(text.find(needle), needle.size(),
                 R"("task": {"type": ")" + type + R"(", "index": )" + std::to_string(index) + "}");
    return resolve_from(variables);
  };
  const Tasks workers{"chief0:2222", "worker0:2222", "worker1:2222", "worker2:2222"};

  const Spec chief = spec_of("chief", 0);
  CHECK(chief.rank == 0);
  CHECK(chief.size == 4);
  CHECK(chief.role == cohort::Role::kChief);
  CHECK(chief.task_index == 0);
  CHECK(chief.workers == workers);
  CHECK(chief.parameter_servers == Tasks{"ps0:2222", "ps1:2222"});
  CHECK(chief.master_address == "chief0");
  CHECK(chief.master_port == 2222);
  CHECK(chief.source == source::kTfConfig);

  for (int index = 0; index < 3; ++index) {
    CAPTURE(index);
    const Spec worker = spec_of("worker", index);
    CHECK(worker.rank == index + 1);
    CHECK(worker.size == 4);
    CHECK(worker.role == cohort::Role::kWorker);
    CHECK(worker.task_index == index);
    CHECK(worker.local_rank == 0);  // one task per host
    CHECK(worker.local_size == 1);
    CHECK(worker.workers[static_cast<std::size_t>(worker.rank)] ==
          "worker" + std::to_string(index) + ":2222");
    CHECK(worker.master_address == "chief0");
  }

  const Spec ps = spec_of("ps", 1);
  CHECK(ps.rank == 1);
  CHECK(ps.size == 2);
  CHECK(ps.role == cohort::Role::kParameterServer);
  CHECK(ps.task_index == 1);
  CHECK(ps.master_address == "chief0");
  CHECK(describe(ps) ==
        "rank 1 of 2 (local 0 of 1), role ps, master chief0:2222, no job id, from TF_CONFIG");
}

TEST_CASE("TF_CONFIG without a chief makes worker 0 the master; tasks on one host share it") {
  const Spec spec =
      resolve_from({{"TF_CONFIG", R"({"cluster": {"worker": ["localhost:12345", "localhost:23456",
                                                 "other:1"]},
                         "task": {"type": "worker", "index": 1}})"}});
  CHECK(spec.rank == 1);
  CHECK(spec.size == 3);
  CHECK(spec.local_rank == 1);
  CHECK(spec.local_size == 2);
  CHECK(spec.master_address == "localhost");
  CHECK(spec.master_port == 12345);

  const Spec evaluator = resolve_from(
      {{"TF_CONFIG", R"({"cluster": {"worker": ["w:1"]}, "task": {"type": "evaluator"}})"}});
  CHECK(evaluator.role == cohort::Role::kEvaluator);
  CHECK(evaluator.rank == 0);
  CHECK(evaluator.size == 1);
}

TEST_CASE("TF_CONFIG errors reach resolve unchanged") {
  CHECK(contains(error_from({{"TF_CONFIG", "{not json"}}),
                 "TF_CONFIG = \"{not json\": not valid JSON: [json.exception.parse_error"));
  CHECK(error_from({{"TF_CONFIG", R"({"cluster": {"worker": ["a:1", "b:1", "c:1"]},
                                      "task": {"type": "worker", "index": 5}})"}}) ==
        "TF_CONFIG task.index = 5: out of range for 3 worker tasks");
  CHECK(contains(error_from({{"TF_CONFIG", R"({"cluster": {"worker": ["a:1"]},
                                              "task": {"type": "driver"}})"}}),
                 "TF_CONFIG task.type = \"driver\": unknown task type"));
}

TEST_CASE("torchrun variables alone decide, as torchrun sets them") {
  const Spec spec = resolve_from({{"RANK", "1"},
                                  {"WORLD_SIZE", "4"},
                                  {"LOCAL_RANK", "1"},
                                  {"LOCAL_WORLD_SIZE", "4"},
                                  {"MASTER_ADDR", "127.0.0.1"},
                                  {"MASTER_PORT", "29500"},
                                  {"TORCHELASTIC_RUN_ID", "abc"}});
  CHECK(describe(spec) ==
        "rank 1 of 4 (local 1 of 4), role worker, master 127.0.0.1:29500, job 'abc', from "
        "torchrun variables");
}

TEST_CASE("torchrun variables as a PyTorchJob sets them: one process per pod") {
  const Spec spec = resolve_from({{"RANK", "2"},
                                  {"WORLD_SIZE", "3"},
                                  {"MASTER_ADDR", "job-master-0"},
                                  {"MASTER_PORT", "23456"}});
  CHECK(spec.rank == 2);
  CHECK(spec.local_rank == 0);
  CHECK(spec.local_size == 1);
  CHECK(spec.master_address == "job-master-0");
  CHECK(spec.master_port == 23456);
}

TEST_CASE("under torchrun's agent store cohort listens on MASTER_PORT + 1, unless told a port") {
  Variables variables{{"RANK", "0"},
                      {"WORLD_SIZE", "2"},
                      {"LOCAL_RANK", "0"},
                      {"LOCAL_WORLD_SIZE", "2"},
                      {"MASTER_PORT", "29500"},
                      {"TORCHELASTIC_USE_AGENT_STORE", "True"}};
  CHECK(resolve_from(variables).master_port == 29501);
  variables["TORCHELASTIC_USE_AGENT_STORE"] = "False";
  CHECK(resolve_from(variables).master_port == 29500);
  variables["TORCHELASTIC_USE_AGENT_STORE"] = "True";
  variables["COHORT_MASTER_PORT"] = "40000";
  CHECK(resolve_from(variables).master_port == 40000);
  variables.erase("COHORT_MASTER_PORT");
  variables["MASTER_PORT"] = "65535";
  CHECK(
      contains(error_from(variables), "MASTER_PORT = 65535: TORCHELASTIC_USE_AGENT_STORE is True"));
  CHECK(contains(error_from(variables), "set COHORT_MASTER_PORT"));
}

TEST_CASE("torchrun variables are checked, each error naming the variable and the value") {
  CHECK(error_from({{"RANK", "x"}, {"WORLD_SIZE", "4"}}) == "RANK = \"x\": not an integer");
  CHECK(error_from({{"RANK", "4"}, {"WORLD_SIZE", "4"}}) ==
        "RANK = 4: must be less than WORLD_SIZE = 4");
  CHECK(error_from({{"RANK", "0"}, {"WORLD_SIZE", "0"}}) == "WORLD_SIZE = 0: must be at least 1");
  CHECK(error_from({{"WORLD_SIZE", "4"}}) ==
        "WORLD_SIZE = \"4\": RANK is not set; the two come together");
  CHECK(error_from(
            {{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "2"}, {"LOCAL_WORLD_SIZE", "2"}}) ==
        "LOCAL_RANK = 2: must be less than LOCAL_WORLD_SIZE = 2");
  CHECK(error_from({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "70000"}}) ==
        "MASTER_PORT = 70000: out of range: a port lies in [1, 65535]");
  CHECK(error_from({{"RANK", "0"}, {"WORLD_SIZE", "2"}}) ==
        "COHORT_MASTER_ADDR: not set, and the ranks span hosts (LOCAL_WORLD_SIZE = 1 (not set) < "
        "WORLD_SIZE = 2) with no master address from torchrun variables; set it to the host of "
        "rank 0");
}

TEST_CASE("Open MPI variables alone decide; all ranks on one host meet on 127.0.0.1") {
  const Spec spec = resolve_from({{"OMPI_COMM_WORLD_RANK", "2"},
                                  {"OMPI_COMM_WORLD_SIZE", "4"},
                                  {"OMPI_COMM_WORLD_LOCAL_RANK", "2"},
                                  {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"}});
  CHECK(spec.rank == 2);
  CHECK(spec.size == 4);
  CHECK(spec.local_rank == 2);
  CHECK(spec.local_size == 4);
  CHECK(spec.master_address == "127.0.0.1");
  CHECK(spec.master_port == kDefaultMasterPort);
  CHECK(spec.source == source::kOpenMpi);
}

TEST_CASE("Open MPI across hosts needs COHORT_MASTER_ADDR, or a Slurm node list") {
  Variables variables{{"OMPI_COMM_WORLD_RANK", "5"},
                      {"OMPI_COMM_WORLD_SIZE", "8"},
                      {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                      {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"}};
  CHECK(error_from(variables) ==
        "COHORT_MASTER_ADDR: not set, and the ranks span hosts (OMPI_COMM_WORLD_LOCAL_SIZE = 4 < "
        "OMPI_COMM_WORLD_SIZE = 8) with no master address from Open MPI variables; set it to "
        "the host of rank 0");
  variables["SLURM_JOB_NODELIST"] = "cn[07-08]";
  CHECK(resolve_from(variables).master_address == "cn07");
  variables["COHORT_MASTER_ADDR"] = "head";
  variables["COHORT_MASTER_PORT"] = "3333";
  variables["COHORT_JOB_ID"] = "mpi-job";
  const Spec spec = resolve_from(variables);
  CHECK(spec.master_address == "head");
  CHECK(spec.master_port == 3333);
  CHECK(spec.job_id == "mpi-job");
}

TEST_CASE("Slurm variables alone decide; the master is the first node") {
  const Spec spec = resolve_from({{"SLURM_PROCID", "5"},
                                  {"SLURM_NTASKS", "8"},
                                  {"SLURM_LOCALID", "1"},
                                  {"SLURM_NODEID", "2"},
                                  {"SLURM_TASKS_PER_NODE", "2(x4)"},
                                  {"SLURM_JOB_NODELIST", "gpu[01-03,07]"},
                                  {"SLURM_JOB_ID", "123456"}});
  CHECK(spec.rank == 5);
  CHECK(spec.size == 8);
  CHECK(spec.local_rank == 1);
  CHECK(spec.local_size == 2);
  CHECK(spec.task_index == 5);
  CHECK(spec.master_address == "gpu01");
  CHECK(spec.master_port == kDefaultMasterPort);
  CHECK(describe(spec) ==
        "rank 5 of 8 (local 1 of 2), role worker, master gpu01:29500, job '123456', from Slurm "
        "variables");
}

TEST_CASE("Slurm: the step's node list and counts come before the job's") {
  const Spec spec = resolve_from({{"SLURM_PROCID", "0"},
                                  {"SLURM_NTASKS", "3"},
                                  {"SLURM_NODEID", "0"},
                                  {"SLURM_STEP_TASKS_PER_NODE", "1(x3)"},
                                  {"SLURM_TASKS_PER_NODE", "4(x4)"},
                                  {"SLURM_STEP_NODELIST", "b[2-4]"},
                                  {"SLURM_JOB_NODELIST", "a[1-4]"}});
  CHECK(spec.master_address == "b2");
  CHECK(spec.local_size == 1);
}

TEST_CASE("Slurm without per-node counts estimates the local size from the node list") {
  const Spec two_nodes = resolve_from({{"SLURM_PROCID", "5"},
                                       {"SLURM_NTASKS", "8"},
                                       {"SLURM_LOCALID", "1"},
                                       {"SLURM_JOB_NODELIST", "n[1-2]"}});
  CHECK(two_nodes.local_size == 4);
  const Spec one_node = resolve_from({{"SLURM_PROCID", "2"}, {"SLURM_NTASKS", "4"}});
  CHECK(one_node.local_size == 4);
  CHECK(one_node.master_address == "127.0.0.1");
}

TEST_CASE("Slurm variables are checked, each error naming the variable and the value") {
  CHECK(error_from({{"SLURM_PROCID", "0"}}) ==
        "SLURM_PROCID = \"0\": SLURM_NTASKS is not set; the two come together");
  CHECK(error_from({{"SLURM_PROCID", "4"}, {"SLURM_NTASKS", "4"}}) ==
        "SLURM_PROCID = 4: must be less than SLURM_NTASKS = 4");
  CHECK(
      error_from({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "4"}, {"SLURM_JOB_NODELIST", "n[1-2"}}) ==
      "SLURM_JOB_NODELIST = \"n[1-2\": unclosed '[' at position 1");
  CHECK(error_from({{"SLURM_PROCID", "0"},
                    {"SLURM_NTASKS", "4"},
                    {"SLURM_NODEID", "2"},
                    {"SLURM_TASKS_PER_NODE", "2(x2)"}}) ==
        "SLURM_NODEID = 2: out of range for SLURM_TASKS_PER_NODE = \"2(x2)\"");
}

TEST_CASE("the first source present decides, in the documented order") {
  Variables variables = every_source_agreeing();
  CHECK(resolve_from(variables, {.rank = 1, .size = 4}).source == source::kExplicit);

  const Spec cohort = resolve_from(variables);
  CHECK(cohort.source == source::kCohort);
  CHECK(cohort.master_address == "127.0.0.1");  // COHORT_* without an address: one host

  variables.erase("COHORT_RANK");
  variables.erase("COHORT_WORLD_SIZE");
  const Spec tf = resolve_from(variables);
  CHECK(tf.source == source::kTfConfig);
  CHECK(tf.master_address == "tf0");

  variables.erase("TF_CONFIG");
  const Spec torch = resolve_from(variables);
  CHECK(torch.source == source::kTorchrun);
  CHECK(torch.master_address == "torch0");
  CHECK(torch.master_port == 29400);

  variables.erase("RANK");
  variables.erase("WORLD_SIZE");
  const Spec mpi = resolve_from(variables);
  CHECK(mpi.source == source::kOpenMpi);
  CHECK(mpi.master_address == "slurm0");

  variables.erase("OMPI_COMM_WORLD_RANK");
  variables.erase("OMPI_COMM_WORLD_SIZE");
  const Spec slurm = resolve_from(variables);
  CHECK(slurm.source == source::kSlurm);
  CHECK(slurm.master_address == "slurm0");

  for (const Spec& spec : {cohort, tf, torch, mpi, slurm}) {
    CHECK(spec.rank == 1);
    CHECK(spec.size == 4);
  }
}

TEST_CASE("sources that disagree on rank or size are refused, naming both and their values") {
  CHECK(
      error_from(
          {{"COHORT_RANK", "1"}, {"COHORT_WORLD_SIZE", "4"}, {"RANK", "0"}, {"WORLD_SIZE", "4"}}) ==
      "cluster sources disagree: COHORT_* variables: rank 1 of 4 (COHORT_RANK = 1, "
      "COHORT_WORLD_SIZE = 4); torchrun variables: rank 0 of 4 (RANK = 0, WORLD_SIZE = 4). The "
      "first decides (docs/launching.md, \"Precedence\"): unset the variables that do not "
      "describe this launch");
  CHECK(contains(error_from({{"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_SIZE", "2"}},
                            {.rank = 1, .size = 4}),
                 "explicit options: rank 1 of 4 (Explicit::rank = 1, Explicit::size = 4); Open MPI "
                 "variables: rank 1 of 2 (OMPI_COMM_WORLD_RANK = 1, OMPI_COMM_WORLD_SIZE = 2)"));
  CHECK(contains(
      error_from({{"TF_CONFIG", kTfConfigThreeWorkers}, {"RANK", "1"}, {"WORLD_SIZE", "4"}}),
      "TF_CONFIG: rank 2 of 4 (TF_CONFIG task worker[1]); torchrun variables: rank 1 of "
      "4 (RANK = 1, WORLD_SIZE = 4)"));
  // A later source is read in full, so its own errors are reported too.
  CHECK(error_from({{"COHORT_RANK", "0"},
                    {"COHORT_WORLD_SIZE", "1"},
                    {"RANK", "zero"},
                    {"WORLD_SIZE", "1"}}) == "RANK = \"zero\": not an integer");
}

TEST_CASE("Slurm is not compared: launchers inside an allocation inherit other numbers") {
  // srun starts one torchrun per node; torchrun starts 4 ranks on each of 2 nodes.
  const Spec spec = resolve_from({{"RANK", "5"},
                                  {"WORLD_SIZE", "8"},
                                  {"LOCAL_RANK", "1"},
                                  {"LOCAL_WORLD_SIZE", "4"},
                                  {"MASTER_ADDR", "n1"},
                                  {"SLURM_PROCID", "1"},
                                  {"SLURM_NTASKS", "2"},
                                  {"SLURM_JOB_NODELIST", "n[1-2]"},
                                  {"SLURM_JOB_ID", "99"}});
  CHECK(spec.source == source::kTorchrun);
  CHECK(spec.rank == 5);
  CHECK(spec.job_id.empty());  // the job id is the deciding source's, or COHORT_JOB_ID
}

TEST_CASE("check_resolvable asks about the master and every listed address") {
  Spec spec;
  spec.source = "a test";
  spec.master_address = "localhost";
  spec.workers = {"localhost:1", "127.0.0.1:2"};
  CHECK_NOTHROW(check_resolvable(spec));
  spec.workers.push_back("no-such-host.invalid:3");
  CHECK(config_error_message([&] {
          check_resolvable(spec);
        }).starts_with("workers[2] (from a test) = \"no-such-host.invalid\": does not resolve"));
}

TEST_CASE("the job's hosts, where a process that comes to a running job looks for its door") {
  // COHORT_HOSTS first, each host once, in order.
  CHECK(resolve_from({{"COHORT_RANK", "1"},
                      {"COHORT_WORLD_SIZE", "4"},
                      {"COHORT_MASTER_ADDR", "h1"},
                      {"COHORT_HOSTS", "h1,h2,[::1],h2"}})
            .hosts == Tasks{"h1", "h2", "::1"});
  // TF_CONFIG: the chief's and the workers' hosts, not the servers'.
  CHECK(resolve_from({{"TF_CONFIG", kTfConfigThreeWorkers}}).hosts ==
        Tasks{"chief0", "worker0", "worker1", "worker2"});
  // Slurm: the allocation's nodes, also under COHORT_* variables, where a replacement step's own
  // list names its node alone.
  CHECK(resolve_from({{"COHORT_RANK", "3"},
                      {"COHORT_WORLD_SIZE", "4"},
                      {"COHORT_MASTER_ADDR", "n1"},
                      {"SLURM_STEP_NODELIST", "n4"},
                      {"SLURM_JOB_NODELIST", "n[1-4]"}})
            .hosts == Tasks{"n1", "n2", "n3", "n4"});
  CHECK(resolve_from({{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "m"}}).hosts.empty());
  CHECK(error_from({{"COHORT_HOSTS", "h1,,h3"}}).starts_with("COHORT_HOSTS item 2 = \"\": "));
}
