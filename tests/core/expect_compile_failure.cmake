# Builds one compile-fail target and succeeds only if the build fails with output matching the
# expectation. Run by the tests that cohort_compile_fail_test (tests/core/CMakeLists.txt) makes:
#
#   cmake -D SPEC=<compile_fail_<name>.cmake> -D CONFIG=<build type> -P expect_compile_failure.cmake
#
# SPEC sets BUILD_DIR (the build tree), TARGET (the object library), EXPECTED (a regex) and
# ERRORS (how many times the output may say "error:"; empty: any number).
cmake_minimum_required(VERSION 3.21)
include("${SPEC}")

set(config_arguments "")
if(CONFIG)
  set(config_arguments --config "${CONFIG}")
endif()
execute_process(COMMAND "${CMAKE_COMMAND}" --build "${BUILD_DIR}" --target "${TARGET}"
                        ${config_arguments}
                RESULT_VARIABLE result OUTPUT_VARIABLE output ERROR_VARIABLE output)

if(result EQUAL 0)
  message(FATAL_ERROR "${TARGET} compiled, but it must not: the misuse it shows is accepted.\n"
                      "${output}")
endif()
if(NOT output MATCHES "${EXPECTED}")
  message(FATAL_ERROR "${TARGET} failed to compile, but its output does not match "
                      "'${EXPECTED}': it failed for another reason.\n${output}")
endif()
if(NOT ERRORS STREQUAL "")
  # Counted as occurrences, not lines: compiler messages may hold semicolons, CMake's list mark.
  string(REGEX MATCHALL "error:" errors "${output}")
  list(LENGTH errors count)
  if(NOT count EQUAL ERRORS)
    message(FATAL_ERROR "${TARGET} failed to compile with ${count} errors where ${ERRORS} belong: "
                        "the sentence must be all the user reads.\n${output}")
  endif()
endif()
message(STATUS "${TARGET} fails to compile, as it must, with output matching '${EXPECTED}'")
