// Internal: where the file store's page writes spend their time (file_backend.cc's SetOne, every
// page: a Set page is at least hundreds of KiB, so the dozen clock readings per page cost well
// under 0.1 % of it), summed into StorageStats' set_*_seconds.
//
// Thread safety: WriteTimes belongs to one page's write; WriteProfile's totals are relaxed
// atomics, read at any time (a snapshot whose fields may be a page apart).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>

#include "kvtier/storage.h"

namespace kvtier::storage {

// One page's write, in nanoseconds: the copy into a bounce buffer (direct=1 only), the payload's
// checksum, and the write calls (pwritev: the kernel's copy into the page cache, and any wait the
// kernel imposes for the dirty pages' writeback). Filled by PageFileIo::WritePage.
struct WriteTimes {
  int64_t copy_ns = 0, hash_ns = 0, write_ns = 0;
};

class WriteProfile {
 public:
  using Clock = std::chrono::steady_clock;
  static int64_t Ns(Clock::duration d) {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(d).count();
  }

  // One page written and published: opening its shard directory and creating the temporary file
  // (`open_ns`, of which `open_dir_ns` the directory), `io` (WritePage), fdatasync (`sync_ns`,
  // fsync=1), the mtime stamp and the rename (and the directory's fsync with fsync=1:
  // `publish_ns`), the index's stamp and Put (its lock, and the evictions a Put decides, their
  // files renamed aside: `index_ns`), then the unlinks of those files, outside the index's mutex
  // (`unlink_ns`).
  void Add(int64_t open_ns, int64_t open_dir_ns, const WriteTimes& io, int64_t sync_ns,
           int64_t publish_ns, int64_t index_ns, int64_t unlink_ns) {
    pages_.fetch_add(1, kRelaxed);
    open_ns_.fetch_add(open_ns, kRelaxed);
    open_dir_ns_.fetch_add(open_dir_ns, kRelaxed);
    copy_ns_.fetch_add(io.copy_ns, kRelaxed);
    hash_ns_.fetch_add(io.hash_ns, kRelaxed);
    write_ns_.fetch_add(io.write_ns, kRelaxed);
    sync_ns_.fetch_add(sync_ns, kRelaxed);
    publish_ns_.fetch_add(publish_ns, kRelaxed);
    index_ns_.fetch_add(index_ns, kRelaxed);
    unlink_ns_.fetch_add(unlink_ns, kRelaxed);
  }

  // Into StorageStats' set_profiled_pages and set_*_seconds.
  void Fill(StorageStats& stats) const {
    auto s = [](const std::atomic<int64_t>& ns) {
      return static_cast<double>(ns.load(kRelaxed)) / 1e9;
    };
    stats.set_profiled_pages = pages_.load(kRelaxed);
    stats.set_open_seconds = s(open_ns_);
    stats.set_open_dir_seconds = s(open_dir_ns_);
    stats.set_copy_seconds = s(copy_ns_);
    stats.set_hash_seconds = s(hash_ns_);
    stats.set_write_seconds = s(write_ns_);
    stats.set_sync_seconds = s(sync_ns_);
    stats.set_publish_seconds = s(publish_ns_);
    stats.set_index_seconds = s(index_ns_);
    stats.set_unlink_seconds = s(unlink_ns_);
  }

 private:
  static constexpr std::memory_order kRelaxed = std::memory_order_relaxed;
  std::atomic<int64_t> pages_{0}, open_ns_{0}, open_dir_ns_{0}, copy_ns_{0}, hash_ns_{0},
      write_ns_{0}, sync_ns_{0}, publish_ns_{0}, index_ns_{0}, unlink_ns_{0};
};

}  // namespace kvtier::storage
