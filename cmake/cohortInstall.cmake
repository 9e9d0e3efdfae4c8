include(CMakePackageConfigHelpers)

install(TARGETS cohort EXPORT cohortTargets)
install(DIRECTORY include/cohort TYPE INCLUDE)
install(EXPORT cohortTargets NAMESPACE cohort:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/cohort)
export(EXPORT cohortTargets NAMESPACE cohort::
       FILE ${PROJECT_BINARY_DIR}/cohortTargets.cmake)

configure_package_config_file(cmake/cohortConfig.cmake.in
  ${PROJECT_BINARY_DIR}/cohortConfig.cmake
  INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/cohort)
write_basic_package_version_file(${PROJECT_BINARY_DIR}/cohortConfigVersion.cmake
  COMPATIBILITY SameMajorVersion ARCH_INDEPENDENT)
install(FILES ${PROJECT_BINARY_DIR}/cohortConfig.cmake ${PROJECT_BINARY_DIR}/cohortConfigVersion.cmake
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/cohort)
