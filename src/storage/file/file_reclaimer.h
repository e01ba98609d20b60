// Internal: the unlinks of a file store's evicted pages, off its writers' path (file_backend.h).
//
// A page the index evicts is renamed out of its place (FileBackend's DetachFile: microseconds)
// and handed here; unlinking it frees its blocks and page cache and, on ext4, waits for any of its
// pages still under writeback: the largest phase of a Set (the H100 bench: 1.3 / 3.9 / 10.7 ms a
// page at 512 KiB / 2 MiB / 8 MiB; the 8 MiB replay: 36.5 ms against 8.3 ms of write). Here the
// reclaimer's threads unlink them while the writers go on.
//
// Why a bounded queue rather than a background evictor keeping headroom: the index stays the one
// place that decides what goes (a Put evicts exactly what it displaces, so the LRU order and the
// chains' tail-first eviction are as before), and the bytes still on disk are bounded by a number
// fixed at open. The files waiting here hold at most `bound` bytes, and the store's index keeps
// at most capacity - bound (FileBackend sizes both), so the page files of the store never exceed
// its capacity. A writer Reserves one page of room before the publish that may detach a file (the
// page it evicts, or the key's older file it replaces); when the waiting files and the other
// writers' reservations leave no room, it unlinks waiting files itself, oldest first
// (backpressure: the queue never grows past its bound, and writers are slowed only when the
// unlinks cannot keep up). Files detached without a reservation (a dropped orphan, the restart
// scan's evictions) are unlinked by Relieve down to the bound. The free-space floor and a full
// disk's retry (Drain) unlink everything waiting on their caller and wait for the unlinks the
// threads have under way: the space must be free when Drain returns. Stop joins
// the threads and unlinks what is left: after Close no detached file remains (a process that
// dies leaves temporary files the next open removes, as before).
//
// bound 0 (stores of fewer than 1024 pages: FileBackend's ReclaimBound): no thread; every
// detached file is unlinked by the writer that detached it, right after its call into the index,
// as before.
//
// Thread safety: every member may be called from any thread; Add may be called under the index's
// mutex (it only queues).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "storage/file/file_io.h"

namespace kvtier::storage {

class FileReclaimer {
 public:
  // The name of the reclaimer's threads (pthread_setname_np: at most 15 characters).
  static constexpr const char* kReclaimThreadName = "kvtier-reclaim";

  struct Counts {
    int64_t bound = 0;                // bytes
    int64_t pending = 0;              // bytes of detached files not yet unlinked
    int64_t max_pending = 0;          // the most bytes pending at once so far
    int64_t unlinked_inline = 0;      // files unlinked by the caller (Reserve, Relieve, Drain)
    int64_t unlinked_background = 0;  // files unlinked by the reclaimer's threads
  };

  // How a file is unlinked: ::unlinkat(dir, name, 0) unless a test passes its own.
  using UnlinkFn = std::function<void(int dir, const std::string& name)>;

  // `bound`: the most bytes of detached files waiting (0: none wait); `threads` unlinking threads
  // (at least 1; none with bound 0). Started at once.
  FileReclaimer(int64_t bound, int threads, UnlinkFn unlink = nullptr);
  ~FileReclaimer();  // Stop()
  FileReclaimer(const FileReclaimer&) = delete;
  FileReclaimer& operator=(const FileReclaimer&) = delete;

  // Room for `bytes` of files a write is about to detach, held until Release: returns once the
  // waiting files and every reservation fit the bound with it, unlinking waiting files on the
  // caller (oldest first) while there are any, else waiting for the threads or other writers.
  // REQUIRES: bytes <= bound when bound > 0. No effect with bound 0.
  void Reserve(int64_t bytes);
  void Release(int64_t bytes);
  // A detached file (`name` in the directory `dir`, `bytes` on disk) to unlink.
  void Add(Fd dir, std::string name, int64_t bytes);
  // Unlinks waiting files on the caller until at most `bound` bytes wait (all, with bound 0).
  void Relieve();
  // Returns once every file added before the call is unlinked: those still queued on the caller,
  // those the threads or other callers are unlinking waited for (their space must be free when
  // the free-space floor or a full disk's retry goes on).
  void Drain();
  // Joins the threads, then Drain. Idempotent.
  void Stop();

  int64_t bound() const { return bound_; }
  Counts counts() const;

 private:
  struct File {
    Fd dir;
    std::string name;
    int64_t bytes = 0;
    int64_t ticket = 0;  // the order of Add
  };
  // Whether a file added before `ticket` is queued or being unlinked. REQUIRES: mu_ held.
  bool AnyBefore(int64_t ticket) const;
  // Unlinks the oldest waiting file on the caller with `lock` released meanwhile; false when none
  // waits. REQUIRES: lock holds mu_.
  bool UnlinkOne(std::unique_lock<std::mutex>& lock, int64_t* counter);
  void Run();

  const int64_t bound_;
  const UnlinkFn unlink_;
  mutable std::mutex mu_;
  std::condition_variable work_;    // a file queued, or stopping
  std::condition_variable room_;    // a file unlinked or a reservation released
  std::deque<File> queue_;          // oldest first; guarded by mu_
  int64_t next_ticket_ = 0;         // guarded by mu_
  std::vector<int64_t> unlinking_;  // tickets of the files being unlinked; guarded by mu_
  // Guarded by mu_: bytes queued or being unlinked, reserved, and the counts.
  int64_t pending_ = 0, reserved_ = 0;
  Counts counts_;
  bool stopping_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace kvtier::storage
