// Internal: the `file://` backend — one file per page under a directory, for a local disk cache
// that outlives the process and can be shared by processes on one host.
//
//   file:///abs/dir[?capacity=200GiB][&fsync=1][&io=uring|threads][&direct=1]
//
// Layout: <dir>/<namespace name>/<first two hex digits of the key>/<64 hex digits of the key>;
// directories 0700, files 0600. Only the hex of a key (never caller text) becomes a path. Each
// file is a page value (page_format.h) with the payload moved to offset kFilePayloadOffset: the
// header, zeros up to 4 KiB, then the payload, so the payload is page-aligned in the page cache
// and the kernel's copy into the caller's buffer runs aligned (a Get checks that the padding is
// zero). The header is of format version 2, naming the page's parent when the Set gave one (the
// restart scan reads it back: below; the header rather than an xattr, which tmpfs and some file
// systems drop, or the file's name, as a Get opens a page by its key alone); files of version 1
// (older kvtier) read as before.
//
// Safe paths: <dir> is the user's path, opened once (symlinks in it are the user's choice);
// everything beneath it is opened relative to that handle with no symlink followed (file_io.h,
// OpenBeneath). A namespace or shard directory replaced by a symlink, or a symlinked page file,
// is refused: a Get of the page is kCorrupt, a Set into it kFailed; nothing is read or written
// outside <dir>.
//
// A Set writes a temporary file in the page's shard directory (".tmp.<pid>.<n>.<key hex>"): the
// payload in chunks of 256 KiB, each hashed (streaming XXH3-64) right before its pwritev, then
// the header holding that checksum at offset 0; optionally fdatasyncs it (and the directory after
// the rename), then renames it into place: a reader sees the old page, the new one or none (none
// only before the key's first file). A key's older file is swapped out (RENAME_EXCHANGE) rather
// than renamed over, and unlinked after the index took the new one (file_io.h PublishFile: ext4
// writes back a file renamed over another inside the rename). A
// Get (io=threads, the default) reads the header with the first chunk, then chunk by chunk,
// every preadv straight into the caller's page buffer (no bounce buffer), and hashes each chunk
// as soon as it lands, while it is still in this core's cache; a bad header ends the read early.
// The pages of a batch run in parallel on the backend's I/O threads (StorageBackend::ParallelFor:
// the storage queue's threads are the only ones a file store has). With io=uring (where liburing
// is present) a batch's pages are read in one readv each, in flight together on the I/O thread's
// ring, and each page is hashed by the I/O thread as its read completes: the kernel's workers
// copy in parallel, but the hashing is serial and reads pages another core just wrote
// (docs/perf-notes/file-store.md).
//
// direct=1 (opt-in, for stores on NVMe that must not fill the page cache): every page file is
// read and written with O_DIRECT. A Get of pages whose buffers are 4 KiB-aligned (every segment
// starts on a 4 KiB boundary and all but the last hold whole 4 KiB blocks, as pinned host pages
// do) reads each page with one readv straight into the buffers, the batch's reads in flight
// together on the I/O thread's io_uring where liburing is present (preadv per page on the I/O
// threads otherwise); the header block and the payload's last partial block land in a small
// aligned buffer and are copied into place; the page is hashed after its read. Pages with
// unaligned buffers, and every Set, go chunk by chunk through a 256 KiB aligned buffer per I/O
// thread (a Set pads its last block and cuts the file to size after). Opening a direct store on
// a file system without O_DIRECT (tmpfs) is InvalidArgument.
//
// Capacity (per namespace directory: the bytes of this deployment's files) with LRU eviction
// (file_index.h). Without `capacity` in the URL the bound is derived at open: the pages of this
// namespace already there plus half of the room left: the space the file system lets this user
// write (statvfs f_bavail: allocated blocks, so a sparse file counts what it takes, not its
// apparent size) less the free-space floor and less the room the other file stores open in this
// process on that file system have claimed and not filled (disk_space.h DiskClaims: four stores
// opened one after another take 1/2, 1/4, 1/8, 1/16 of the room), at least one page; the backend
// logs the value (info) once. `capacity` below one page file is InvalidArgument. Each process
// counts the files it knows of (found at start, written, or hit since); processes sharing a
// directory do not share one count. A file found at open whose size is not a page file's (the
// namespace fixes it) is no page: it alone is removed (and said), never counted.
//
// The free-space floor (StorageOptions::min_free_bytes; by default the larger of 5 % of the file
// system and min(1 GiB, 20 % of it)): whoever fills the file system (this store, another store,
// another process), when its free space falls under the floor the store evicts its own least
// recently used pages until it is back above (a watcher thread reads the free space every second;
// a Set reads it at most every 20 ms, estimating in between from what it wrote and freed) and
// refuses a Set (kNoSpace) it cannot make room for. ENOSPC or EDQUOT from a write is a capacity
// signal too: the store evicts its oldest pages, counts it (StorageStats::disk_full_retries) and
// writes once more; kNoSpace if that fails too. Such events are said at their 1st, 2nd, 4th ...
// time, never once per page. A write past the process's file-size limit (RLIMIT_FSIZE) fails
// with EFBIG (a failed Set, said at its 1st, 2nd, 4th ... time too): the I/O threads block
// SIGXFSZ for themselves (file_backend.cc). The floor and a full disk: file_space_keeper.h.
// The LRU order lives in the files' modification times: every Set and every Get hit stamps its
// file with a strictly increasing time (a hit's written behind the reads by a stamper thread,
// within about 0.5 s, and at Close: file_index.h "Stamps"), so a restart (which scans the
// directory, sorts by that time, and removes temporary files whose writer process is gone) finds
// the same order; it reads each page's header too (one open and a 104-byte read per page, on 16
// threads), so the chains of tail-first eviction (file_index.h) hold across restarts; pages of
// version 1 are roots there. Exists answers from the index; a key missing from it (written by
// another process) costs one open and fstat, and the first absent key ends the call.
//
// Thread safety: the hooks may run on several I/O threads at once; the index has its own mutex;
// the stamper's thread runs from Open to Close.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
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

namespace testing {

// Test hooks: for file backends opened after the call, the most hit stamps kept pending, the
// stamper's period and how many pending wake it before its period ends (0 for any: the default,
// 64 Ki, 0.5 s, 4096 or half the bound; `wake_at` above the bound: never).
void SetFileStampLimitsForTest(size_t pending_limit, std::chrono::milliseconds period,
                               size_t wake_at = 0);

// Test hook: for file backends opened after the call, how often the free-space floor's watcher
// reads the free space (0: the default, 1 s).
void SetFileFloorWatchForTest(std::chrono::milliseconds every);

// A file backend's hit stamps so far (file_index.h "Stamps"): written to their files, skipped
// (the file gone, newer than the stamp, or refusing it), dropped (the pending map full), left
// unwritten at Close (past its budget), pending now.
struct FileStampCounts {
  int64_t written = 0, skipped = 0, dropped = 0, left = 0, pending = 0;
};
// nullopt when `backend` is not a file backend.
std::optional<FileStampCounts> FileStampCountsForTest(const StorageBackend& backend);

// A file backend's reclaimer (file_reclaimer.h): its bound in bytes, the bytes of evicted pages'
// files waiting to be unlinked now and at most so far, and the files unlinked by writers (and the
// free-space floor, Close) and by its threads.
struct FileReclaimCounts {
  int64_t bound = 0, pending = 0, max_pending = 0, unlinked_inline = 0, unlinked_background = 0;
};
// nullopt when `backend` is not an open file backend.
std::optional<FileReclaimCounts> FileReclaimCountsForTest(const StorageBackend& backend);

}  // namespace testing

}  // namespace kvtier::storage
