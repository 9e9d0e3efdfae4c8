// A job of several processes that a test expects to succeed: its output, once every check of how
// it ended has passed.
#pragma once

#include <doctest/doctest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "processes.hpp"

namespace cohort::testing {

// Runs `command` (a launcher and its job) to completion, its output in `log`, 120 s at most; the
// output, where it exited 0. A test that sees it otherwise stops there, with the output captured.
inline std::string output_of_success(const std::vector<std::string>& command,
                                     const std::filesystem::path& log) {
  const auto result = run_to_completion(command, log);
  REQUIRE_MESSAGE(result.has_value(), "still running after 120 s: " << command[0]);
  const auto& [exit, output] = *result;
  CAPTURE(output);
  REQUIRE(exit.exited);
  REQUIRE(exit.code == 0);
  return output;
}

}  // namespace cohort::testing
