# FindxxHash: xxHash's header, for cohort::tcp's frame checksums (XXH3-64, header-only through
# XXH_INLINE_ALL: nothing to link). Debian's libxxhash-dev ships no CMake package, hence this
# module. Where the target already exists (a project found xxHash's own package), it is kept.
#
# Looks in xxHash_ROOT (variable or environment), then in the system paths.
#
#   xxHash_FOUND         true when xxhash.h was found
#   xxHash_INCLUDE_DIR   the directory holding xxhash.h
#   xxHash_VERSION       major.minor.patch, read from xxhash.h
#   xxHash::xxhash       imported target carrying the include directory
include(FindPackageHandleStandardArgs)

find_path(xxHash_INCLUDE_DIR xxhash.h)
if(xxHash_INCLUDE_DIR AND EXISTS "${xxHash_INCLUDE_DIR}/xxhash.h")
  file(STRINGS "${xxHash_INCLUDE_DIR}/xxhash.h" _xxhash_version_lines
       REGEX "^#define XXH_VERSION_(MAJOR|MINOR|RELEASE)[ \t]+[0-9]+")
  foreach(_part MAJOR MINOR RELEASE)
    string(REGEX MATCH "XXH_VERSION_${_part}[ \t]+([0-9]+)" _match "${_xxhash_version_lines}")
    set(_xxhash_${_part} "${CMAKE_MATCH_1}")
  endforeach()
  if(NOT _xxhash_MAJOR STREQUAL "")
    set(xxHash_VERSION "${_xxhash_MAJOR}.${_xxhash_MINOR}.${_xxhash_RELEASE}")
  endif()
endif()

find_package_handle_standard_args(xxHash REQUIRED_VARS xxHash_INCLUDE_DIR VERSION_VAR xxHash_VERSION)
mark_as_advanced(xxHash_INCLUDE_DIR)

if(xxHash_FOUND AND NOT TARGET xxHash::xxhash)
  add_library(xxHash::xxhash INTERFACE IMPORTED)
  set_target_properties(xxHash::xxhash PROPERTIES INTERFACE_INCLUDE_DIRECTORIES
                                                  "${xxHash_INCLUDE_DIR}")
endif()
unset(_xxhash_version_lines)
