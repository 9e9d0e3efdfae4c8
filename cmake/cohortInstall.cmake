# Install and export rules for cohort::cohort, cohort::tcp and cohort::cuda.
#
#   cmake --install <build> --prefix <prefix>   headers, cohortConfig.cmake and its files
#   find_package(cohort CONFIG) in a consumer   finds <prefix>/lib/cmake/cohort
#   -Dcohort_DIR=<build>                        uses a build tree directly, through export()
#
# One export file per target, so that cohortConfig.cmake loads each only where its dependencies
# are found: cohortTargets.cmake (cohort::cohort), cohortTcpTargets.cmake (cohort::tcp, where this
# build has it: its dependencies were found) and cohortCudaTargets.cmake (cohort::cuda, only when
# this build has it, COHORT_ENABLE_CUDA).
#
# Every rule is in the component cohort_Development, so the package can be installed alone
# (tests/package does) whatever else the build installs. cohort::tcp is a static library built
# for this machine, hence lib/ and a version file that checks the architecture.
include(CMakePackageConfigHelpers)

set(COHORT_INSTALL_CMAKEDIR "${CMAKE_INSTALL_LIBDIR}/cmake/cohort"
    CACHE STRING "Where cohortConfig.cmake is installed, relative to the prefix")
mark_as_advanced(COHORT_INSTALL_CMAKEDIR)

# The files cohortConfig.cmake includes from beside itself, in the build tree as in the prefix.
set(cohort_config_modules "${PROJECT_SOURCE_DIR}/cmake/cohortTcpDependencies.cmake"
                          "${PROJECT_SOURCE_DIR}/cmake/FindxxHash.cmake")

# cohort_export(<file> <target>): <target> in <file>.cmake, installed and in the build tree.
function(cohort_export file target)
  install(TARGETS ${target} EXPORT ${file} COMPONENT cohort_Development)
  install(EXPORT ${file} NAMESPACE cohort:: DESTINATION "${COHORT_INSTALL_CMAKEDIR}"
          COMPONENT cohort_Development)
  export(EXPORT ${file} NAMESPACE cohort:: FILE "${PROJECT_BINARY_DIR}/${file}.cmake")
endfunction()

cohort_export(cohortTargets cohort)
# COHORT_TCP tells cohortConfig.cmake whether cohort::tcp was built, to be looked for.
set(COHORT_TCP OFF)
if(TARGET cohort_tcp)
  set(COHORT_TCP ON)
  cohort_export(cohortTcpTargets cohort_tcp)
endif()
# COHORT_CUDA tells cohortConfig.cmake whether cohort::cuda is there to be asked for.
set(COHORT_CUDA "${COHORT_ENABLE_CUDA}")
if(COHORT_ENABLE_CUDA)
  cohort_export(cohortCudaTargets cohort_cuda)
  list(APPEND cohort_config_modules "${PROJECT_SOURCE_DIR}/cmake/FindNCCL.cmake")
endif()
install(FILES ${cohort_config_modules} DESTINATION "${COHORT_INSTALL_CMAKEDIR}"
        COMPONENT cohort_Development)
file(COPY ${cohort_config_modules} DESTINATION "${PROJECT_BINARY_DIR}")
install(DIRECTORY "${PROJECT_SOURCE_DIR}/include/cohort" TYPE INCLUDE
        COMPONENT cohort_Development)

configure_package_config_file("${CMAKE_CURRENT_LIST_DIR}/cohortConfig.cmake.in"
                              "${PROJECT_BINARY_DIR}/cohortConfig.cmake"
                              INSTALL_DESTINATION "${COHORT_INSTALL_CMAKEDIR}")
write_basic_package_version_file("${PROJECT_BINARY_DIR}/cohortConfigVersion.cmake"
                                 COMPATIBILITY SameMajorVersion)
install(FILES "${PROJECT_BINARY_DIR}/cohortConfig.cmake"
              "${PROJECT_BINARY_DIR}/cohortConfigVersion.cmake"
        DESTINATION "${COHORT_INSTALL_CMAKEDIR}" COMPONENT cohort_Development)
