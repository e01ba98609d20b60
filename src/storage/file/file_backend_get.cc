// The `file://` backend's Get path and Exists (file_backend_internal.h): a page's file opened
// beneath the root and checked (a regular file of the page file's size), its bytes read and checked
// by the page I/O (file_page_io.h: on this I/O thread, or a batch on its io_uring), the hit marked
// in the index (its stamp written to the file behind the reads by the stamper: WriteStamp), a
// sample of the reads profiled and said at close (LogReadProfile). A page absent, corrupt or not
// readable is a miss with its PageStatus, never an error of the batch; Exists adds pages another
// process wrote to the index as it finds them.
#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "storage/file/file_backend_internal.h"
#include "storage/page_format.h"
#include "util/log.h"

namespace kvtier::storage {

ExistsResult FileBackend::DoExists(std::span<const PageKey> keys, Clock::time_point deadline) {
  ExistsResult r;
  for (const PageKey& key : keys) {
    if (!index_->Contains(key)) {
      // Perhaps written by another process: one open, a stat and one read of the header's
      // bytes (the parent it names, so this process evicts the page after its children too).
      // O_NONBLOCK: a FIFO put in its place must not block the open.
      if (Clock::now() > deadline) break;
      Fd fd(OpenPageForRead(key, O_NONBLOCK));
      struct stat st;
      if (!fd.ok() || ::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode)) break;
      FileIndex::Found found{key, st.st_size,
                             int64_t{st.st_mtim.tv_sec} * 1'000'000'000 + st.st_mtim.tv_nsec};
      ReadFoundHeader(fd.get(), namespace_hash_, found);
      if (index_->AddFound(key, found.bytes, found.stamp, found.parent) && !found.parent) {
        NoteFoundWithoutParent(found.version);
      }
    }
    ++r.leading;
  }
  return r;
}

void FileBackend::DoGet(std::span<const PageKey> keys, std::span<const PageBuffer> buffers,
                        std::span<PageStatus> out, Clock::time_point deadline) {
#if KVTIER_HAVE_URING
  // Direct reads straight into the caller's buffers need them 4 KiB-aligned; otherwise each
  // page goes through a bounce buffer on the thread path.
  if (config_.direct ? std::all_of(buffers.begin(), buffers.end(), DirectAligned)
                     : config_.io_uring) {
    if (io_uring* ring = PageFileIo::ThreadRing()) {
      GetWithUring(*ring, keys, buffers, out, deadline);
      return;
    }
  }
#endif
  ParallelFor(static_cast<int64_t>(keys.size()), [&](int64_t i) {
    const size_t k = static_cast<size_t>(i);
    out[k] = Clock::now() > deadline ? PageStatus::kTimedOut : GetOne(keys[k], buffers[k]);
  });
}

// One page on this I/O thread (the thread path of file_page_io.h); a hit is stamped. One page
// in ReadProfile::kSampleEvery of each thread has its time profiled (profile_).
PageStatus FileBackend::GetOne(const PageKey& key, const PageBuffer& buffer) {
  thread_local uint32_t pages = 0;
  const bool profiled = pages++ % ReadProfile::kSampleEvery == 0;
  const ThreadTimes start = profiled ? ThreadTimes::Now(/*start=*/true) : ThreadTimes();
  PageRead read;
  PageStatus st = OpenForRead(key, buffer, read);
  const Clock::time_point opened = profiled ? Clock::now() : Clock::time_point();
  if (st == PageStatus::kOk) st = io_.ReadPage(key, buffer, read);
  const Clock::time_point checked = profiled ? Clock::now() : Clock::time_point();
  if (st == PageStatus::kOk) {
    MarkHit(key, read);
    if (read.source == ReadSource::kCache) cached_pages_.fetch_add(1, std::memory_order_relaxed);
    if (read.source == ReadSource::kDisk) disk_pages_.fetch_add(1, std::memory_order_relaxed);
  }
  if (profiled)
    profile_.Add(start, opened, checked, ThreadTimes::Now(/*start=*/false), st == PageStatus::kOk);
  return st;
}

// Opens the page's file for `read`; kOk, or the page's outcome.
PageStatus FileBackend::OpenForRead(const PageKey& key, const PageBuffer& buffer, PageRead& read) {
  // O_NONBLOCK: a FIFO or device put in place of a page must not block the open.
  read.fd = OpenPageForRead(key, O_NONBLOCK | (config_.direct ? O_DIRECT : 0));
  if (read.fd < 0) {
    if (errno == ENOENT) {
      index_->Erase(key);
      return PageStatus::kAbsent;
    }
    // A symlink on the path (ELOOP), a path leaving the root (EXDEV), a shard that is not a
    // directory (ENOTDIR): never followed, a miss.
    // With direct=1, EINVAL: something that takes no O_DIRECT (a FIFO, a device) in its place.
    return errno == ELOOP || errno == EXDEV || errno == ENOTDIR ||
                   (config_.direct && errno == EINVAL)
               ? PageStatus::kCorrupt
               : PageStatus::kFailed;
  }
  struct stat st;
  if (::fstat(read.fd, &st) != 0) return PageStatus::kFailed;
  if (!S_ISREG(st.st_mode)) return PageStatus::kCorrupt;
  if (st.st_size != value_bytes_) return PageStatus::kCorrupt;  // truncated or too long
  read.mtime_ns = int64_t{st.st_mtim.tv_sec} * 1'000'000'000 + st.st_mtim.tv_nsec;
  io_.PrepareRead(buffer, read);
  return PageStatus::kOk;
}

// Stamps a page just read and checked as the most recently used, with the parent its header
// named (from the read: a page another process wrote, new to this index, gets its parent). The
// index takes the new stamp, at once or, while a writer holds it (removing a victim's file),
// queued and applied before its next eviction decision: a read never waits for it (issue 23).
// The file's mtime, when the one the open saw is more than kStampGranularityNs older than that
// stamp, is left to the stamper (the index's on_touched: written behind the reads, no inode
// write here).
void FileBackend::MarkHit(const PageKey& key, const PageRead& read) {
  if (read.version == kPageFormatV1 && !index_->Contains(key)) {
    NoteFoundWithoutParent(read.version);
  }
  index_->Touch(key, value_bytes_, read.parent, read.mtime_ns);
}

// Counts a page another process wrote that a lookup added to the index with no parent because
// its header is of version 1 (`version`) or does not check out (0): a root of the eviction
// order, as LogOldPages says of such pages found at open. Logged at the 1st, 2nd, 4th, ... of
// each kind, so a directory full of old pages costs a few lines, not one per page.
void FileBackend::NoteFoundWithoutParent(uint16_t version) {
  std::atomic<int64_t>& count = version == kPageFormatV1 ? found_v1_ : found_unreadable_;
  const int64_t n = count.fetch_add(1, std::memory_order_relaxed) + 1;
  if ((n & (n - 1)) != 0) return;
  util::Log(util::LogLevel::kInfo,
            "storage {}: {} page(s) another process wrote, found by a lookup, {}; they are "
            "evicted in plain LRU order",
            url(), n,
            version == kPageFormatV1 ? "are of page format version 1 (no parent recorded)"
                                     : "have a header that does not check out (misses when read)");
}

// The stamper's write of a hit's `stamp` as its page file's mtime. Checked and written through
// one open file, so both see the same inode: a Set never changes a stored file but renames a
// new one (with a newer stamp: NextStamp's are increasing) over it, and a file removed and
// written again is a new inode too; so the stamp lands either on the file that was hit (still
// in place, or replaced meanwhile: then on the unlinked old inode, harmlessly) and only when
// that file's mtime is older than the stamp, never on a file written after the hit. A file
// gone (evicted) is skipped. Best effort: a read-only store still serves hits. (Another process
// sharing the directory may stamp the same file between this fstat and futimens; stamps of two
// processes compare only as far as their clocks agree anyway.)
HitStamper::Outcome FileBackend::WriteStamp(const PageKey& key, int64_t stamp) {
  Fd fd(OpenPageForRead(key, O_NONBLOCK));  // beneath the root, no symlink followed
  struct stat st;
  if (!fd.ok() || ::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode) ||
      int64_t{st.st_mtim.tv_sec} * 1'000'000'000 + st.st_mtim.tv_nsec >= stamp) {
    return HitStamper::Outcome::kSkipped;
  }
  const timespec times[2] = {{0, UTIME_OMIT}, ToTimespec(stamp)};
  return ::futimens(fd.get(), times) == 0 ? HitStamper::Outcome::kWritten
                                          : HitStamper::Outcome::kSkipped;
}

// Says, when the profiled reads on the thread path took 0.25 s or more in all, where their
// time went:
// the question of issue 23 (hot reads slow beside heavy writes) is whether a read waits in the
// kernel (sleeps: a lock, the journal, the disk), waits for a core (preemptions, CPU time well
// under the wall time) or runs slowly on one (CPU time about the wall time).
void FileBackend::LogReadProfile() const {
  const ReadProfile::Totals t = profile_.Get();
  const HitStamper::Counts c = stamper_.counts();
  const FileIndex::TouchCounts tc = index_ ? index_->touch_counts() : FileIndex::TouchCounts();
  const std::string stamps = fmt::format(
      "hit stamps written behind the reads: {} written, {} skipped (file gone, newer or "
      "refused), {} dropped (pending map full), {} left at close; touches of the index: {} at "
      "once, {} deferred behind a writer, {} dropped (queue full)",
      c.written, c.skipped, c.dropped, c.left, tc.at_once, tc.deferred, tc.dropped);
  if (t.wall_ns < 250'000'000 || t.pages == 0) {
    if (c.written + c.skipped + c.dropped + c.left + tc.deferred > 0) {
      util::Log(util::LogLevel::kInfo, "storage {}: {}", url(), stamps);
    }
    return;
  }
  const double wall = static_cast<double>(t.wall_ns);
  const double payload = double(t.hits) * double(value_bytes_ - int64_t{kFilePayloadOffset});
  auto pct = [&](int64_t ns) { return 100.0 * static_cast<double>(ns) / wall; };
  auto per100 = [&](int64_t n) { return 100.0 * static_cast<double>(n) / double(t.pages); };
  util::Log(util::LogLevel::kInfo,
            "storage {}: Get on the thread path, 1 page in {} profiled: {} pages ({} hits, "
            "{:.2f} GB of payload) in {:.2f} s inside them, all threads summed ({:.2f} GB/s a "
            "thread); of that time open+fstat {:.1f} %, read+check {:.1f} %, stamp {:.1f} %; "
            "on a core {:.1f} %, waiting for a core {}; {:.1f} sleeps (blocked in the kernel) "
            "and {:.1f} preemptions (runnable, no core) per 100 pages; {}",
            url(), ReadProfile::kSampleEvery, t.pages, t.hits, payload / 1e9, wall / 1e9,
            payload / wall, pct(t.open_ns), pct(t.read_ns), pct(t.stamp_ns), pct(t.cpu_ns),
            t.run_delay_pages == t.pages ? fmt::format("{:.1f} %", pct(t.run_delay_ns))
                                         : std::string("unknown"),
            per100(t.sleeps), per100(t.preemptions), stamps);
}

#if KVTIER_HAVE_URING
// The batch's pages opened here, then read together on this I/O thread's ring
// (PageFileIo::ReadBatchWithUring); each hit is stamped as its read is checked.
void FileBackend::GetWithUring(io_uring& ring, std::span<const PageKey> keys,
                               std::span<const PageBuffer> buffers, std::span<PageStatus> out,
                               Clock::time_point deadline) {
  std::vector<PageRead> reads(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    out[i] = Clock::now() > deadline ? PageStatus::kTimedOut
                                     : OpenForRead(keys[i], buffers[i], reads[i]);
  }
  io_.ReadBatchWithUring(ring, keys, buffers, reads, out, deadline,
                         [&](size_t i) { MarkHit(keys[i], reads[i]); });
}
#endif

}  // namespace kvtier::storage
