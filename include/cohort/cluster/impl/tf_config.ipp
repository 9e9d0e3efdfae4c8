// Definitions for cohort/cluster/tf_config.hpp (core/compilation.hpp says where they compile).
#pragma once

#include "cohort/cluster/tf_config.hpp"

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "cohort/cluster/environment.hpp"
#include "cohort/core/error.hpp"

namespace cohort::cluster {

COHORT_DECL const std::vector<std::string>& TfConfig::tasks_of(std::string_view type) const {
  if (type == "chief") return chief;
  if (type == "ps") return ps;
  if (type == "evaluator") return evaluator;
  return worker;
}

namespace detail {

[[noreturn]] COHORT_DECL void reject_json(std::string_view path, const nlohmann::json& value,
                                          std::string_view requirement) {
  throw ConfigError(std::string(path) + " = " + value.dump() + ": " + std::string(requirement));
}

// "chief" for "master", the type itself if known, "" if unknown.
COHORT_DECL std::string_view canonical_task_type(std::string_view type) {
  if (type == "master") return "chief";
  if (type == "chief" || type == "worker" || type == "ps" || type == "evaluator") return type;
  return {};
}

}  // namespace detail

COHORT_DECL TfConfig parse_tf_config(std::string_view text, std::string_view name) {
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
