// Internal: the `file://` backend — one file per page under a directory, for a local disk cache
// that outlives the process and can be shared by processes on one host.
//
//   file:///abs/dir[?capacity=200GiB][&fsync=1][&io=uring|threads]
//
// Layout: <dir>/<namespace name>/<first two hex digits of the key>/<64 hex digits of the key>;
// directories 0700, files 0600. Only the hex of a key (never caller text) becomes a path. Each
// file is a page value (page_format.h) with the payload moved to offset kFilePayloadOffset: the
// header, zeros up to 4 KiB, then the payload, so the payload is page-aligned in the page cache
// and the kernel's copy into the caller's buffer runs aligned (a Get checks that the padding is
// zero). A Set writes a temporary file beside the final one
// (".tmp.<pid>.<n>.<key hex>"): the payload in chunks of 256 KiB, each hashed (streaming XXH3-64)
// right before its pwritev, then the header holding that checksum at offset 0; optionally
// fdatasyncs it (and the directory after the rename), then renames it into place: a reader sees
// the old page, the new one or none. A Get (io=threads, the default) reads the header with the
// first chunk, then chunk by chunk, every preadv straight into the caller's page buffer (no
// bounce buffer), and hashes each chunk as soon as it lands, while it is still in this core's
// cache; a bad header ends the read early. The pages of a batch run in parallel on the backend's
// thread pools (one for reads, one for writes). With io=uring (where liburing is present) a
// batch's pages are read in one readv each, in flight together on the I/O thread's ring, and each
// page is hashed by the I/O thread as its read completes: the kernel's workers copy in parallel,
// but the hashing is serial and reads pages another core just wrote
// (docs/perf-notes/file-store.md).
//
// Capacity (per namespace directory: the bytes of this deployment's files) with LRU eviction.
// Each process counts the files it knows of (found at start, written, or hit since); processes
// sharing a directory do not share one count.
// The LRU order lives in the files' modification times: every Set and every Get hit stamps its
// file with a strictly increasing time, so a restart (which scans the directory, sorts by that
// time, and removes temporary files whose writer process is gone) finds the same order. Exists
// answers from the in-memory index; a key missing from it (written by another process) costs one
// stat, and the first absent key ends the call.
//
// Thread safety: the hooks may run on several I/O threads at once; the index has its own mutex.
#pragma once

#include <cstddef>
#include <memory>
#include <string_view>

#include "kvtier/storage.h"

namespace kvtier::storage {

// Where a page file's payload starts: the header, then zeros up to here.
inline constexpr size_t kFilePayloadOffset = 4096;

// IOError when the directory cannot be created or read; InvalidArgument for a relative path or a
// bad parameter.
Result<std::unique_ptr<StorageBackend>> OpenFileStorage(std::string_view url,
                                                        const StorageNamespace& ns,
                                                        const StorageOptions& options);

}  // namespace kvtier::storage
