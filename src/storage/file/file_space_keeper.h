// Internal: a file store's share of its file system's free space. The keeper holds the store's
// free-space floor (StorageOptions::min_free_bytes, a DiskFloor with its watcher thread) and
// makes room for it by evicting the store's own least recently used pages; it says whether a
// page may be written, and what to do when a write finds the file system full (ENOSPC, EDQUOT).
// The file store (file_backend.cc) keeps the I/O and the index; the keeper reaches the index
// only through the eviction it is given.
//
// Contract (the store calls, in this order):
// - Open, with the store's namespace directory open, before the index: the floor in bytes
//   (floor_bytes(); 0: none), which the store's default capacity leaves free.
// - Watch(), once the index exists: from then on the watcher reads the free space every second
//   and, under the floor, evicts the store's pages (whatever filled the disk: this store,
//   another, another process).
// - AdmitWrite() before each page's write: false (the Set is kNoSpace) when the free space is
//   under the floor and the store has no page left to evict to bring it back. The common case
//   costs a clock read and two atomic loads; a statvfs and evictions only near the floor.
// - NoteWritten() after each page file is published: the estimate of the free space moves by
//   its blocks (read afresh at most every 20 ms on the write path).
// - RetryAfterFull(error) after a write failed with ENOSPC or EDQUOT: evicts the store's oldest
//   pages (one page's worth; up to the floor when there is one) and says whether to write once
//   more (a capacity signal, not a fault of the page).
// - Stop() (or the destructor) before the index goes: joins the watcher.
// Refusals, full disks and floor evictions are counted (Fill: StorageStats' floor_evicted_pages,
// floor_refused_pages, disk_full_retries, min_free_bytes) and said at their 1st, 2nd, 4th ...
// time, never once per page.
//
// Thread safety: every method may be called from any thread (the store's I/O threads, the
// watcher); one MakeRoom at a time (`make_room_mu_`), the eviction running under it: `evict`
// must not call back into the keeper.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "kvtier/storage.h"
#include "storage/file/disk_space.h"

namespace kvtier::storage {

// Adds one to `count`; the new count at its 1st, 2nd, 4th, 8th ... time (when to say so: a full
// disk costs a few lines, not one per page), 0 otherwise.
int64_t CountAndSay(std::atomic<int64_t>& count);

class FileSpaceKeeper {
 public:
  // Evicts the store's least recently used pages (a chain's tail first) until `bytes` of page
  // files are gone or none is left, their files removed before it returns; the pages evicted.
  using EvictOldest = std::function<int64_t(int64_t bytes)>;

  struct Config {
    std::string url;              // the store's, for the log
    int dir = -1;                 // an open directory on the store's file system (duplicated)
    DiskReading disk;             // its reading at open
    int64_t min_free_bytes = -1;  // StorageOptions::min_free_bytes: -1 the default, 0 none
    int64_t page_file_bytes = 0;  // a page file's bytes
    // How often the watcher reads the free space whatever the store does (tests shorten it:
    // testing::SetFileFloorWatchForTest, file_backend.h).
    std::chrono::milliseconds watch_every{1000};
    EvictOldest evict;
  };
  // IOError when the file system cannot be read.
  static Result<std::unique_ptr<FileSpaceKeeper>> Open(Config config);
  ~FileSpaceKeeper();
  FileSpaceKeeper(const FileSpaceKeeper&) = delete;
  FileSpaceKeeper& operator=(const FileSpaceKeeper&) = delete;

  // The floor in bytes; 0 when the store keeps none.
  int64_t floor_bytes() const { return floor_ ? floor_->floor() : 0; }

  void Watch();
  void Stop();
  bool AdmitWrite();
  void NoteWritten();
  // `error`: the write's errno (ENOSPC or EDQUOT), for the log.
  bool RetryAfterFull(int error);
  void Fill(StorageStats& stats) const;

 private:
  explicit FileSpaceKeeper(Config config);
  // Makes the free space at least `want` above the floor, evicting the store's least recently
  // used pages when it is short: whether it is. The free space is read afresh before anything is
  // evicted. REQUIRES: a floor.
  bool MakeRoom(int64_t want);

  const Config config_;
  const int64_t allocated_bytes_;     // a page file's blocks on disk (AllocatedBytes)
  std::unique_ptr<DiskFloor> floor_;  // null without a floor (min_free_bytes = 0)
  std::mutex make_room_mu_;           // one MakeRoom at a time
  std::atomic<int64_t> floor_evicted_{0}, floor_refused_{0}, disk_full_retries_{0};
};

}  // namespace kvtier::storage
