// tools/kvtier/storage_bench_baseline.h — the platform baselines of `kvtier bench --storage`
// (storage_bench.h): the same pages moved by the platform without kvtier (file://: plain files on
// N threads and on one; memory://: memcpy; redis://: redis-benchmark), the reference of the
// backend's "% base".
//
// Thread safety: called from the bench's thread (the file baseline starts and joins its own).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kvtier/status.h"
#include "kvtier/storage_schemes.h"
#include "storage_bench.h"
#include "storage_bench_pages.h"

namespace kvtier::tools {

// Writes back every dirty page of the file system that holds `dir` (syncfs) and waits for it:
// run before each timed write pass, the store's Set and the file baseline's alike, so that no
// pass pays for the write-back of the writes before it (buffered writes return once the page
// cache holds them; a pass that starts with gigabytes of another pass's dirty pages is throttled
// by their write-back). False (errno set) when `dir` cannot be opened or synced.
bool WriteBackDirtyPages(const std::string& dir);

// A baseline's times of the same pages, and whether it read back what it wrote.
struct Baseline {
  std::string name;
  OpTimes set, get;
  bool check_ok = true;
  std::string note;
};

// The platform baselines of the store's scheme for the same pages (`kind`: its row's
// StorageBaseline, kvtier/storage_schemes.h): the first is the one the backend is measured
// against, any others are shown beside it; none for StorageBaseline::kNone.
// `file_dir`: the file baseline's directory (kFiles only); `key_space`: the keys of a
// RedisKeySpace that exists (kRedisBenchmark on one server only; 0: none).
Result<std::vector<Baseline>> RunBaselines(StorageBaseline kind, const std::string& file_dir,
                                           const PageSet& src, PageSet& dst, int64_t key_space,
                                           const StorageBenchOptions& o);

}  // namespace kvtier::tools
