# What cohort::tcp needs at use, found the same way by cohort's own build
# (cmake/cohortDependencies.cmake) and by the installed cohortConfig.cmake, beside which this file
# and FindxxHash.cmake are installed:
#
#   OpenSSL's libcrypto  the handshake's HMAC-SHA256 and nonces (transport/tcp/handshake.hpp)
#   nlohmann_json 3      TF_CONFIG (cluster/tf_config.hpp)
#   xxHash               frame checksums, header-only (transport/tcp/frame.hpp; FindxxHash.cmake)
#
# Boost's headers (Asio) and threads come with cohort::cohort. A program that trains in one
# process needs none of the three, so they are looked for only for cohort::tcp
# (docs/dependencies.md).
#
# cohort_find_tcp_dependencies(<REQUIRED|QUIET>)
#   Finds the three (REQUIRED: each missing one is a configure error naming it) and sets
#   cohort_tcp_missing to the names of those not found, empty when every one was. A macro, as
#   find_dependency is: the packages' variables stay visible to the caller.
set(_cohort_tcp_dependencies_dir "${CMAKE_CURRENT_LIST_DIR}")

macro(cohort_find_tcp_dependencies mode)
  list(PREPEND CMAKE_MODULE_PATH "${_cohort_tcp_dependencies_dir}")  # FindxxHash.cmake
  find_package(OpenSSL ${mode} COMPONENTS Crypto)
  find_package(nlohmann_json 3 ${mode})
  find_package(xxHash ${mode})
  list(REMOVE_AT CMAKE_MODULE_PATH 0)
  set(cohort_tcp_missing "")
  if(NOT TARGET OpenSSL::Crypto)
    list(APPEND cohort_tcp_missing "OpenSSL (libcrypto)")
  endif()
  if(NOT TARGET nlohmann_json::nlohmann_json)
    list(APPEND cohort_tcp_missing "nlohmann_json 3")
  endif()
  if(NOT TARGET xxHash::xxhash)
    list(APPEND cohort_tcp_missing "xxHash (xxhash.h)")
  endif()
endmacro()
