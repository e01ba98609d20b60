// tools/baselines/replay_ceiling.h — the storage read ceiling `kvtier replay` charges the ideal's
// storage hits at, measured when the store opens: what the platform gives to plain reads of the
// same bytes, not what kvtier's backend reaches.
//   file://  N threads (N = the backend's I/O threads) open + pread + close files of one page's
//            bytes, written first in a temporary folder inside the store's directory (same
//            filesystem) and removed afterwards: the best of five passes over all the files (what
//            the machine gave at least once: a pass slowed by other work must not lower the ideal).
//            The files were just written, so the reads come from the page cache, as the store's
//            reads of pages it wrote during the replay mostly do. Then the cold ceiling of the
//            same files: each fdatasync'ed and dropped from the page cache with
//            posix_fadvise(POSIX_FADV_DONTNEED) (checked with mincore), read by the same N
//            threads; the median of three drop-and-read passes. Context only — what a store
//            whose pages the page cache no longer holds reads at, beside the hot ceiling the
//            ideal charges; not measured where the page cache keeps the files (tmpfs).
//   redis:// redis-benchmark (Debian redis-tools) GETs of values of one page's bytes with N
//            clients against the same server (RunRedisBenchmark), bounded by
//            RedisCeilingTimeLimit of the store's timeout: a server that stops answering (paused,
//            overloaded) costs the replay that long, then redis-benchmark is killed and reaped and
//            the replay goes on without a ceiling.
// Anything else (memory://, a missing redis-benchmark) has no baseline: the caller falls back to
// the run's own storage -> host rate and says so.
//
// Thread safety: call from one thread; it starts and joins its own threads.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "kvtier/status.h"
#include "kvtier/storage_schemes.h"

namespace kvtier::tools {

struct StorageCeiling {
  double bytes_per_s = 0;
  std::string how;  // one line: what was measured
  // file:// only: the same reads from the disk (0: not measured; cold_how says why).
  double cold_bytes_per_s = 0;
  std::string cold_how;
};

// N-thread pread over files of `page_bytes` in a temporary folder under `dir`. IOError naming
// the path when a file cannot be written or read.
Result<StorageCeiling> MeasureFileReadCeiling(const std::string& dir, int64_t page_bytes,
                                              int threads);

// How long a redis ceiling may run: kRedisCeilingStoreTimeouts of the store's per-call timeout
// (the time within which the store counts one call as answered), at least
// kRedisCeilingMinSeconds (a healthy run's SETs and GETs take a second or two on a loaded 2-core
// machine) and at most kRedisCeilingMaxSeconds; whole seconds, rounded up. The default 2 s
// timeout gives 10 s.
inline constexpr int kRedisCeilingStoreTimeouts = 5;
inline constexpr int kRedisCeilingMinSeconds = 5;
inline constexpr int kRedisCeilingMaxSeconds = 60;
std::chrono::seconds RedisCeilingTimeLimit(std::chrono::milliseconds store_timeout);

// redis-benchmark GET of `page_bytes` values with `threads` clients at the server of `url`
// (redis:// or redis+cluster://), killed (its process group) and reaped once it has run
// RedisCeilingTimeLimit(store_timeout). NotFound without redis-benchmark; Unavailable when it
// fails, runs past the limit (the message says so, with the limit and the timeout it came from)
// or when the URL has a password (redis-benchmark would show it on its command line).
Result<StorageCeiling> MeasureRedisReadCeiling(const std::string& url, int64_t page_bytes,
                                               int threads,
                                               std::chrono::milliseconds store_timeout);

// fdatasync, then posix_fadvise(POSIX_FADV_DONTNEED) of the file at `path` (of `bytes`): its
// pages leave the page cache, on a file system with a page cache of its own. Whether they all
// left: mincore over a mapping (which reads nothing in). False when the file cannot be opened
// or some of its pages stayed (tmpfs keeps them: they are the file).
bool DropFromPageCache(const std::string& path, int64_t bytes);

// One pass of `threads` threads, each taking the next file: open + pread of its first
// `page_bytes` bytes + close, as the file backend reads a page. Into one buffer per thread (it
// stays in the CPU's caches: a stricter ceiling), or with `into` (paths.size() * page_bytes
// bytes, written by the caller beforehand) file i into `into + i * page_bytes`, as a cache reads
// pages into host memory of the prefix's size. Its seconds, or -1 when a file could not be
// opened or was shorter.
double ReadPass(const std::vector<std::string>& paths, int64_t page_bytes, int threads,
                char* into = nullptr);

// The platform baseline of `url`'s scheme (its row in kvtier/storage_schemes.h); kNone for a
// scheme without a row.
StorageBaseline BaselineOf(std::string_view url);

// The directory of a store of plain files, a scheme whose baseline is StorageBaseline::kFiles
// ("file:///dir?capacity=..." -> "/dir"); "" for other schemes.
std::string FileUrlDirectory(const std::string& url);
// Its inverse: the URL of a store of plain files in `dir` holding at most `capacity_bytes`
// ("/dir", 64 MiB -> "file:///dir?capacity=67108864"), the replay's temporary stores.
std::string FileStoreUrl(const std::string& dir, int64_t capacity_bytes);

}  // namespace kvtier::tools
