#include "cohort/cluster/tf_config.hpp"

#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "error_message.hpp"

using cohort::cluster::parse_tf_config;
using cohort::cluster::TfConfig;
using cohort::testing::config_error_message;
using cohort::testing::contains;
using Tasks = std::vector<std::string>;

namespace {

std::string error_of(const std::string& json) {
  return config_error_message([&] { parse_tf_config(json); });
}

}  // namespace

TEST_CASE("parse_tf_config reads every task list and the task") {
  const TfConfig config = parse_tf_config(R"({
      "cluster": {"chief": ["c0:2222"], "worker": ["w0:2222", "w1:2222"],
                  "ps": ["p0:2222", "p1:2222"], "evaluator": ["e0:2222"]},
      "task": {"type": "ps", "index": 1},
      "environment": "cloud", "rpc_layer": "grpc"})");
  CHECK(config.chief == Tasks{"c0:2222"});
  CHECK(config.worker == Tasks{"w0:2222", "w1:2222"});
  CHECK(config.ps == Tasks{"p0:2222", "p1:2222"});
  CHECK(config.evaluator == Tasks{"e0:2222"});
  CHECK(config.task_type == "ps");
  CHECK(config.task_index == 1);
}

TEST_CASE(
    "parse_tf_config takes \"master\" as the chief, a missing index as 0, and an unlisted "
    "evaluator") {
  const TfConfig master = parse_tf_config(
      R"({"cluster": {"master": ["m:1"], "worker": ["w:1"]}, "task": {"type": "master"}})");
  CHECK(master.chief == Tasks{"m:1"});
  CHECK(master.task_type == "chief");
  CHECK(master.task_index == 0);

  const TfConfig evaluator = parse_tf_config(
      R"({"cluster": {"worker": ["w:1"]}, "task": {"type": "evaluator", "index": 0}})");
  CHECK(evaluator.task_type == "evaluator");
  CHECK(evaluator.evaluator.empty());
}

TEST_CASE("parse_tf_config gives malformed JSON with the parser's message") {
  const std::string message = error_of(R"({"cluster": {"worker": ["w:1"]}, "task": )");
  CHECK(message.starts_with("TF_CONFIG = \"{\"cluster\": {\"worker\""));
  CHECK(contains(message, "not valid JSON: [json.exception.parse_error.101] parse error"));
  CHECK(error_of("[1, 2]") == "TF_CONFIG = [1,2]: expected a JSON object");
}

TEST_CASE("parse_tf_config refuses a number no double holds, even in a key it ignores") {
  for (const std::string json :
       {R"({"cluster": {"worker": ["w:1"]}, "task": {"type": "worker"}, "environment": 1e999})",
        R"({"cluster": {"worker": ["w:1"]}, "task": {"type": "worker", "index": -1e999}})"}) {
    CAPTURE(json);
    const std::string message = error_of(json);
    CHECK(message.starts_with("TF_CONFIG = \"{\"cluster\""));
    CHECK(contains(message, "cannot be read: [json.exception.out_of_range.406] number overflow"));
  }
}

TEST_CASE("parse_tf_config refuses nesting deeper than any TF_CONFIG has, however deep") {
  const auto nested = [](std::size_t depth) {
    return std::string(depth, '[') + std::string(depth, ']');
  };
  const std::string ignored = R"({"cluster": {"worker": ["w:1"]}, "task": {"type": "worker"},)" +
                              std::string(R"( "rpc_layer": )") + nested(17) + "}";
  CHECK(contains(error_of(ignored), ": nested deeper than 16 levels"));
  // A message quotes a value it refuses: this one would take a million nested calls to print.
  CHECK(contains(error_of(R"({"cluster": )" + nested(1'000'000) + "}"),
                 ": nested deeper than 16 levels"));
  CHECK(error_of(R"({"cluster": )" + nested(15) + "}") ==
        "TF_CONFIG cluster = " + nested(15) + ": expected an object");
}

TEST_CASE("parse_tf_config names the JSON path of a wrong shape") {
  CHECK(contains(error_of(R"({"task": {"type": "worker"}})"), "TF_CONFIG cluster: missing"));
  CHECK(error_of(R"({"cluster": [], "task": {}})") == "TF_CONFIG cluster = []: expected an object");
  CHECK(error_of(R"({"cluster": {"worker": "w:1"}, "task": {"type": "worker"}})") ==
        "TF_CONFIG cluster.worker = \"w:1\": expected an array of \"host:port\"");
  CHECK(error_of(R"({"cluster": {"worker": [1]}, "task": {"type": "worker"}})") ==
        "TF_CONFIG cluster.worker[0] = 1: expected \"host:port\"");
  CHECK(error_of(R"({"cluster": {"worker": ["w0:1", "w1"]}, "task": {"type": "worker"}})") ==
        "TF_CONFIG cluster.worker[1] = \"w1\": expected host:port");
  CHECK(error_of(R"({"cluster": {"worker": ["w0:99999"]}, "task": {"type": "worker"}})") ==
        "TF_CONFIG cluster.worker[0] = \"w0:99999\": port out of range: a port lies in [1, 65535]");
  CHECK(error_of(R"({"cluster": {"driver": ["d:1"]}, "task": {"type": "worker"}})") ==
        "TF_CONFIG cluster.driver = [\"d:1\"]: unknown task type (expected chief, worker, ps or "
        "evaluator)");
  CHECK(error_of(R"({"cluster": {"chief": ["a:1", "b:1"]}, "task": {"type": "chief"}})") ==
        "TF_CONFIG cluster.chief: 2 tasks; there is at most one chief");
  CHECK(error_of(R"({"cluster": {"chief": ["a:1"], "master": ["b:1"]}, "task": {}})") ==
        "TF_CONFIG cluster.master: given twice (\"master\" is another name for \"chief\")");
  CHECK(error_of(R"({"cluster": {"ps": ["p:1"]}, "task": {"type": "ps"}})") ==
        "TF_CONFIG cluster: no chief and no worker tasks; training needs at least one");
  CHECK(contains(error_of(R"({"cluster": {"worker": ["w:1"]}})"), "TF_CONFIG task: missing"));
  CHECK(error_of(R"({"cluster": {"worker": ["w:1"]}, "task": {}})") ==
        "TF_CONFIG task.type: missing");
  CHECK(error_of(R"({"cluster": {"worker": ["w:1"]}, "task": {"type": "worker", "index": "1"}})") ==
        "TF_CONFIG task.index = \"1\": expected an integer");
}

TEST_CASE("parse_tf_config refuses an unknown task type and an index out of range") {
  CHECK(error_of(R"({"cluster": {"worker": ["w:1"]}, "task": {"type": "driver", "index": 0}})") ==
        "TF_CONFIG task.type = \"driver\": unknown task type (expected chief, worker, ps or "
        "evaluator)");
  CHECK(error_of(R"({"cluster": {"worker": ["a:1", "b:1", "c:1"]},
                     "task": {"type": "worker", "index": 5}})") ==
        "TF_CONFIG task.index = 5: out of range for 3 worker tasks");
  CHECK(error_of(R"({"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": -1}})") ==
        "TF_CONFIG task.index = -1: out of range for 1 worker tasks");
  CHECK(error_of(R"({"cluster": {"worker": ["a:1"]}, "task": {"type": "ps", "index": 0}})") ==
        "TF_CONFIG task.type = \"ps\": the cluster lists no ps tasks");
  CHECK(
      error_of(R"({"cluster": {"worker": ["a:1"]}, "task": {"type": "evaluator", "index": 1}})") ==
      "TF_CONFIG task.index = 1: out of range for 1 evaluator tasks");
}
