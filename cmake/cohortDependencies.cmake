# What cohort's targets need at use, found here for cohort's own build and for a project that adds
# cohort with add_subdirectory or FetchContent; cohortConfig.cmake finds the same for an installed
# cohort (docs/dependencies.md):
#
#   cohort::cohort  threads, Boost (headers, plus Boost.Serialization for checkpoints) and zlib
#                   (checkpoints' CRC-32): always
#   cohort::tcp     OpenSSL's libcrypto, nlohmann_json and xxHash (cohortTcpDependencies.cmake):
#                   defined when they are found
#   cohort::cuda    the CUDA toolkit and NCCL: only with COHORT_ENABLE_CUDA
#
# Test, benchmark and example dependencies are found in their own folders, and never by a
# consumer.
# GNUInstallDirs: CMAKE_INSTALL_INCLUDEDIR is needed by the target itself, before cohortInstall.
include(GNUInstallDirs)
find_package(Threads REQUIRED)
find_package(Boost 1.74 REQUIRED COMPONENTS serialization)
find_package(ZLIB REQUIRED)

# cohort::tcp. cohort's own tests, benchmarks, examples and tools use it, so building any of them
# requires its dependencies; a project that only trains in one process may lack them, and then
# gets no cohort::tcp (a target that exists can be linked: `if(TARGET cohort::tcp)` is the test).
include(cohortTcpDependencies)
if(COHORT_BUILD_TESTS OR COHORT_BUILD_BENCHMARKS OR COHORT_BUILD_EXAMPLES OR COHORT_BUILD_TOOLS)
  cohort_find_tcp_dependencies(REQUIRED)
else()
  cohort_find_tcp_dependencies(QUIET)
  if(cohort_tcp_missing)
    list(JOIN cohort_tcp_missing ", " cohort_tcp_missing_text)
    message(STATUS "cohort: no cohort::tcp (training across processes), for want of "
                   "${cohort_tcp_missing_text}; cohort::cohort is complete without it")
  endif()
endif()

# cohort::cuda (docs/gpu.md): CUDA and NCCL are found, never assumed, and only asked for by the
# project that builds cohort itself. There COHORT_ENABLE_CUDA defaults to ON when nvcc, the
# toolkit and NCCL are all found. In a project that adds cohort as a subproject it defaults to
# OFF and nothing is probed: a consumer's build does not change because nvcc happens to be
# installed. That project opts in by setting COHORT_ENABLE_CUDA to ON (and enables CUDA itself
# for its own .cu files).
set(cohort_cuda_default OFF)
if(PROJECT_IS_TOP_LEVEL AND NOT DEFINED COHORT_ENABLE_CUDA)
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER AND EXISTS "${CMAKE_CUDA_COMPILER}")
    find_package(CUDAToolkit QUIET)
    find_package(NCCL QUIET)
    if(CUDAToolkit_FOUND AND NCCL_FOUND)
      set(cohort_cuda_default ON)
    endif()
  endif()
endif()
option(COHORT_ENABLE_CUDA "Define cohort::cuda; build its tests and benchmarks (needs nvcc and NCCL)"
       ${cohort_cuda_default})
if(COHORT_ENABLE_CUDA)
  # cohort's own CUDA sources (tests, benchmarks, examples, tools) need the language, enabled
  # before the toolkit is found so that both agree on nvcc; cohort::cuda itself is an interface
  # target and does not.
  if(COHORT_BUILD_TESTS OR COHORT_BUILD_BENCHMARKS OR COHORT_BUILD_EXAMPLES OR COHORT_BUILD_TOOLS)
    # sm_90 machine code for H100/H200 (no JIT at start-up there), plus compute_75 PTX, the oldest
    # CUDA 13 accepts, which the driver JIT-compiles on every other GPU (A100, L4, Blackwell). The
    # kernels are bandwidth-bound and use no architecture-specific feature, so the PTX loses little.
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      set(CMAKE_CUDA_ARCHITECTURES 90-real 75-virtual)
    endif()
    enable_language(CUDA)
  endif()
  find_package(CUDAToolkit REQUIRED)
  find_package(NCCL REQUIRED)
endif()
