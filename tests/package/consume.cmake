# Configures, builds and runs tests/package/consumer in a fresh binary directory, reaching cohort
# one way. Run by ctest (tests/package/CMakeLists.txt):
#
#   cmake -D HOW=<find_package|build_tree|add_subdirectory|fetch_content>
#         [-D NEEDS=<tcp|one_process|cuda>]
#         -D SETTINGS=<consume_settings.cmake> -D CONFIG=<build type> -P consume.cmake
#
# NEEDS is what the consumer uses (consumer/CMakeLists.txt), tcp by default. one_process hides
# cohort::tcp's dependencies from the consumer's configure: CMAKE_DISABLE_FIND_PACKAGE_<name> makes
# every find_package of OpenSSL, nlohmann_json and xxHash fail in that project, cohort's included.
#
# Fails (exit code 1, with the failing step named) if any step fails: installing, configuring,
# building or running the consumer, whose checks include finding cohort where it was put.
cmake_minimum_required(VERSION 3.21)

if(NOT DEFINED NEEDS)
  set(NEEDS tcp)
endif()
set(name "${HOW}")
if(NOT NEEDS STREQUAL "tcp")
  string(APPEND name ".${NEEDS}")
endif()
include("${CMAKE_CURRENT_LIST_DIR}/script.cmake")
package_script(consume.cmake "${name}" HOW SETTINGS)

# The consumer is configured as the parent was: same generator, compiler and build type (compiled
# at -O1, below). Settings go through an initial cache file (cmake -C), so that lists and odd
# characters arrive intact.
set(configure_arguments -S "${CONSUMER_SOURCE_DIR}" -B "${work}/build" -G "${CMAKE_GENERATOR}"
                        -C "${work}/initial_cache.cmake")
if(CMAKE_GENERATOR_PLATFORM)
  list(APPEND configure_arguments -A "${CMAKE_GENERATOR_PLATFORM}")
endif()
if(CMAKE_GENERATOR_TOOLSET)
  list(APPEND configure_arguments -T "${CMAKE_GENERATOR_TOOLSET}")
endif()
set(initial_cache "")
function(cache variable value)
  string(APPEND initial_cache "set(${variable} [==[${value}]==] CACHE STRING \"\")\n")
  set(initial_cache "${initial_cache}" PARENT_SCOPE)
endfunction()
cache(COHORT_CONSUME "${HOW}")
cache(COHORT_CONSUMER_NEEDS "${NEEDS}")
if(NEEDS STREQUAL "one_process")
  foreach(package IN ITEMS OpenSSL nlohmann_json xxHash)
    cache(CMAKE_DISABLE_FIND_PACKAGE_${package} ON)
  endforeach()
endif()
# The consumer checks that cohort leaves CUDA off unless asked; that means most where nvcc is.
find_program(nvcc nvcc PATHS /usr/local/cuda/bin)
if(nvcc)
  message(STATUS "package.${name}: nvcc is on this machine (${nvcc})")
endif()
cache(CMAKE_CXX_COMPILER "${CMAKE_CXX_COMPILER}")
# Only what this test puts in place may be found, never a package registry entry.
cache(CMAKE_FIND_USE_PACKAGE_REGISTRY OFF)
cache(CMAKE_FIND_USE_SYSTEM_PACKAGE_REGISTRY OFF)
foreach(variable IN ITEMS CMAKE_MAKE_PROGRAM CMAKE_TOOLCHAIN_FILE Boost_DIR)
  if(${variable})
    cache(${variable} "${${variable}}")
  endif()
endforeach()
set(config_arguments "")
if(CONFIG)
  cache(CMAKE_BUILD_TYPE "${CONFIG}")
  set(config_arguments --config "${CONFIG}")
  # A consumer checks how cohort is reached, not what the optimizer makes of it: it compiles at
  # -O1, as the hand builds do (hand_built.cmake), in the build type's name. At -O3 the builds that
  # compile cohort::tcp's definitions spent 28.5 s on them alone, against 19.5 s at -O1.
  string(TOUPPER "${CONFIG}" config_upper)
  cache(CMAKE_CXX_FLAGS_${config_upper} "-O1")
endif()
set(prefix_path "${CMAKE_PREFIX_PATH}")

if(HOW STREQUAL "find_package")
  # The installed package, and nothing else of cohort: the prefix comes first on the search path
  # and the consumer checks that cohort_DIR lies inside it.
  set(prefix "${work}/prefix")
  step("cmake --install" "${CMAKE_COMMAND}" --install "${COHORT_BINARY_DIR}" --prefix "${prefix}"
       --component cohort_Development ${config_arguments})
  list(PREPEND prefix_path "${prefix}")
  cache(COHORT_EXPECTED_VERSION "${COHORT_VERSION}")
  cache(COHORT_EXPECTED_LOCATION "${prefix}")
elseif(HOW STREQUAL "build_tree")
  cache(cohort_DIR "${COHORT_BINARY_DIR}")
  cache(COHORT_EXPECTED_VERSION "${COHORT_VERSION}")
  cache(COHORT_EXPECTED_LOCATION "${COHORT_BINARY_DIR}")
elseif(HOW STREQUAL "add_subdirectory")
  cache(COHORT_SOURCE_DIR "${COHORT_SOURCE_DIR}")
elseif(HOW STREQUAL "fetch_content")
  # A git checkout is fetched as a user fetches a release: by cloning the repository (file://)
  # at a commit, here HEAD. That exercises what a clone contains; uncommitted changes are not in
  # it (package.add_subdirectory builds the working tree through the same add_subdirectory path).
  # Anything else (an unpacked tarball, a copy inside another repository) is used as SOURCE_DIR.
  set(git_commit "")
  find_program(GIT_EXECUTABLE git)
  if(GIT_EXECUTABLE)
    execute_process(COMMAND "${GIT_EXECUTABLE}" -C "${COHORT_SOURCE_DIR}" rev-parse --show-toplevel
                    OUTPUT_VARIABLE git_top OUTPUT_STRIP_TRAILING_WHITESPACE
                    RESULT_VARIABLE git_result ERROR_QUIET)
    if(git_result EQUAL 0)
      file(REAL_PATH "${git_top}" git_top)
      file(REAL_PATH "${COHORT_SOURCE_DIR}" source_real)
      if(git_top STREQUAL source_real)
        execute_process(COMMAND "${GIT_EXECUTABLE}" -C "${COHORT_SOURCE_DIR}" rev-parse HEAD
                        OUTPUT_VARIABLE git_commit OUTPUT_STRIP_TRAILING_WHITESPACE
                        RESULT_VARIABLE git_result ERROR_QUIET)
        if(NOT git_result EQUAL 0)
          set(git_commit "")  # a repository without commits yet
        endif()
      endif()
    endif()
  endif()
  if(git_commit)
    # --no-optional-locks: never write the source repository's index (others may be committing).
    execute_process(COMMAND "${GIT_EXECUTABLE}" --no-optional-locks -C "${COHORT_SOURCE_DIR}"
                            status --porcelain --untracked-files=no
                    OUTPUT_VARIABLE changes OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
    message(STATUS "package.${name}: cloning file://${source_real} at ${git_commit}")
    if(changes)
      message(STATUS "package.${name}: note: the working tree has uncommitted changes, "
                     "which this test does not see")
    endif()
    cache(COHORT_GIT_REPOSITORY "file://${source_real}")
    cache(COHORT_GIT_TAG "${git_commit}")
    cache(GIT_EXECUTABLE "${GIT_EXECUTABLE}")
  else()
    message(STATUS "package.${name}: not a git checkout's top level (or no git): "
                   "SOURCE_DIR ${COHORT_SOURCE_DIR}")
    cache(COHORT_SOURCE_DIR "${COHORT_SOURCE_DIR}")
  endif()
else()
  message(FATAL_ERROR "consume.cmake: unknown HOW=${HOW}")
endif()

if(prefix_path)
  cache(CMAKE_PREFIX_PATH "${prefix_path}")
endif()
file(WRITE "${work}/initial_cache.cmake" "${initial_cache}")

step("configuring the consumer" "${CMAKE_COMMAND}" ${configure_arguments})
step("building the consumer" "${CMAKE_COMMAND}" --build "${work}/build" ${config_arguments})
step("running the consumer" "${CMAKE_CTEST_COMMAND}" --test-dir "${work}/build" ${config_arguments}
     --output-on-failure --no-tests=error)
