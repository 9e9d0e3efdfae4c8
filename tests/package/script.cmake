# What the scripts of tests/package share (consume.cmake, hand_built.cmake), included first:
#
#   package_script(<script> <test name> <variable>...)
#     each <variable> must have been given (-D <variable>=...); reads SETTINGS (the file
#     tests/package/CMakeLists.txt writes), and sets `work` to a fresh directory for the test
#     package.<test name> under WORK_DIR.
#   step(<what> <command...>)
#     runs the command in `work`, its output going to the test's log, and stops with the test and
#     <what> named if it fails.
macro(package_script script test)
  foreach(argument IN ITEMS ${ARGN})
    if(NOT DEFINED ${argument})
      message(FATAL_ERROR "${script}: -D ${argument}=... is required")
    endif()
  endforeach()
  include("${SETTINGS}")
  set(package_test "${test}")
  set(work "${WORK_DIR}/${test}")
  file(REMOVE_RECURSE "${work}")
  file(MAKE_DIRECTORY "${work}")
endmacro()

function(step what)
  execute_process(COMMAND ${ARGN} WORKING_DIRECTORY "${work}" RESULT_VARIABLE result
                  COMMAND_ECHO STDOUT)
  if(NOT result EQUAL 0)
    message(FATAL_ERROR "package.${package_test}: ${what} failed (${result})")
  endif()
endfunction()
