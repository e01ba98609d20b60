// A file store's share of its file system's free space (file_space_keeper.h).
//
// Thread safety: MakeRoom under `make_room_mu_`; the counters are relaxed atomics; the floor's
// own state is DiskFloor's (disk_space.h).
#include "storage/file/file_space_keeper.h"

#include <cstring>
#include <utility>

#include "util/log.h"

namespace kvtier::storage {
namespace {

// The free-space floor is read at most this often on the write path (estimated in between from
// the bytes written and freed).
constexpr std::chrono::milliseconds kFloorPollEvery{20};

}  // namespace

int64_t CountAndSay(std::atomic<int64_t>& count) {
  const int64_t n = count.fetch_add(1, std::memory_order_relaxed) + 1;
  return (n & (n - 1)) == 0 ? n : 0;
}

Result<std::unique_ptr<FileSpaceKeeper>> FileSpaceKeeper::Open(Config config) {
  const int64_t min_free =
      config.min_free_bytes < 0 ? DefaultMinFreeBytes(config.disk.total) : config.min_free_bytes;
  const int dir = config.dir;
  const std::chrono::milliseconds watch_every = config.watch_every;
  std::unique_ptr<FileSpaceKeeper> keeper(new FileSpaceKeeper(std::move(config)));
  if (min_free > 0) {
    KVTIER_ASSIGN_OR_RETURN(keeper->floor_,
                            DiskFloor::Open(dir, min_free, kFloorPollEvery, watch_every));
  }
  return keeper;
}

FileSpaceKeeper::FileSpaceKeeper(Config config)
    : config_(std::move(config)), allocated_bytes_(AllocatedBytes(config_.page_file_bytes)) {}

FileSpaceKeeper::~FileSpaceKeeper() { Stop(); }

void FileSpaceKeeper::Watch() {
  if (floor_) floor_->Watch([this](int64_t) { MakeRoom(0); });
}

void FileSpaceKeeper::Stop() {
  if (floor_) floor_->Stop();
}

bool FileSpaceKeeper::AdmitWrite() {
  // MakeRoom (a mutex, perhaps a statvfs and evictions) only when the estimate says the floor is
  // near.
  if (!floor_ || floor_->Headroom() >= allocated_bytes_ || MakeRoom(allocated_bytes_)) return true;
  if (const int64_t n = CountAndSay(floor_refused_)) {
    util::Log(util::LogLevel::kWarning,
              "storage {}: the free space is under the store's floor of {} and this store "
              "has no page left to evict: {} page(s) not written so far (others fill the "
              "disk; the floor is StorageOptions::min_free_bytes)",
              config_.url, FormatBytes(floor_->floor()), n);
  }
  return false;
}

void FileSpaceKeeper::NoteWritten() {
  if (floor_) floor_->NoteWritten(allocated_bytes_);
}

bool FileSpaceKeeper::RetryAfterFull(int error) {
  // At least one page's worth; up to the floor when there is one.
  const int64_t evicted = config_.evict(config_.page_file_bytes);
  floor_evicted_.fetch_add(evicted, std::memory_order_relaxed);
  if (floor_) floor_->NoteFreed(evicted * allocated_bytes_);
  const bool room = floor_ ? MakeRoom(allocated_bytes_) : evicted > 0;
  if (const int64_t n = CountAndSay(disk_full_retries_)) {
    util::Log(util::LogLevel::kWarning,
              "storage {}: the file system is full ({}): this store evicted its oldest pages "
              "to make room and wrote again; {} time(s) so far",
              config_.url, std::strerror(error), n);
  }
  return room || evicted > 0;
}

bool FileSpaceKeeper::MakeRoom(int64_t want) {
  std::lock_guard<std::mutex> lock(make_room_mu_);
  if (floor_->Headroom() >= want) return true;
  const int64_t short_by = want - floor_->Headroom(/*fresh=*/true);
  if (short_by <= 0) return true;
  const int64_t pages = (short_by + allocated_bytes_ - 1) / allocated_bytes_;
  const int64_t evicted = config_.evict(pages * config_.page_file_bytes);
  if (evicted == 0) return false;
  floor_->NoteFreed(evicted * allocated_bytes_);
  const int64_t total = floor_evicted_.fetch_add(evicted, std::memory_order_relaxed) + evicted;
  util::Log(util::LogLevel::kInfo,
            "storage {}: the free space fell {} short of the floor of {}: evicted this store's "
            "{} oldest page(s) ({} so far)",
            config_.url, FormatBytes(short_by), FormatBytes(floor_->floor()), evicted, total);
  return evicted >= pages;
}

void FileSpaceKeeper::Fill(StorageStats& stats) const {
  stats.floor_evicted_pages = floor_evicted_.load(std::memory_order_relaxed);
  stats.floor_refused_pages = floor_refused_.load(std::memory_order_relaxed);
  stats.disk_full_retries = disk_full_retries_.load(std::memory_order_relaxed);
  stats.min_free_bytes = floor_bytes();
}

}  // namespace kvtier::storage
