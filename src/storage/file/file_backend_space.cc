// The `file://` backend's capacity and eviction (file_backend_internal.h): the capacity derived
// at open when the URL gives none, the files found at open that are no page (a wrong size)
// removed, the free-space keeper's eviction of the oldest pages, a victim's file detached from
// its place under the index's mutex and left to the reclaimer to unlink (file_reclaimer.h), and
// the reclaimer's bound and threads. The index decides which pages go (file_index.h); this file
// does what going means on disk.
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "storage/file/file_backend_internal.h"
#include "util/log.h"

namespace kvtier::storage {

// With no `capacity` in the URL: the pages this namespace already stores plus half of the room
// left at open: what the file system lets this user write (statvfs f_bavail, allocated blocks),
// less the free-space floor and less the room the other file stores open in this process on
// the same file system have claimed and not filled yet (DiskClaims); at least one page.
int64_t FileBackend::DefaultCapacity(const DiskReading& disk, int64_t min_free,
                                     const std::vector<FileIndex::Found>& found) {
  const int64_t stored = static_cast<int64_t>(found.size()) * value_bytes_;
  const int64_t others = DiskClaims::UnfilledOn(disk.device);
  const int64_t room = std::max<int64_t>(disk.free - min_free - others, 0);
  const int64_t capacity = std::max(value_bytes_, stored + room / 2);
  util::Log(util::LogLevel::kInfo,
            "storage {}: no capacity given; using {} (the {} this namespace already stores "
            "plus half of the {} free at open less the {} floor and the {} other file stores "
            "of this process claim there); set ?capacity= to choose",
            url(), FormatBytes(capacity), FormatBytes(stored), FormatBytes(disk.free),
            FormatBytes(min_free), FormatBytes(others));
  return capacity;
}

// Every file of a page of this namespace is of one size (the namespace fixes the page's bytes);
// a file found at open of any other size (grown, truncated, a sparse giant) is no page: it is
// removed, alone, and said once; it must neither count against the capacity nor have the
// restart evict the real pages to make room for it.
std::vector<FileIndex::Found> FileBackend::RemoveWrongSizeFiles(
    std::vector<FileIndex::Found> found) {
  int64_t removed = 0, failed = 0;
  std::erase_if(found, [&](const FileIndex::Found& f) {
    if (f.bytes == value_bytes_) return false;
    ++(RemoveFile(f.key) ? removed : failed);
    return true;
  });
  if (removed + failed > 0) {
    util::Log(util::LogLevel::kWarning,
              "storage {}: {} page file(s) found at open were not of a page's size ({}): "
              "removed {}, could not remove {} (not indexed)",
              url(), removed + failed, FormatBytes(value_bytes_), removed, failed);
  }
  return found;
}

// The free-space keeper's eviction: this store's least recently used pages (a chain's tail
// first) of at least `bytes`, their files (and every other waiting one) unlinked before it
// returns, so the space they held is free; the pages evicted.
int64_t FileBackend::EvictOldest(int64_t bytes) {
  const int64_t evicted = index_->pages() > 0 ? index_->EvictOldest(bytes) : 0;
  reclaimer_->Drain();
  return evicted;
}

// The index's removal of a victim (evicted, or an orphan dropped), under the index's mutex: the
// page's file is renamed out of its place to a temporary name in its shard directory (a
// directory entry changed: microseconds; the key's path is free at once, so a page written
// again under the key is never what goes), and unlinked later, outside the mutex, by the
// reclaimer (file_reclaimer.h: its threads, or a writer when too many wait). The unlink frees
// the file's blocks and page cache — waiting, on ext4, for any of its pages still under
// writeback — and ran under the mutex, which every writer's Put and NextStamp need, for as
// long; then on the writer's thread after its Put, the largest phase of a Set. A process that
// dies between the two leaves a temporary file the next open removes (its writer is gone).
// Where the rename fails for another reason than the file being gone, the file is unlinked at
// once, as before.
void FileBackend::DetachFile(const PageKey& key) {
  const std::string hex = key.Hex();
  Fd shard = OpenShard(hex, /*create=*/false);
  if (!shard.ok()) return;
  std::string temp =
      fmt::format("{}{}.{}.{}", kTempPrefix, ::getpid(), temp_counter_.fetch_add(1), hex);
  if (::renameat(shard.get(), hex.c_str(), shard.get(), temp.c_str()) != 0) {
    if (errno != ENOENT) ::unlinkat(shard.get(), hex.c_str(), 0);
    return;
  }
  reclaimer_->Add(std::move(shard), std::move(temp), value_bytes_);
}

// The reclaimer's bound (file_reclaimer.h): 64 page files in a store of at least 1024 (at most
// 6 % of its pages kept out of the index; 1 % of a 48 GiB store of 8 MiB pages), 4 per I/O
// thread of the default 16. A smaller store (tests', tiny ones) keeps every page it can hold and
// its writers unlink, as before the reclaimer: bound 0.
int64_t FileBackend::ReclaimBound(int64_t capacity) const {
  return capacity / value_bytes_ >= kReclaimMinPages ? kReclaimFiles * value_bytes_ : 0;
}

// Half the I/O threads, 1 to 8: an unlink is the kernel freeing a file's blocks and page cache
// (10.7 ms of an 8 MiB page in the H100 bench, 36.5 ms in its replay), so keeping up with
// writers that take ~4 ms a page needs several unlinking at once; they wait in the kernel, and
// when they fall behind the writers unlink too (file_reclaimer.h), so none is ever lost.
int FileBackend::ReclaimThreads() const {
  const int io = options().io_threads > 0 ? options().io_threads : DefaultIoThreads();
  return std::clamp(io / 2, 1, 8);
}

}  // namespace kvtier::storage
