# The file:// store (src/storage/file/). It is always built: the tools, the bench and many tests
# open file:// stores (a disk tier, the replay's stores, `kvtier bench --storage file://...`), and
# none of them skips without it yet, so the option exists only to say so.
# Optional dependency: liburing (io_uring reads and writes; without it plain pread/pwrite).
option(KVTIER_STORAGE_FILE "Build the file:// storage backend (must be ON: the tools and tests use it)" ON)
if(NOT KVTIER_STORAGE_FILE)
  message(FATAL_ERROR "KVTIER_STORAGE_FILE=OFF is not supported: the tools (kvtier bench, replay), "
                      "the benchmarks and the tests open file:// stores and do not skip without "
                      "the file backend. Configure with -DKVTIER_STORAGE_FILE=ON (the default).")
endif()
find_path(KVTIER_URING_INCLUDE liburing.h)
find_library(KVTIER_URING_LIB uring)
if(KVTIER_URING_INCLUDE AND KVTIER_URING_LIB)
  set(KVTIER_HAVE_URING ON)
  message(STATUS "kvtier: liburing found (io_uring file I/O)")
  kvtier_storage_backend(file DEFINITIONS KVTIER_HAVE_URING=1
                         INCLUDE_DIRS ${KVTIER_URING_INCLUDE} LIBRARIES ${KVTIER_URING_LIB})
else()
  set(KVTIER_HAVE_URING OFF)
  message(STATUS "kvtier: liburing not found; the file backend uses plain pread/pwrite")
  kvtier_storage_backend(file)
endif()
