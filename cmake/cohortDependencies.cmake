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
