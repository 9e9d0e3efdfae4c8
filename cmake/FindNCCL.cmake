# FindNCCL: the NVIDIA Collective Communications Library, for cohort::cuda.
#
# Looks in NCCL_ROOT (variable or environment) first, then next to the CUDA toolkit
# (CUDAToolkit_LIBRARY_ROOT / CUDAToolkit_INCLUDE_DIRS, when find_package(CUDAToolkit) ran before),
# then in the system paths.
#
#   NCCL_FOUND          true when nccl.h and libnccl were both found
#   NCCL_INCLUDE_DIR    the directory holding nccl.h
#   NCCL_LIBRARY        libnccl (shared; set NCCL_USE_STATIC=ON for libnccl_static)
#   NCCL_VERSION        major.minor.patch, read from nccl.h
#   NCCL::NCCL          imported target carrying both
include(FindPackageHandleStandardArgs)

set(_nccl_hints "")
foreach(_root IN ITEMS "${NCCL_ROOT}" "$ENV{NCCL_ROOT}" "${CUDAToolkit_LIBRARY_ROOT}"
                      "${CUDAToolkit_TARGET_DIR}")
  if(_root)
    list(APPEND _nccl_hints "${_root}")
  endif()
endforeach()

find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${_nccl_hints} ${CUDAToolkit_INCLUDE_DIRS}
          PATH_SUFFIXES include)
if(NCCL_USE_STATIC)
  set(_nccl_names nccl_static)
else()
  # libnccl.so.2 alone is what NCCL's Python package (nvidia-nccl-cu*) ships: no unversioned link.
  set(_nccl_names nccl libnccl.so.2)
endif()
find_library(NCCL_LIBRARY NAMES ${_nccl_names} HINTS ${_nccl_hints} ${CUDAToolkit_LIBRARY_DIR}
             PATH_SUFFIXES lib lib64 lib/x86_64-linux-gnu)

if(NCCL_INCLUDE_DIR AND EXISTS "${NCCL_INCLUDE_DIR}/nccl.h")
  file(STRINGS "${NCCL_INCLUDE_DIR}/nccl.h" _nccl_version_lines
       REGEX "^#define NCCL_(MAJOR|MINOR|PATCH)[ \t]+[0-9]+")
  foreach(_part MAJOR MINOR PATCH)
    string(REGEX MATCH "NCCL_${_part}[ \t]+([0-9]+)" _match "${_nccl_version_lines}")
    set(_nccl_${_part} "${CMAKE_MATCH_1}")
  endforeach()
  if(NOT _nccl_MAJOR STREQUAL "")
    set(NCCL_VERSION "${_nccl_MAJOR}.${_nccl_MINOR}.${_nccl_PATCH}")
  endif()
endif()

find_package_handle_standard_args(NCCL REQUIRED_VARS NCCL_LIBRARY NCCL_INCLUDE_DIR
                                  VERSION_VAR NCCL_VERSION)
mark_as_advanced(NCCL_INCLUDE_DIR NCCL_LIBRARY)

if(NCCL_FOUND AND NOT TARGET NCCL::NCCL)
  add_library(NCCL::NCCL UNKNOWN IMPORTED)
  set_target_properties(NCCL::NCCL PROPERTIES IMPORTED_LOCATION "${NCCL_LIBRARY}"
                                              INTERFACE_INCLUDE_DIRECTORIES "${NCCL_INCLUDE_DIR}")
endif()
unset(_nccl_hints)
unset(_nccl_names)
