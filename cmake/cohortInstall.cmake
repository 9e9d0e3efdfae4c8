# Install and export rules for cohort::cohort.
#
#   cmake --install <build> --prefix <prefix>   headers, cohortTargets.cmake, cohortConfig.cmake
#   find_package(cohort CONFIG) in a consumer   finds <prefix>/share/cmake/cohort
#   -Dcohort_DIR=<build>                        uses a build tree directly, through export()
#
# Every rule is in the component cohort_Development, so the package can be installed alone
# (tests/package does) whatever else the build installs. The package is header-only and
# architecture independent, hence share/ rather than lib/<arch>/.
include(CMakePackageConfigHelpers)

set(COHORT_INSTALL_CMAKEDIR "${CMAKE_INSTALL_DATADIR}/cmake/cohort"
    CACHE STRING "Where cohortConfig.cmake is installed, relative to the prefix")
mark_as_advanced(COHORT_INSTALL_CMAKEDIR)

install(TARGETS cohort cohort_tcp EXPORT cohortTargets COMPONENT cohort_Development)
# cohort::cuda only when it was built; its config then finds CUDAToolkit and NCCL (with the
# FindNCCL.cmake installed beside it), and COHORT_CUDA tells cohortConfig.cmake to do so.
set(COHORT_CUDA "${COHORT_ENABLE_CUDA}")
if(COHORT_ENABLE_CUDA)
  install(TARGETS cohort_cuda EXPORT cohortTargets COMPONENT cohort_Development)
  install(FILES "${PROJECT_SOURCE_DIR}/cmake/FindNCCL.cmake" DESTINATION "${COHORT_INSTALL_CMAKEDIR}"
          COMPONENT cohort_Development)
  file(COPY "${PROJECT_SOURCE_DIR}/cmake/FindNCCL.cmake" DESTINATION "${PROJECT_BINARY_DIR}")
endif()
install(DIRECTORY "${PROJECT_SOURCE_DIR}/include/cohort" TYPE INCLUDE
        COMPONENT cohort_Development)
install(EXPORT cohortTargets NAMESPACE cohort:: DESTINATION "${COHORT_INSTALL_CMAKEDIR}"
        COMPONENT cohort_Development)
export(EXPORT cohortTargets NAMESPACE cohort:: FILE "${PROJECT_BINARY_DIR}/cohortTargets.cmake")

configure_package_config_file("${CMAKE_CURRENT_LIST_DIR}/cohortConfig.cmake.in"
                              "${PROJECT_BINARY_DIR}/cohortConfig.cmake"
                              INSTALL_DESTINATION "${COHORT_INSTALL_CMAKEDIR}")
write_basic_package_version_file("${PROJECT_BINARY_DIR}/cohortConfigVersion.cmake"
                                 COMPATIBILITY SameMajorVersion ARCH_INDEPENDENT)
install(FILES "${PROJECT_BINARY_DIR}/cohortConfig.cmake"
              "${PROJECT_BINARY_DIR}/cohortConfigVersion.cmake"
        DESTINATION "${COHORT_INSTALL_CMAKEDIR}" COMPONENT cohort_Development)
