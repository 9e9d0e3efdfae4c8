# Builds one compile-fail target and succeeds only if the build fails with output matching the
# expectation. Run by the tests that cohort_compile_fail_test (tests/core/CMakeLists.txt) makes:
#
#   cmake -D SPEC=<compile_fail_<name>.cmake> -D CONFIG=<build type> -P expect_compile_failure.cmake
#
# SPEC sets BUILD_DIR (the build tree), TARGET (the object library) and EXPECTED (a regex).
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
message(STATUS "${TARGET} fails to compile, as it must, with output matching '${EXPECTED}'")
