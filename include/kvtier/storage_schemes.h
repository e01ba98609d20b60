// kvtier/storage_schemes.h — the storage URL schemes kvtier knows, one row each.
//
// Whatever depends on a URL's scheme reads the scheme's row instead of comparing names:
// OpenStorage (the backend that opens it), RedactUrl (where the URL's credentials end), the KV
// events' medium (StorageMediumOf, kv_events.h) and the platform baseline the tools measure a
// store against (`kvtier bench --storage`, the replay's storage read ceiling) and the bytes a page
// takes beyond its payload (the replay's storage oracle). The table is
// src/storage/storage_schemes.cc: a new backend is one row there (docs/architecture.md, "How to
// extend"). The shared host tier's `shm://` store is opened from its pool
// (OpenSharedHostStorage, shared_host_pool.h), never by URL, so it has no row.
//
// Thread safety: the table is immutable.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "kvtier/storage.h"

namespace kvtier {

// The medium of a store's pages in KV events (vLLM's names where vLLM has one).
inline constexpr std::string_view kMediumDisk = "DISK";
inline constexpr std::string_view kMediumRedis = "REDIS";
inline constexpr std::string_view kMediumMemory = "MEMORY";

// How the part after "://" is laid out, which says where user info (credentials) ends.
enum class StorageUrlForm : uint8_t {
  // scheme://[userinfo@]name-or-path[?params]: user info, if any, ends at the last '@' before the
  // first '/' or '?' (a path may hold an '@').
  kPath,
  // scheme://[user:password@]host:port[,host:port...][?params]: the password may hold '/' and
  // '@', so user info runs to the last '@' before the '?' (redis_url.h parses it so).
  kHosts,
};

// What the tools compare a store of the scheme with, in the same run.
enum class StorageBaseline : uint8_t {
  kNone,            // nothing: the store's rates are shown alone
  kFiles,           // plain files in the store's directory: N threads of pread, pwrite + rename
  kMemcpy,          // one memcpy per page
  kRedisBenchmark,  // redis-benchmark against the store's server
};

using OpenStorageFn = Result<std::unique_ptr<StorageBackend>> (*)(std::string_view url,
                                                                  const StorageNamespace& ns,
                                                                  const StorageOptions& options);

struct StorageScheme {
  std::string_view name;  // the text before "://"
  std::string_view medium;
  StorageUrlForm form = StorageUrlForm::kPath;
  StorageBaseline baseline = StorageBaseline::kNone;
  // Opens a store of the scheme; OpenStorage has validated the namespace and the options. Null
  // where this build leaves the backend out; `missing` then says why and what to install.
  OpenStorageFn open = nullptr;
  std::string_view missing;
  // Bytes a store of the scheme takes for a page beyond its payload, counted in its capacity
  // (file://: the header block before the payload); what the tools add to a page's bytes to size
  // a store of the same capacity before it holds a page.
  int64_t page_overhead_bytes = 0;
};

// Every scheme, in the order messages list them.
std::span<const StorageScheme> StorageSchemes();

// The row of scheme `name` ("file", not "file://"), or nullptr.
const StorageScheme* FindStorageScheme(std::string_view name);

// The scheme of `url`: the text before its "://", or "" when it has none.
std::string_view StorageUrlScheme(std::string_view url);

// "file://, redis://, redis+cluster:// or memory://": the schemes for an error message.
std::string StorageSchemeList();

}  // namespace kvtier
