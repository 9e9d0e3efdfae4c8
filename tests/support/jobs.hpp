// A job of several processes that a test expects to succeed: its output, once every check of how
// it ended has passed.
#pragma once

#include <doctest/doctest.h>

#include <filesystem>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "processes.hpp"

namespace cohort::testing {

// Runs `command` to completion, its output in `log`, 120 s at most: how it ended and its output. A
// test whose command still runs then stops there.
inline std::pair<Exit, std::string> completed(const std::vector<std::string>& command,
                                              const std::filesystem::path& log,
                                              const std::map<std::string, std::string>& env = {}) {
  auto result = run_to_completion(command, log, env);
  REQUIRE_MESSAGE(result.has_value(), "still running after 120 s: " << command[0]);
  return *result;
}

// Runs `command` (a launcher and its job) as completed does: the output, where it exited 0. A test
// that sees it otherwise stops there, with the output captured.
inline std::string output_of_success(const std::vector<std::string>& command,
                                     const std::filesystem::path& log) {
  const auto [exit, output] = completed(command, log);
  CAPTURE(output);
  REQUIRE(exit.exited);
  REQUIRE(exit.code == 0);
  return output;
}

}  // namespace cohort::testing
