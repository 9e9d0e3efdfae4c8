# cmake -DCOMPILER=... -DINCLUDE=<include dir> -DWORK=<dir> -P one_process_includes.cmake
#
# A program that trains in one process (cohort/cohort.hpp) parses no part of the multi-process
# strategies: the headers its compiler reads, listed by -MM, name none of them. Each such header
# costs every one-process program its parse time and memory.
file(WRITE "${WORK}/one_process.cpp" "#include \"cohort/cohort.hpp\"\n")
execute_process(
  COMMAND "${COMPILER}" -std=c++20 -I "${INCLUDE}" -MM "${WORK}/one_process.cpp"
  OUTPUT_VARIABLE headers ERROR_VARIABLE errors RESULT_VARIABLE result)
if(NOT result EQUAL 0)
  message(FATAL_ERROR "listing the headers of cohort/cohort.hpp failed: ${errors}")
endif()
set(multi_process_parts
    "cohort/collective/communication_thread\\.hpp" "cohort/collective/deterministic\\.hpp"
    "cohort/collective/hierarchical\\.hpp" "cohort/collective/ring\\.hpp" "cohort/transport/"
    "cohort/cluster/cluster\\.hpp" "cohort/strategy/multi_worker" "cohort/strategy/parameter_server"
    "boost/asio")
foreach(part IN LISTS multi_process_parts)
  if(headers MATCHES "${part}[^ \\\\\n]*")
    message(FATAL_ERROR "cohort/cohort.hpp, a one-process program's header, parses "
                        "${CMAKE_MATCH_0}, a part of the multi-process strategies")
  endif()
endforeach()
message(STATUS "cohort/cohort.hpp parses no part of the multi-process strategies")
