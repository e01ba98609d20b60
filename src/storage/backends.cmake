# The storage backends: one folder each under src/storage/ (file/, redis/, memory/), each with a
# backend.cmake that declares its option (KVTIER_STORAGE_<NAME>), finds its dependency and, when
# the backend is built, calls kvtier_storage_backend(). Included by the top-level CMakeLists.txt
# with the other dependencies, so the variables a backend.cmake sets (KVTIER_HAVE_HIREDIS,
# KVTIER_HIREDIS_LIB, ...) are seen by src/, tests/, tools/ and the fuzz targets alike.
#
# What the build does with the list (src/CMakeLists.txt, tests/CMakeLists.txt):
#   - kvtier_storage compiles a backend's folder only when the backend is built, with its include
#     directories and, PRIVATE, its definitions and KVTIER_HAVE_<NAME>_BACKEND=1 (which
#     storage_schemes.cc reads: a backend left out keeps its scheme rows, with no open function
#     and a line naming the option); kvtier links its libraries.
#   - kvtier_testing and the tests get the same definitions (they read which backends this build
#     has); a test file that includes a left-out backend's headers ("storage/<name>/...") is not
#     built, and ctest shows it as skipped: `<test>.<name>_backend_left_out` (a failure under
#     CI=true where the backend was left out for want of a dependency CI installs).

set(KVTIER_STORAGE_BACKENDS)          # the backends this build has, by folder name
set(KVTIER_STORAGE_BACKENDS_ALL)      # every backend folder
set(KVTIER_STORAGE_BACKEND_DEFINITIONS)  # the definitions of the backends built (all of them)

# kvtier_storage_backend(<folder> [DEFINITIONS defs...] [INCLUDE_DIRS dirs...]
#                        [LIBRARIES libs...]): backend <folder> is built.
macro(kvtier_storage_backend name)
  cmake_parse_arguments(KVTIER_SB "" "" "DEFINITIONS;INCLUDE_DIRS;LIBRARIES" ${ARGN})
  string(TOUPPER ${name} KVTIER_SB_UPPER)
  list(APPEND KVTIER_STORAGE_BACKENDS ${name})
  list(APPEND KVTIER_STORAGE_BACKEND_DEFINITIONS KVTIER_HAVE_${KVTIER_SB_UPPER}_BACKEND=1
       ${KVTIER_SB_DEFINITIONS})
  set(KVTIER_STORAGE_BACKEND_${name}_INCLUDE_DIRS ${KVTIER_SB_INCLUDE_DIRS})
  set(KVTIER_STORAGE_BACKEND_${name}_LIBRARIES ${KVTIER_SB_LIBRARIES})
endmacro()

# kvtier_storage_backend_left_out(<folder> <why> [DEPENDENCY_MISSING]): backend <folder> is not
# built; <why> is the configure line. DEPENDENCY_MISSING: left out because its dependency (listed
# in deps/debian-packages.txt) was not found, so its tests fail under CI=true instead of skipping.
macro(kvtier_storage_backend_left_out name why)
  cmake_parse_arguments(KVTIER_SB "DEPENDENCY_MISSING" "" "" ${ARGN})
  set(KVTIER_STORAGE_BACKEND_${name}_DEPENDENCY_MISSING ${KVTIER_SB_DEPENDENCY_MISSING})
  message(STATUS "kvtier: storage backend ${name}: left out (${why})")
endmacro()

file(GLOB KVTIER_STORAGE_BACKEND_FILES ${CMAKE_CURRENT_LIST_DIR}/*/backend.cmake)
foreach(KVTIER_SB_FILE IN LISTS KVTIER_STORAGE_BACKEND_FILES)
  get_filename_component(KVTIER_SB_DIR ${KVTIER_SB_FILE} DIRECTORY)
  get_filename_component(KVTIER_SB_NAME ${KVTIER_SB_DIR} NAME)
  list(APPEND KVTIER_STORAGE_BACKENDS_ALL ${KVTIER_SB_NAME})
  include(${KVTIER_SB_FILE})
endforeach()
message(STATUS "kvtier: storage backends built: ${KVTIER_STORAGE_BACKENDS}")
