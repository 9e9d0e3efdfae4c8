# What cohort::cohort needs, found the same way in the source tree and in cohortConfig.cmake.
include(CMakeFindDependencyMacro)
include(GNUInstallDirs)
find_package(Threads REQUIRED)
find_package(Boost 1.74 REQUIRED COMPONENTS serialization)
