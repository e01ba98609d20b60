// kvtier/storage.h — the storage tier (L3): batched, asynchronous page storage behind one
// interface.
//
// The interface, its page buffers and results: storage_backend.h. This header adds how a store
// is opened by URL.
//
// Backends are chosen by URL (OpenStorage; the schemes' table: storage_schemes.h):
//   file:///abs/dir[?capacity=200GiB][&fsync=1][&direct=1]
//                                                one file per page, LRU within a byte capacity
//                                                (default: half the free space; direct: O_DIRECT)
//   redis://[user:password@]host:port[?timeout_ms=..]
//   redis+cluster://host:port[,host:port...]     cluster routing in kvtier (slots, MOVED/ASK)
//   memory://?capacity=1GiB                      in-process, same semantics (tests)
//
// Thread safety: every function may be called from any thread.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "kvtier/page_key.h"
#include "kvtier/status.h"
#include "kvtier/storage_backend.h"

namespace kvtier {

// `url` with its user info (a password, a user name) replaced by "***", for every place kvtier
// prints, logs or writes a URL (reports, --json, metrics labels, error messages):
//   redis://:s3cret@host:6379?timeout_ms=5  ->  redis://***@host:6379?timeout_ms=5
// The user info is what the URL's own parser takes as one (its scheme's StorageUrlForm,
// storage_schemes.h): for redis:// and redis+cluster:// everything before the last '@' ahead of
// the query (redis_url.h, which accepts a raw '@' or '/' in a password); for other schemes
// everything before the last '@' of the authority (up to the first '/' or '?'), so a file://
// path with an '@' in it is shown as it is. Text without "://"
// that holds an '@' (a mistyped URL) keeps only what follows its last '@'. Everything else is
// returned unchanged.
std::string RedactUrl(std::string_view url);

// Bytes the stored format adds to every page in a memory or Redis value: the page's bytes follow
// a header of this size (src/storage/page_format.h describes it; a file store's page file puts
// them at 4 KiB, after a longer header naming the page's parent).
inline constexpr int64_t kStoredPageHeaderBytes = 72;

// Opens the backend that `url` names for deployment `ns`. InvalidArgument naming the URL part
// (unknown scheme, relative file path, bad capacity, bad host:port); Unavailable when a Redis
// server cannot be reached or refuses the credentials (the message says which);
// IOError when a file store's directory cannot be created. A backend left out of this build
// (hiredis missing) is InvalidArgument saying so.
Result<std::unique_ptr<StorageBackend>> OpenStorage(std::string_view url,
                                                    const StorageNamespace& ns,
                                                    const StorageOptions& options = {});

// Parses "123", "4096B", "200GiB", "1.5GB", "64MiB", "10KiB"... into bytes. InvalidArgument
// naming the text for anything else, negative or above 2^60.
Result<int64_t> ParseByteSize(std::string_view text);

}  // namespace kvtier
