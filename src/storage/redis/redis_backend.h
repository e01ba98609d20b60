// Internal: the `redis://` and `redis+cluster://` backends (hiredis for the protocol, cluster
// routing in kvtier). OpenStorage calls this for both schemes when the build has the redis
// backend (KVTIER_HAVE_REDIS_BACKEND, defined by src/CMakeLists.txt when redis_backend.cc and
// hiredis are both there).
//
// Thread safety: as StorageBackend.
#pragma once

#include <memory>
#include <string_view>

#include "kvtier/storage.h"

namespace kvtier::storage {

// `url` is "redis://[user:password@]host:port[?...]" or
// "redis+cluster://host:port[,host:port...][?...]"; errors as OpenStorage documents.
Result<std::unique_ptr<StorageBackend>> OpenRedisStorage(std::string_view url,
                                                         const StorageNamespace& ns,
                                                         const StorageOptions& options);

}  // namespace kvtier::storage
