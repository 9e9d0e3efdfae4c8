// TF_CONFIG, as TensorFlow and the Kubernetes training operator (TFJob) write it:
//
//   {"cluster": {"chief": ["c0:2222"], "worker": ["w0:2222", "w1:2222"], "ps": ["p0:2222"],
//                "evaluator": ["e0:2222"]},
//    "task": {"type": "worker", "index": 1}}
//
// parse_tf_config checks the shape and every address, and returns the task lists as written.
// How tasks become ranks is cluster.hpp's business (chief is rank 0, workers follow).
//
// Accepted as TensorFlow accepts them: "master" as the old name of "chief"; an evaluator that is
// not listed in "cluster" (it then must have index 0); other top-level keys ("environment",
// "rpc_layer") are ignored. Refused, each with a ConfigError naming the JSON path and the value:
// text that is not JSON or holds a number no double holds ("1e999", in any key), with the
// parser's message; nesting deeper than 16 levels; a missing or mistyped "cluster" or "task", an
// unknown task type, an address that is not host:port, more than one chief or evaluator, and a
// task index out of range ("TF_CONFIG task.index = 5: out of range for 3 worker tasks").
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "cohort/cluster/environment.hpp"
#include "cohort/core/error.hpp"

namespace cohort::cluster {

struct TfConfig {
  std::vector<std::string> chief;  // at most one "host:port"
  std::vector<std::string> worker;
  std::vector<std::string> ps;
  std::vector<std::string> evaluator;  // at most one
  std::string task_type;               // "chief", "worker", "ps" or "evaluator"
  int task_index = 0;

  // The tasks of task_type, as listed.
  const std::vector<std::string>& tasks_of(std::string_view type) const {
    if (type == "chief") return chief;
    if (type == "ps") return ps;
    if (type == "evaluator") return evaluator;
    return worker;
  }
  std::vector<std::string>& tasks_of(std::string_view type) {
    return const_cast<std::vector<std::string>&>(std::as_const(*this).tasks_of(type));
  }
};

namespace detail {

[[noreturn]] inline void reject_json(std::string_view path, const nlohmann::json& value,
                                     std::string_view requirement) {
  throw ConfigError(std::string(path) + " = " + value.dump() + ": " + std::string(requirement));
}

// "chief" for "master", the type itself if known, "" if unknown.
inline std::string_view canonical_task_type(std::string_view type) {
  if (type == "master") return "chief";
  if (type == "chief" || type == "worker" || type == "ps" || type == "evaluator") return type;
  return {};
}

}  // namespace detail

// `name` is where the text came from ("TF_CONFIG"), for the messages.
inline TfConfig parse_tf_config(std::string_view text, std::string_view name = "TF_CONFIG") {
  const std::string prefix(name);
  nlohmann::json root;
  // The parser is iterative, but printing a value for a message recurses once per level: nesting
  // deeper than any TF_CONFIG has (3 levels) is refused while parsing.
  constexpr int kMaxDepth = 16;
  const auto limit_depth = [&](int depth, nlohmann::json::parse_event_t, nlohmann::json&) {
    if (depth > kMaxDepth) {
      detail::reject_text(name, text,
                          "nested deeper than " + std::to_string(kMaxDepth) + " levels");
    }
    return true;
  };
  try {
    root = nlohmann::json::parse(text, limit_depth);
  } catch (const nlohmann::json::parse_error& error) {
    detail::reject_text(name, text, std::string("not valid JSON: ") + error.what());
  } catch (const nlohmann::json::exception& error) {
    // out_of_range: a number no double holds ("1e999"), wherever it is, ignored keys included.
    detail::reject_text(name, text, std::string("cannot be read: ") + error.what());
  }
  if (!root.is_object()) detail::reject_json(prefix, root, "expected a JSON object");

  const auto cluster = root.find("cluster");
  if (cluster == root.end()) {
    throw ConfigError(prefix + " cluster: missing (expected {\"worker\": [\"host:port\", ...]})");
  }
  if (!cluster->is_object())
    detail::reject_json(prefix + " cluster", *cluster, "expected an object");

  TfConfig config;
  for (const auto& [key, list] : cluster->items()) {
    const std::string path = prefix + " cluster." + key;
    const std::string_view type = detail::canonical_task_type(key);
    if (type.empty()) {
      detail::reject_json(path, list,
                          "unknown task type (expected chief, worker, ps or evaluator)");
    }
    if (!list.is_array()) detail::reject_json(path, list, "expected an array of \"host:port\"");
    auto& tasks = config.tasks_of(type);
    if (!tasks.empty()) {
      throw ConfigError(path + ": given twice (\"master\" is another name for \"chief\")");
    }
    for (std::size_t i = 0; i < list.size(); ++i) {
      const std::string entry_path = path + "[" + std::to_string(i) + "]";
      if (!list[i].is_string()) detail::reject_json(entry_path, list[i], "expected \"host:port\"");
      const auto& address = list[i].get_ref<const std::string&>();
      parse_host_port(entry_path, address);
      tasks.push_back(address);
    }
  }
  if (config.chief.size() > 1) {
    throw ConfigError(prefix + " cluster.chief: " + std::to_string(config.chief.size()) +
                      " tasks; there is at most one chief");
  }
  if (config.evaluator.size() > 1) {
    throw ConfigError(prefix + " cluster.evaluator: " + std::to_string(config.evaluator.size()) +
                      " tasks; there is at most one evaluator");
  }
  if (config.chief.empty() && config.worker.empty()) {
    throw ConfigError(prefix +
                      " cluster: no chief and no worker tasks; training needs at least one");
  }

  const auto task = root.find("task");
  if (task == root.end()) {
    throw ConfigError(prefix + " task: missing (expected {\"type\": \"worker\", \"index\": 0})");
  }
  if (!task->is_object()) detail::reject_json(prefix + " task", *task, "expected an object");
  const auto type = task->find("type");
  if (type == task->end()) throw ConfigError(prefix + " task.type: missing");
  if (!type->is_string()) detail::reject_json(prefix + " task.type", *type, "expected a string");
  config.task_type = detail::canonical_task_type(type->get_ref<const std::string&>());
  if (config.task_type.empty()) {
    detail::reject_json(prefix + " task.type", *type,
                        "unknown task type (expected chief, worker, ps or evaluator)");
  }
  const auto& tasks = config.tasks_of(config.task_type);
  const bool unlisted_evaluator = config.task_type == "evaluator" && tasks.empty();
  if (tasks.empty() && !unlisted_evaluator) {
    detail::reject_json(prefix + " task.type", *type,
                        "the cluster lists no " + config.task_type + " tasks");
  }
  const auto index = task->find("index");
  if (index != task->end()) {  // absent: 0, TensorFlow's default
    if (!index->is_number_integer()) {
      detail::reject_json(prefix + " task.index", *index, "expected an integer");
    }
    const long long value = index->get<long long>();
    const long long count = unlisted_evaluator ? 1 : static_cast<long long>(tasks.size());
    if (value < 0 || value >= count) {
      throw ConfigError(prefix + " task.index = " + std::to_string(value) + ": out of range for " +
                        std::to_string(count) + " " + config.task_type + " tasks");
    }
    config.task_index = static_cast<int>(value);
  }
  return config;
}

}  // namespace cohort::cluster
