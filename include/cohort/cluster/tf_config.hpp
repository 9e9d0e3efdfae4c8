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

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "cohort/cluster/environment.hpp"
#include "cohort/core/compilation.hpp"
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
  COHORT_DECL const std::vector<std::string>& tasks_of(std::string_view type) const;
  std::vector<std::string>& tasks_of(std::string_view type) {
    return const_cast<std::vector<std::string>&>(std::as_const(*this).tasks_of(type));
  }
};

// `name` is where the text came from ("TF_CONFIG"), for the messages.
COHORT_DECL TfConfig parse_tf_config(std::string_view text, std::string_view name = "TF_CONFIG");

}  // namespace cohort::cluster

#if !defined(COHORT_SEPARATE_COMPILATION)
#include "cohort/cluster/impl/tf_config.ipp"
#endif
