# The memory:// store (src/storage/memory/): pages in this process's memory; no dependency.
# The tests open memory:// stores throughout (cache, pool, events, tools, Python), so a build
# with the tests needs it; a build without it is the library and the tools (memory:// then says
# which option left it out).
option(KVTIER_STORAGE_MEMORY "Build the memory:// storage backend" ON)
if(KVTIER_STORAGE_MEMORY)
  kvtier_storage_backend(memory)
elseif(KVTIER_BUILD_TESTS)
  message(FATAL_ERROR "KVTIER_STORAGE_MEMORY=OFF needs -DKVTIER_BUILD_TESTS=OFF: the tests (C++, "
                      "the tools' and Python's) open memory:// stores throughout and do not skip "
                      "without the memory backend")
else()
  kvtier_storage_backend_left_out(memory "KVTIER_STORAGE_MEMORY=OFF")
endif()
