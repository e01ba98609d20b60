// The `file://` backend's lifecycle (file_backend_internal.h lists the files of its other jobs):
// construction, Open (the free-space keeper, the scan of the pages already stored, the reclaimer,
// the index, the disk claim, the stamper and the floor's watcher, made and started in that order;
// the I/O threads last), Close (the watcher, the reclaimer and the stamper stopped after the I/O
// threads), the stats, pins, the stored keys, the hit stamper's settings and the test hooks
// (file_backend.h).
#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "storage/file/file_backend_internal.h"
#include "storage/page_format.h"
#include "util/log.h"

namespace kvtier::storage {
namespace {

// A hit has a page file's stamp (its mtime) rewritten (by the stamper, behind the read) only
// when the stamp on disk is older than the new one by more than this. The contract (file_index.h
// "Stamps"): the in-memory LRU order stays exact; the order a restart recovers from the mtimes is
// exact to within this granularity — a page's stamp on disk is never more than this behind its last
// use, so of two pages whose last uses are further apart than this the later one is the more recent
// after a restart, while a page hit again within this of its stamp keeps its earlier place. Each
// futimens is an inode write (on ext4 a journal handle); a page read over and over costs one a
// second at most.
constexpr int64_t kStampGranularityNs = 1'000'000'000;

// The hits' stamps wait in memory (HitStamper) and are written to the files behind the reads:
// at most this many pending (when full, the oldest is dropped: its file keeps its older stamp),
// written at least every kStampPeriod, or as soon as kStampWakeAt (at most half the bound) are
// pending, and at Close
// within kStampCloseBudget. Each entry costs about 150 bytes: 64 Ki of them about 10 MB.
constexpr size_t kStampPendingLimit = size_t{1} << 16;
constexpr size_t kStampWakeAt = 4096;
constexpr std::chrono::milliseconds kStampPeriod{500};
constexpr std::chrono::milliseconds kStampCloseBudget{2000};

// Test hooks (file_backend.h): the pending bound and period of backends opened after the call.
std::atomic<size_t> test_stamp_limit{0}, test_stamp_wake_at{0};
std::atomic<int64_t> test_stamp_period_ms{0};
std::atomic<int64_t> test_floor_watch_ms{0};

}  // namespace

FileBackend::FileBackend(std::string url, const StorageNamespace& ns, const StorageOptions& options,
                         Config config)
    : StorageBackend(std::move(url), ns, options),
      config_(std::move(config)),
      ns_name_(ns.Name()),
      namespace_hash_(ns.Hash()),
      value_bytes_(static_cast<int64_t>(kFilePayloadOffset) + ns.page_bytes()),
      io_(namespace_hash_, value_bytes_, config_.direct),
      stamper_(StampLimit(), StampWakeAt(), StampPeriod(),
               [this](const PageKey& key, int64_t stamp) { return WriteStamp(key, stamp); }) {}

FileBackend::~FileBackend() {
  Close();
  LogReadProfile();
}

Status FileBackend::Open() {
  KVTIER_RETURN_IF_ERROR(OpenRoot());
  Fd ns_dir;
  KVTIER_RETURN_IF_ERROR(EnsureNamespaceDir(&ns_dir));
  if (config_.direct) KVTIER_RETURN_IF_ERROR(ProbeDirect(ns_dir.get()));
  Result<DiskReading> disk = ReadDisk(ns_dir.get());
  if (!disk.ok()) {
    return Status::IOError(fmt::format("storage {}: {}", url(), disk.status().message()));
  }
  FileSpaceKeeper::Config space{.url = url(),
                                .dir = ns_dir.get(),
                                .disk = *disk,
                                .min_free_bytes = options().min_free_bytes,
                                .page_file_bytes = value_bytes_,
                                .evict = [this](int64_t bytes) { return EvictOldest(bytes); }};
  if (const int64_t ms = test_floor_watch_ms.load(std::memory_order_relaxed); ms > 0) {
    space.watch_every = std::chrono::milliseconds(ms);
  }
  KVTIER_ASSIGN_OR_RETURN(space_, FileSpaceKeeper::Open(std::move(space)));
  const int64_t min_free = space_->floor_bytes();
  KVTIER_ASSIGN_OR_RETURN(std::vector<FileIndex::Found> found,
                          ScanPages(ns_dir.get(), namespace_hash_));
  found = RemoveWrongSizeFiles(std::move(found));
  LogOldPages(found);
  int64_t capacity = 0;
  if (config_.capacity) {
    capacity = *config_.capacity;
  } else {
    capacity = DefaultCapacity(*disk, min_free, found);
  }
  // The evicted pages' files waiting to be unlinked hold at most reclaim_bound of the capacity,
  // the index the rest (file_reclaimer.h).
  const int64_t reclaim_bound = ReclaimBound(capacity);
  reclaimer_ = std::make_unique<FileReclaimer>(reclaim_bound, ReclaimThreads());
  // A hit's stamp goes to the stamper when the file's mtime is more than kStampGranularityNs
  // older; called under the index's mutex (the stamper takes only its own).
  index_ = std::make_unique<FileIndex>(
      capacity - reclaim_bound,
      [this](const PageKey& key) {
        DetachFile(key);
        NoteEvicted({&key, 1});  // KV events: the cache tells its listeners (TrackEvictions)
      },
      [this](const PageKey& key) { return pins_.Pinned(key); },
      [this](const PageKey& key, int64_t stamp, int64_t mtime_ns) {
        if (stamp - mtime_ns > kStampGranularityNs) stamper_.Add(key, stamp);
      });
  index_->Load(std::move(found));
  reclaimer_->Drain();
  claim_ = DiskClaims::Add(disk->device, [this] { return index_->capacity() - index_->bytes(); });
  stamper_.Start();
  space_->Watch();
  return Start();
}

Result<uint64_t> FileBackend::DoPinPages(std::span<const PageKey> keys,
                                         std::chrono::nanoseconds ttl) {
  return pins_.Add(keys, ttl);
}

Status FileBackend::DoUnpinPages(uint64_t pin) {
  if (pins_.Remove(pin)) return Status::OK();
  return Status::InvalidArgument(fmt::format("UnpinPages: no live pin {}", pin));
}

// The namespace directory's page files (the restart scan's walk: every process's pages).
Result<std::vector<PageKey>> FileBackend::DoStoredKeys() {
  Fd ns_dir;
  KVTIER_RETURN_IF_ERROR(EnsureNamespaceDir(&ns_dir));
  KVTIER_ASSIGN_OR_RETURN(std::vector<FileIndex::Found> found,
                          ScanPages(ns_dir.get(), namespace_hash_));
  std::vector<PageKey> keys;
  keys.reserve(found.size());
  for (const FileIndex::Found& f : found) keys.push_back(f.key);
  return keys;
}

// After the I/O threads (no hit adds a stamp any more): applies the touches the index still
// has queued (their stamps going to the stamper), then writes the pending stamps, giving up
// after kStampCloseBudget.
void FileBackend::DoClose() {
  if (space_) space_->Stop();
  if (reclaimer_) reclaimer_->Stop();  // every detached file unlinked
  if (index_) index_->ApplyPendingTouches();
  stamper_.Stop(kStampCloseBudget);
  const HitStamper::Counts c = stamper_.counts();
  if (c.left > 0 && !close_logged_.exchange(true)) {
    util::Log(util::LogLevel::kWarning,
              "storage {}: closed with {} hit stamp(s) not written within {} ms (those pages "
              "keep their older stamps on disk, so a restart orders them by those)",
              url(), c.left, kStampCloseBudget.count());
  }
}

void FileBackend::FillStats(StorageStats& stats) const {
  stats.stored_pages = index_->pages();
  stats.stored_bytes = index_->bytes();
  stats.capacity_bytes = index_->capacity() + reclaimer_->bound();
  stats.evicted_pages = index_->evicted();
  space_->Fill(stats);
  // Hits read on the thread path (io_uring reads are not probed: counted in neither).
  stats.get_cached_pages = cached_pages_.load(std::memory_order_relaxed);
  stats.get_disk_pages = disk_pages_.load(std::memory_order_relaxed);
  write_profile_.Fill(stats);
  profile_.Fill(stats);
}

// Says once how many pages found at open carry no parent: of format version 1 (written before
// headers named parents) or with a header that does not check out. They are roots of the
// eviction order (plain LRU among the leaves) until written again.
void FileBackend::LogOldPages(const std::vector<FileIndex::Found>& found) const {
  int64_t old = 0, unreadable = 0;
  for (const auto& f : found) {
    old += f.version == kPageFormatV1;
    unreadable += f.version == 0;
  }
  if (old == 0 && unreadable == 0) return;
  util::Log(util::LogLevel::kInfo,
            "storage {}: of the {} pages found at open, {} are of page format version 1 (no "
            "parent recorded) and {} have a header that does not check out (misses when read); "
            "they are evicted in plain LRU order",
            url(), found.size(), old, unreadable);
}

size_t FileBackend::StampLimit() {
  const size_t limit = test_stamp_limit.load(std::memory_order_relaxed);
  return limit > 0 ? limit : kStampPendingLimit;
}

size_t FileBackend::StampWakeAt() {
  const size_t wake_at = test_stamp_wake_at.load(std::memory_order_relaxed);
  return wake_at > 0 ? wake_at : std::min(kStampWakeAt, std::max<size_t>(StampLimit() / 2, 1));
}

FileBackend::Clock::duration FileBackend::StampPeriod() {
  const int64_t ms = test_stamp_period_ms.load(std::memory_order_relaxed);
  return ms > 0 ? Clock::duration(std::chrono::milliseconds(ms)) : kStampPeriod;
}

namespace testing {

void SetFileStampLimitsForTest(size_t pending_limit, std::chrono::milliseconds period,
                               size_t wake_at) {
  test_stamp_limit.store(pending_limit, std::memory_order_relaxed);
  test_stamp_wake_at.store(wake_at, std::memory_order_relaxed);
  test_stamp_period_ms.store(period.count(), std::memory_order_relaxed);
}

void SetFileFloorWatchForTest(std::chrono::milliseconds every) {
  test_floor_watch_ms.store(every.count(), std::memory_order_relaxed);
}

std::optional<FileStampCounts> FileStampCountsForTest(const StorageBackend& backend) {
  const auto* file = dynamic_cast<const FileBackend*>(&backend);
  if (file == nullptr) return std::nullopt;
  const HitStamper::Counts c = file->stamp_counts();
  return FileStampCounts{c.written, c.skipped, c.dropped, c.left, c.pending};
}

std::optional<FileReclaimCounts> FileReclaimCountsForTest(const StorageBackend& backend) {
  const auto* file = dynamic_cast<const FileBackend*>(&backend);
  if (file == nullptr) return std::nullopt;
  const std::optional<FileReclaimer::Counts> c = file->reclaim_counts();
  if (!c) return std::nullopt;
  return FileReclaimCounts{c->bound, c->pending, c->max_pending, c->unlinked_inline,
                           c->unlinked_background};
}

}  // namespace testing

}  // namespace kvtier::storage
