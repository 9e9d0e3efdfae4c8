# Builds tests/package/consumer without CMake's targets, as the README's first code sample says a
# program is compiled by hand, and runs it. Run by ctest (tests/package/CMakeLists.txt):
#
#   cmake -D MODE=<header_only|separate> -D SETTINGS=<consume_settings.cmake> -P hand_built.cmake
#
# header_only: every file compiles the definitions it uses (the default). separate: every file is
# compiled with COHORT_SEPARATE_COMPILATION and one more file, the whole of which is
# `#include <cohort/src.hpp>`, compiles cohort's definitions once (core/compilation.hpp). Both
# link Boost.Serialization, zlib and libcrypto themselves, as a hand build does.
cmake_minimum_required(VERSION 3.21)

include("${CMAKE_CURRENT_LIST_DIR}/script.cmake")
package_script(hand_built.cmake "hand_built.${MODE}" MODE SETTINGS)

set(flags -std=c++20 -O1 -ffp-contract=off -fno-math-errno -pthread
          -I "${COHORT_SOURCE_DIR}/include" -DCOHORT_CONSUMER_TCP)
set(sources "${CONSUMER_SOURCE_DIR}/main.cpp" "${CONSUMER_SOURCE_DIR}/tcp.cpp")
if(MODE STREQUAL "separate")
  list(APPEND flags -DCOHORT_SEPARATE_COMPILATION)
  file(WRITE "${work}/cohort_compiled.cpp" "#include <cohort/src.hpp>\n")
  list(APPEND sources "${work}/cohort_compiled.cpp")
elseif(NOT MODE STREQUAL "header_only")
  message(FATAL_ERROR "hand_built.cmake: MODE is header_only or separate, not '${MODE}'")
endif()

set(objects "")
foreach(source IN LISTS sources)
  get_filename_component(stem "${source}" NAME_WE)
  step("compiling ${stem}" "${CMAKE_CXX_COMPILER}" ${flags} -c "${source}" -o "${stem}.o")
  list(APPEND objects "${stem}.o")
endforeach()
step("linking" "${CMAKE_CXX_COMPILER}" -pthread ${objects} -o consumer -lboost_serialization
     -lz -lcrypto)
step("running the consumer" "${work}/consumer")
