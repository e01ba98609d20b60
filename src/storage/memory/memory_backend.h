// Internal: the `memory://` backend — pages in process memory with the semantics of the real
// stores (the same value format and checks, a byte capacity with LRU eviction), for tests.
//
//   memory://?capacity=1GiB        a store of this backend alone (default capacity 1 GiB)
//   memory://NAME?capacity=1GiB    a store shared, within the process, by every backend opened
//                                  with the same NAME while one of them is open (NAME: letters,
//                                  digits, '-', '_', '.'); a store outlives Close of one user
//
// Thread safety: the backend's hooks may run on several I/O threads at once (one mutex per store).
#pragma once

#include <memory>
#include <string_view>

#include "kvtier/storage.h"

namespace kvtier::storage {

Result<std::unique_ptr<StorageBackend>> OpenMemoryStorage(std::string_view url,
                                                          const StorageNamespace& ns,
                                                          const StorageOptions& options);

}  // namespace kvtier::storage
