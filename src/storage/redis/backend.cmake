# The redis:// and redis+cluster:// store (src/storage/redis/): needs hiredis
# (libhiredis-dev, deps/debian-packages.txt). KVTIER_HAVE_HIREDIS (the CMake variable and the
# definition) means this build has the backend: tools/baselines, the fuzz targets and the tests
# read it.
set(KVTIER_STORAGE_REDIS "AUTO" CACHE STRING
    "Build the redis storage backend: AUTO (when hiredis is found), ON (fail without hiredis), OFF")
set_property(CACHE KVTIER_STORAGE_REDIS PROPERTY STRINGS AUTO ON OFF)
set(KVTIER_HAVE_HIREDIS OFF)
if(KVTIER_STORAGE_REDIS STREQUAL "OFF")
  kvtier_storage_backend_left_out(redis "KVTIER_STORAGE_REDIS=OFF")
elseif(KVTIER_STORAGE_REDIS STREQUAL "ON" OR KVTIER_STORAGE_REDIS STREQUAL "AUTO")
  find_path(KVTIER_HIREDIS_INCLUDE hiredis/hiredis.h)
  find_library(KVTIER_HIREDIS_LIB hiredis)
  if(KVTIER_HIREDIS_INCLUDE AND KVTIER_HIREDIS_LIB)
    set(KVTIER_HAVE_HIREDIS ON)
    message(STATUS "kvtier: hiredis found (redis storage backend)")
    kvtier_storage_backend(redis DEFINITIONS KVTIER_HAVE_HIREDIS=1
                           INCLUDE_DIRS ${KVTIER_HIREDIS_INCLUDE} LIBRARIES ${KVTIER_HIREDIS_LIB})
  elseif(KVTIER_STORAGE_REDIS STREQUAL "ON")
    message(FATAL_ERROR "KVTIER_STORAGE_REDIS=ON but hiredis was not found: apt-get install "
                        "libhiredis-dev (deps/debian-packages.txt), or configure with "
                        "-DKVTIER_STORAGE_REDIS=AUTO or OFF")
  else()
    kvtier_storage_backend_left_out(redis "hiredis not found: apt-get install libhiredis-dev"
                                    DEPENDENCY_MISSING)
  endif()
else()
  message(FATAL_ERROR "KVTIER_STORAGE_REDIS must be AUTO, ON or OFF (it is '${KVTIER_STORAGE_REDIS}')")
endif()
