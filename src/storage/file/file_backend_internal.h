// Internal to src/storage/file/: the `file://` backend's class (file_backend.h is its opening
// function and test hooks). The class has several jobs, each in a file of its own; this header
// declares them together so that each file states one:
//   file_backend.cc        lifecycle: construction, Open (the index, reclaimer, free-space keeper
//                          and stamper made and started in order), Close, stats, pins, the
//                          stamper's settings, the test hooks
//   file_backend_url.cc    OpenFileStorage: the URL's directory and options into a Config
//   file_backend_paths.cc  the store's directories and files reached beneath its root
//   file_backend_get.cc    the Get path (and Exists): open, read and check a page, mark a hit,
//   write
//                          hits' stamps behind the reads, the read profile's log line
//   file_backend_set.cc    the Set path (and Remove): write a page to a temporary file, publish it,
//                          index it; a full disk's retry
//   file_backend_space.cc  capacity and eviction: the default capacity, files of a wrong size found
//                          at open, evicting for the free-space floor, detaching a victim's file,
//                          the reclaimer's bound and threads
// Which pages are stored, their LRU order and the capacity live in the index (file_index.h); a
// page file's bytes and their checks in the page I/O (file_page_io.h); whole reads/writes and
// opens beneath the store root in file_io.h; hits' stamps written behind the reads in
// hit_stamper.h; the sampled Get profile in read_profile.h; the free-space floor and what a full
// disk does (evicting through the index) in file_space_keeper.h.
//
// Paths: the backend holds the store root open (`root_`, reopened by path if the root is removed
// while running) and reaches every file through OpenBeneath from it: "<ns>/<shard>/<hex>" for a
// page, "<ns>/<shard>" for the directory a Set writes its temporary file in and renames it in.
// A symlink anywhere below the root fails that open: a Get of such a page is kCorrupt, a Set
// into a shard that is a symlink kFailed (with a warning), so nothing is written outside the
// store.
//
// Thread safety: the hooks may run on several I/O threads at once; the index has its own mutex,
// the stamper its own; `root_` is swapped under `dirs_mu_` and read through an atomic shared_ptr;
// `noatime_` is a relaxed atomic that only goes from true to false; files are reached only
// through open/rename/unlink, which the kernel orders.
#pragma once

#include <time.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#if KVTIER_HAVE_URING
#include <liburing.h>
#endif

#include "kvtier/storage.h"
#include "storage/file/disk_space.h"
#include "storage/file/file_backend.h"
#include "storage/file/file_index.h"
#include "storage/file/file_io.h"
#include "storage/file/file_page_io.h"
#include "storage/file/file_reclaimer.h"
#include "storage/file/file_space_keeper.h"
#include "storage/file/hit_stamper.h"
#include "storage/file/read_profile.h"
#include "storage/file/write_profile.h"
#include "storage/page_pins.h"

namespace kvtier::storage {

// A stamp (nanoseconds since the epoch) as a file time.
inline timespec ToTimespec(int64_t ns) {
  return timespec{static_cast<time_t>(ns / 1'000'000'000), static_cast<long>(ns % 1'000'000'000)};
}

class FileBackend final : public StorageBackend {
 public:
  using Clock = std::chrono::steady_clock;

  struct Config {
    std::string root;                 // the URL's directory
    std::optional<int64_t> capacity;  // bytes of files in this namespace's directory
    bool fsync = false;
    bool io_uring = false;  // reads through io_uring (when built with liburing)
    bool direct = false;    // O_DIRECT reads and writes (direct=1; with io_uring where present)
  };

  FileBackend(std::string url, const StorageNamespace& ns, const StorageOptions& options,
              Config config);
  ~FileBackend() override;
  Status Open();

  HitStamper::Counts stamp_counts() const { return stamper_.counts(); }
  std::optional<FileReclaimer::Counts> reclaim_counts() const {
    if (!reclaimer_) return std::nullopt;
    return reclaimer_->counts();
  }

 protected:
  // file_backend.cc
  Result<uint64_t> DoPinPages(std::span<const PageKey> keys, std::chrono::nanoseconds ttl) override;
  Status DoUnpinPages(uint64_t pin) override;
  Result<std::vector<PageKey>> DoStoredKeys() override;
  void DoClose() override;
  void FillStats(StorageStats& stats) const override;

  // file_backend_get.cc
  ExistsResult DoExists(std::span<const PageKey> keys, Clock::time_point deadline) override;
  void DoGet(std::span<const PageKey> keys, std::span<const PageBuffer> buffers,
             std::span<PageStatus> out, Clock::time_point deadline) override;

  // file_backend_set.cc
  void DoSet(std::span<const PageKey> keys, std::span<const PageBuffer> buffers,
             std::span<PageStatus> out, Clock::time_point deadline) override;
  void DoSetChained(std::span<const PageKey> keys, std::span<const PageBuffer> buffers,
                    std::span<const std::optional<PageKey>> parents, std::span<PageStatus> out,
                    Clock::time_point deadline) override;
  void DoRemove(std::span<const PageKey> keys, std::span<PageStatus> out,
                Clock::time_point deadline) override;

 private:
  std::shared_ptr<const Fd> Root() const { return std::atomic_load(&root_); }

  // file_backend.cc
  void LogOldPages(const std::vector<FileIndex::Found>& found) const;
  static size_t StampLimit();
  static size_t StampWakeAt();
  static Clock::duration StampPeriod();

  // file_backend_paths.cc
  Status OpenRoot();
  Status EnsureNamespaceDir(Fd* out);
  Fd OpenShard(const std::string& hex, bool create);
  int OpenPageForRead(const PageKey& key, int flags);
  bool RemoveFile(const PageKey& key);
  Status ProbeDirect(int ns_dirfd);

  // file_backend_get.cc
  PageStatus GetOne(const PageKey& key, const PageBuffer& buffer);
  PageStatus OpenForRead(const PageKey& key, const PageBuffer& buffer, PageRead& read);
  void MarkHit(const PageKey& key, const PageRead& read);
  void NoteFoundWithoutParent(uint16_t version);
  HitStamper::Outcome WriteStamp(const PageKey& key, int64_t stamp);
  void LogReadProfile() const;
#if KVTIER_HAVE_URING
  void GetWithUring(io_uring& ring, std::span<const PageKey> keys,
                    std::span<const PageBuffer> buffers, std::span<PageStatus> out,
                    Clock::time_point deadline);
#endif

  // file_backend_set.cc
  PageStatus SetOne(const PageKey& key, const PageBuffer& buffer,
                    const std::optional<PageKey>& parent = std::nullopt);
  PageStatus WriteOne(const PageKey& key, const PageBuffer& buffer,
                      const std::optional<PageKey>& parent, int& error);

  // file_backend_space.cc
  int64_t DefaultCapacity(const DiskReading& disk, int64_t min_free,
                          const std::vector<FileIndex::Found>& found);
  std::vector<FileIndex::Found> RemoveWrongSizeFiles(std::vector<FileIndex::Found> found);
  int64_t EvictOldest(int64_t bytes);
  void DetachFile(const PageKey& key);
  int64_t ReclaimBound(int64_t capacity) const;
  int ReclaimThreads() const;
  static constexpr int64_t kReclaimMinPages = 1024, kReclaimFiles = 64;

  const Config config_;
  const std::string ns_name_;
  const uint64_t namespace_hash_;
  const int64_t value_bytes_;
  const PageFileIo io_;             // after config_, namespace_hash_, value_bytes_: made from them
  std::shared_ptr<const Fd> root_;  // read and swapped through std::atomic_load / atomic_store
  PagePins pins_;                   // pages index_ must not evict
  // Set by Open before index_ (whose evictions it unlinks), destroyed after it.
  std::unique_ptr<FileReclaimer> reclaimer_;
  std::unique_ptr<FileIndex> index_;  // set by Open, before the I/O threads start
  // After index_ (whose bytes the claim reads and whose pages the floor's watcher evicts): both
  // are gone before it.
  DiskClaims::Claim claim_;
  std::unique_ptr<FileSpaceKeeper> space_;  // made by Open before index_; its watcher after it
  std::atomic<int64_t> file_too_large_{0};  // Sets failed with EFBIG (for CountAndSay)
  std::atomic<uint64_t> temp_counter_{0};
  std::atomic<int64_t> found_v1_{0}, found_unreadable_{0};  // NoteFoundWithoutParent
  std::atomic<int64_t> cached_pages_{0}, disk_pages_{0};    // GetOne's hits, by ReadSource
  ReadProfile profile_;                                     // GetOne's pages (LogReadProfile)
  WriteProfile write_profile_;                              // SetOne's pages (FillStats)
  std::atomic<bool> noatime_{true};  // OpenPageForRead adds O_NOATIME (until a file refuses it)
  std::mutex dirs_mu_;               // one re-creation of missing directories at a time
  std::atomic<bool> close_logged_{false};  // DoClose's warning said once
  // Last: its thread (which calls WriteStamp) is stopped by Close, in the destructor's body.
  HitStamper stamper_;
};

}  // namespace kvtier::storage
