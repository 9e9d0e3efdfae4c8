# What cohort::cohort needs at use, found the same way here and in cohortConfig.cmake: threads and
# Boost (headers, plus Boost.Serialization for checkpoints). Test, benchmark and example
# dependencies are found in their own folders, and never by a consumer (docs/dependencies.md).
# GNUInstallDirs: CMAKE_INSTALL_INCLUDEDIR is needed by the target itself, before cohortInstall.
include(GNUInstallDirs)
find_package(Threads REQUIRED)
find_package(Boost 1.74 REQUIRED COMPONENTS serialization)
# cohort::tcp: libcrypto for the handshake's HMAC-SHA256 and nonces; nlohmann/json for TF_CONFIG
# (cluster/).
find_package(OpenSSL REQUIRED COMPONENTS Crypto)
find_package(nlohmann_json 3 REQUIRED)
# xxHash ships no CMake package on Debian: its header is all cohort::tcp uses (frame checksums).
find_path(COHORT_XXHASH_INCLUDE_DIR xxhash.h REQUIRED)

# cohort::cuda (docs/gpu.md): CUDA and NCCL are found, never assumed. check_language only probes
# for nvcc; the language is enabled, and the toolkit and NCCL required, only when
# COHORT_ENABLE_CUDA is ON (its default: nvcc, the toolkit and NCCL were all found), so a machine
# without them configures exactly as before.
include(CheckLanguage)
check_language(CUDA)
set(cohort_cuda_default OFF)
if(CMAKE_CUDA_COMPILER AND EXISTS "${CMAKE_CUDA_COMPILER}")
  find_package(CUDAToolkit QUIET)
  find_package(NCCL QUIET)
  if(CUDAToolkit_FOUND AND NCCL_FOUND)
    set(cohort_cuda_default ON)
  endif()
endif()
option(COHORT_ENABLE_CUDA "Build cohort::cuda, its tests and benchmarks (needs nvcc and NCCL)"
       ${cohort_cuda_default})
if(COHORT_ENABLE_CUDA)
  # sm_90 machine code for H100/H200 (no JIT at start-up there), plus compute_75 PTX, the oldest
  # CUDA 13 accepts, which the driver JIT-compiles on every other GPU (A100, L4, Blackwell). The
  # kernels are bandwidth-bound and use no architecture-specific feature, so the PTX loses little.
  if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
    set(CMAKE_CUDA_ARCHITECTURES 90-real 75-virtual)
  endif()
  enable_language(CUDA)
  find_package(CUDAToolkit REQUIRED)
  find_package(NCCL REQUIRED)
endif()
