// The `file://` backend (file_backend.h): the store's requests and its paths and files (opening,
// publishing, removing and stamping them). Which pages are stored, their LRU order and the
// capacity live in the index (file_index.h); a page file's bytes and their checks in the page I/O
// (file_page_io.h); whole reads/writes and opens beneath the store root in file_io.h; hits'
// stamps written behind the reads in hit_stamper.h; the sampled Get profile in read_profile.h;
// the free-space floor and what a full disk does (evicting through the index) in
// file_space_keeper.h.
//
// Paths: the backend holds the store root open (`root_`, reopened by path if the root is removed
// while running) and reaches every file through OpenBeneath from it: "<ns>/<shard>/<hex>" for a
// page, "<ns>/<shard>" for the directory a Set writes its temporary file in and renames it in.
// A symlink anywhere below the root fails that open: a Get of such a page is kCorrupt, a Set
// into a shard that is a symlink kFailed (with a warning), so nothing is written outside the
// store.
//
// Thread safety: the index has its own mutex, the stamper its own; `root_` is swapped under
// `dirs_mu_` and read through an atomic shared_ptr; `noatime_` is a relaxed atomic that only goes
// from true to false; files are reached only through open/rename/unlink, which the kernel orders.
#include "storage/file/file_backend.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <pthread.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <utility>
#include <vector>

#if KVTIER_HAVE_URING
#include <liburing.h>
#endif

#include "storage/file/disk_space.h"
#include "storage/file/file_index.h"
#include "storage/file/file_io.h"
#include "storage/file/file_page_io.h"
#include "storage/file/file_reclaimer.h"
#include "storage/file/file_space_keeper.h"
#include "storage/file/hit_stamper.h"
#include "storage/file/read_profile.h"
#include "storage/file/write_profile.h"
#include "storage/page_format.h"
#include "storage/page_pins.h"
#include "storage/storage_url.h"
#include "util/log.h"

namespace kvtier::storage {
namespace {

using Clock = std::chrono::steady_clock;

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

timespec ToTimespec(int64_t ns) {
  return timespec{static_cast<time_t>(ns / 1'000'000'000), static_cast<long>(ns % 1'000'000'000)};
}

// mkdir with 0700; an existing directory is fine.
bool MakeDir(const std::string& path) {
  return ::mkdir(path.c_str(), 0700) == 0 || errno == EEXIST;
}

// Creates `path` and its missing parents (0700 each). The root is the user's path: symlinks in
// it are followed, as for any path a user names.
Status MakeDirs(const std::string& path) {
  for (size_t at = 1; at <= path.size(); ++at) {
    if (at < path.size() && path[at] != '/') continue;
    const std::string prefix = path.substr(0, at);
    if (!MakeDir(prefix)) {
      return Status::IOError(
          fmt::format("cannot create directory {}: {}", prefix, std::strerror(errno)));
    }
  }
  struct stat st;
  if (::stat(path.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return Status::IOError(fmt::format("{} is not a directory", path));
  }
  return Status::OK();
}

// A write past the process's file-size limit (RLIMIT_FSIZE, `ulimit -f`) raises SIGXFSZ, whose
// default action ends the process. The store's writes run on its I/O threads: each blocks SIGXFSZ
// for itself before its first write, so such a write fails with EFBIG (a failed Set) and the
// signal stays pending on that thread, never delivered (it is directed at the writing thread,
// and dropped when the thread ends). The process's disposition of SIGXFSZ and every other
// thread's mask are left as they are.
void BlockFileSizeSignalOnThisThread() {
  thread_local bool blocked = false;
  if (blocked) return;
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGXFSZ);
  blocked = ::pthread_sigmask(SIG_BLOCK, &set, nullptr) == 0;
}

class FileBackend final : public StorageBackend {
 public:
  struct Config {
    std::string root;                 // the URL's directory
    std::optional<int64_t> capacity;  // bytes of files in this namespace's directory
    bool fsync = false;
    bool io_uring = false;  // reads through io_uring (when built with liburing)
    bool direct = false;    // O_DIRECT reads and writes (direct=1; with io_uring where present)
  };

  FileBackend(std::string url, const StorageNamespace& ns, const StorageOptions& options,
              Config config)
      : StorageBackend(std::move(url), ns, options),
        config_(std::move(config)),
        ns_name_(ns.Name()),
        namespace_hash_(ns.Hash()),
        value_bytes_(static_cast<int64_t>(kFilePayloadOffset) + ns.page_bytes()),
        io_(namespace_hash_, value_bytes_, config_.direct),
        stamper_(StampLimit(), StampWakeAt(), StampPeriod(),
                 [this](const PageKey& key, int64_t stamp) { return WriteStamp(key, stamp); }) {}
  ~FileBackend() override {
    Close();
    LogReadProfile();
  }

  HitStamper::Counts stamp_counts() const { return stamper_.counts(); }
  std::optional<FileReclaimer::Counts> reclaim_counts() const {
    if (!reclaimer_) return std::nullopt;
    return reclaimer_->counts();
  }

  Status Open() {
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

 protected:
  ExistsResult DoExists(std::span<const PageKey> keys, Clock::time_point deadline) override {
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

  void DoGet(std::span<const PageKey> keys, std::span<const PageBuffer> buffers,
             std::span<PageStatus> out, Clock::time_point deadline) override {
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

  void DoSet(std::span<const PageKey> keys, std::span<const PageBuffer> buffers,
             std::span<PageStatus> out, Clock::time_point deadline) override {
    ParallelFor(static_cast<int64_t>(keys.size()), [&](int64_t i) {
      const size_t k = static_cast<size_t>(i);
      out[k] = Clock::now() > deadline ? PageStatus::kTimedOut : SetOne(keys[k], buffers[k]);
    });
  }

  // The index records each page's parent: eviction takes a chain's tail first (file_index.h). A
  // page whose parent this store evicted is not written (OrphansToSkip); one whose parent went
  // while the batch ran is dropped after it (DropOrphans).
  void DoSetChained(std::span<const PageKey> keys, std::span<const PageBuffer> buffers,
                    std::span<const std::optional<PageKey>> parents, std::span<PageStatus> out,
                    Clock::time_point deadline) override {
    const std::vector<uint8_t> skip = OrphansToSkip(
        keys, parents, [this](const PageKey& p) { return !WritePending(p) && index_->Gone(p); });
    ParallelFor(static_cast<int64_t>(keys.size()), [&](int64_t i) {
      const size_t k = static_cast<size_t>(i);
      out[k] = skip[k]                   ? PageStatus::kSkipped
               : Clock::now() > deadline ? PageStatus::kTimedOut
                                         : SetOne(keys[k], buffers[k], parents[k]);
    });
    DropOrphans(
        keys, parents, out, [this](const PageKey& p) { return WritePending(p); },
        [this](const PageKey& k, const PageKey& p, bool in_batch) {
          return index_->DropOrphan(k, p, in_batch);
        });
    reclaimer_->Relieve();
  }

  void DoRemove(std::span<const PageKey> keys, std::span<PageStatus> out,
                Clock::time_point deadline) override {
    for (size_t i = 0; i < keys.size(); ++i) {
      if (Clock::now() > deadline) {
        out[i] = PageStatus::kTimedOut;
        continue;
      }
      index_->Erase(keys[i]);
      out[i] = RemoveFile(keys[i]) ? PageStatus::kOk : PageStatus::kFailed;
    }
  }

  Result<uint64_t> DoPinPages(std::span<const PageKey> keys,
                              std::chrono::nanoseconds ttl) override {
    return pins_.Add(keys, ttl);
  }
  Status DoUnpinPages(uint64_t pin) override {
    if (pins_.Remove(pin)) return Status::OK();
    return Status::InvalidArgument(fmt::format("UnpinPages: no live pin {}", pin));
  }

  // The namespace directory's page files (the restart scan's walk: every process's pages).
  Result<std::vector<PageKey>> DoStoredKeys() override {
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
  void DoClose() override {
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

  void FillStats(StorageStats& stats) const override {
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

 private:
  std::shared_ptr<const Fd> Root() const { return std::atomic_load(&root_); }

  // Creates the root directory (and its parents) and holds it open.
  Status OpenRoot() {
    KVTIER_RETURN_IF_ERROR(MakeDirs(config_.root));
    const int fd = ::open(config_.root.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) {
      return Status::IOError(
          fmt::format("cannot open directory {}: {}", config_.root, std::strerror(errno)));
    }
    std::atomic_store(&root_, std::shared_ptr<const Fd>(std::make_shared<Fd>(fd)));
    return Status::OK();
  }

  // Says once how many pages found at open carry no parent: of format version 1 (written before
  // headers named parents) or with a header that does not check out. They are roots of the
  // eviction order (plain LRU among the leaves) until written again.
  void LogOldPages(const std::vector<FileIndex::Found>& found) const {
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

  // The namespace directory beneath the root, made if missing; the root made again first if it
  // was removed while we ran.
  Status EnsureNamespaceDir(Fd* out) {
    for (int attempt = 0; attempt < 2; ++attempt) {
      const auto root = Root();  // held: a concurrent reopen must not close it under us
      if (::mkdirat(root->get(), ns_name_.c_str(), 0700) == 0 || errno == EEXIST) {
        Fd fd(OpenBeneath(root->get(), {ns_name_}, O_RDONLY | O_DIRECTORY));
        if (fd.ok()) {
          *out = std::move(fd);
          return Status::OK();
        }
        const int error = errno;
        struct stat st;
        const bool symlink =
            ::fstatat(root->get(), ns_name_.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 &&
            S_ISLNK(st.st_mode);
        return Status::IOError(fmt::format(
            "cannot open {}/{}: {}", config_.root, ns_name_,
            symlink ? "it is a symlink, which a store never follows" : std::strerror(error)));
      }
      if (errno != ENOENT || attempt > 0) break;
      KVTIER_RETURN_IF_ERROR(OpenRoot());  // the root was removed: make it again
    }
    return Status::IOError(
        fmt::format("cannot create {}/{}: {}", config_.root, ns_name_, std::strerror(errno)));
  }

  // With no `capacity` in the URL: the pages this namespace already stores plus half of the room
  // left at open: what the file system lets this user write (statvfs f_bavail, allocated blocks),
  // less the free-space floor and less the room the other file stores open in this process on
  // the same file system have claimed and not filled yet (DiskClaims); at least one page.
  int64_t DefaultCapacity(const DiskReading& disk, int64_t min_free,
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
  std::vector<FileIndex::Found> RemoveWrongSizeFiles(std::vector<FileIndex::Found> found) {
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

  // The shard directory of `hex` beneath the root; with `create`, made (with the namespace
  // directory, and the root if it was removed) when missing. -1 with errno on failure (ELOOP when
  // a symlink is on the path).
  Fd OpenShard(const std::string& hex, bool create) {
    const std::string_view shard = std::string_view(hex).substr(0, 2);
    Fd fd(OpenBeneath(Root()->get(), {ns_name_, shard}, O_RDONLY | O_DIRECTORY));
    if (fd.ok() || errno != ENOENT || !create) return fd;
    std::lock_guard<std::mutex> lock(dirs_mu_);
    Fd ns_dir;
    if (!EnsureNamespaceDir(&ns_dir).ok()) return Fd();
    if (::mkdirat(ns_dir.get(), std::string(shard).c_str(), 0700) != 0 && errno != EEXIST) {
      return Fd();
    }
    return Fd(OpenBeneath(ns_dir.get(), {shard}, O_RDONLY | O_DIRECTORY));
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
  void DetachFile(const PageKey& key) {
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
  int64_t ReclaimBound(int64_t capacity) const {
    return capacity / value_bytes_ >= kReclaimMinPages ? kReclaimFiles * value_bytes_ : 0;
  }
  static constexpr int64_t kReclaimMinPages = 1024, kReclaimFiles = 64;
  // Half the I/O threads, 1 to 8: an unlink is the kernel freeing a file's blocks and page cache
  // (10.7 ms of an 8 MiB page in the H100 bench, 36.5 ms in its replay), so keeping up with
  // writers that take ~4 ms a page needs several unlinking at once; they wait in the kernel, and
  // when they fall behind the writers unlink too (file_reclaimer.h), so none is ever lost.
  int ReclaimThreads() const {
    const int io = options().io_threads > 0 ? options().io_threads : DefaultIoThreads();
    return std::clamp(io / 2, 1, 8);
  }

  // Unlinks a page's file (evicted or removed); true when it is gone (or was never there).
  bool RemoveFile(const PageKey& key) {
    const std::string hex = key.Hex();
    Fd shard = OpenShard(hex, /*create=*/false);
    if (!shard.ok()) return errno == ENOENT;
    return ::unlinkat(shard.get(), hex.c_str(), 0) == 0 || errno == ENOENT;
  }

  // Opens the page file of `key` read-only beneath the root with `flags` added, and O_NOATIME:
  // a read does not write the file's atime (an inode write, on ext4 a journal handle, on every
  // read of a file whose mtime a hit moved past its atime). O_NOATIME is refused (EPERM) for a
  // file this process does not own (a store another user wrote, without CAP_FOWNER): that open
  // is made again without it, and once that works this backend opens without it from then on
  // (said once in the log). -1 with errno on failure.
  int OpenPageForRead(const PageKey& key, int flags) {
    const std::string hex = key.Hex();
    const auto root = Root();  // held: a concurrent reopen must not close it under us
    auto open = [&](int extra) {
      return OpenBeneath(root->get(), {ns_name_, std::string_view(hex).substr(0, 2), hex},
                         O_RDONLY | flags | extra);
    };
    if (!noatime_.load(std::memory_order_relaxed)) return open(0);
    const int fd = open(O_NOATIME);
    if (fd >= 0 || errno != EPERM) return fd;
    const int plain = open(0);
    if (plain >= 0 && noatime_.exchange(false, std::memory_order_relaxed)) {
      util::Log(util::LogLevel::kInfo,
                "storage {}: a page file is not this user's (O_NOATIME refused): pages are read "
                "without O_NOATIME from now on, so a read may update a file's atime",
                url());
    }
    return plain;
  }

  // Opens the page's file for `read`; kOk, or the page's outcome.
  PageStatus OpenForRead(const PageKey& key, const PageBuffer& buffer, PageRead& read) {
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
  void MarkHit(const PageKey& key, const PageRead& read) {
    if (read.version == kPageFormatV1 && !index_->Contains(key)) {
      NoteFoundWithoutParent(read.version);
    }
    index_->Touch(key, value_bytes_, read.parent, read.mtime_ns);
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
  HitStamper::Outcome WriteStamp(const PageKey& key, int64_t stamp) {
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

  static size_t StampLimit() {
    const size_t limit = test_stamp_limit.load(std::memory_order_relaxed);
    return limit > 0 ? limit : kStampPendingLimit;
  }
  static size_t StampWakeAt() {
    const size_t wake_at = test_stamp_wake_at.load(std::memory_order_relaxed);
    return wake_at > 0 ? wake_at : std::min(kStampWakeAt, std::max<size_t>(StampLimit() / 2, 1));
  }
  static Clock::duration StampPeriod() {
    const int64_t ms = test_stamp_period_ms.load(std::memory_order_relaxed);
    return ms > 0 ? Clock::duration(std::chrono::milliseconds(ms)) : kStampPeriod;
  }

  // Counts a page another process wrote that a lookup added to the index with no parent because
  // its header is of version 1 (`version`) or does not check out (0): a root of the eviction
  // order, as LogOldPages says of such pages found at open. Logged at the 1st, 2nd, 4th, ... of
  // each kind, so a directory full of old pages costs a few lines, not one per page.
  void NoteFoundWithoutParent(uint16_t version) {
    std::atomic<int64_t>& count = version == kPageFormatV1 ? found_v1_ : found_unreadable_;
    const int64_t n = count.fetch_add(1, std::memory_order_relaxed) + 1;
    if ((n & (n - 1)) != 0) return;
    util::Log(util::LogLevel::kInfo,
              "storage {}: {} page(s) another process wrote, found by a lookup, {}; they are "
              "evicted in plain LRU order",
              url(), n,
              version == kPageFormatV1
                  ? "are of page format version 1 (no parent recorded)"
                  : "have a header that does not check out (misses when read)");
  }

  // One page on this I/O thread (the thread path of file_page_io.h); a hit is stamped. One page
  // in ReadProfile::kSampleEvery of each thread has its time profiled (profile_).
  PageStatus GetOne(const PageKey& key, const PageBuffer& buffer) {
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
      profile_.Add(start, opened, checked, ThreadTimes::Now(/*start=*/false),
                   st == PageStatus::kOk);
    return st;
  }

  // Says, when the profiled reads on the thread path took 0.25 s or more in all, where their
  // time went:
  // the question of issue 23 (hot reads slow beside heavy writes) is whether a read waits in the
  // kernel (sleeps: a lock, the journal, the disk), waits for a core (preemptions, CPU time well
  // under the wall time) or runs slowly on one (CPU time about the wall time).
  void LogReadProfile() const {
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
  void GetWithUring(io_uring& ring, std::span<const PageKey> keys,
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

  // ---- direct I/O (direct=1) ----------------------------------------------------------------

  // O_DIRECT works on the store's file system (tmpfs, for one, refuses it).
  Status ProbeDirect(int ns_dirfd) {
    const std::string probe = fmt::format("{}{}.direct-probe", kTempPrefix, ::getpid());
    Fd fd(::openat(ns_dirfd, probe.c_str(),
                   O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW | O_DIRECT, 0600));
    const int error = errno;
    ::unlinkat(ns_dirfd, probe.c_str(), 0);
    if (!fd.ok()) {
      return Status::InvalidArgument(fmt::format(
          "storage URL '{}': direct=1, but the file system of {} does not take O_DIRECT ({}); "
          "leave direct out",
          url(), config_.root, std::strerror(error)));
    }
    return Status::OK();
  }

  // A page written (SetOne) or refused: kNoSpace when the page is larger than the capacity, when
  // the free space is under the floor and evicting this store's pages does not bring it back,
  // or when the file system is full (ENOSPC, EDQUOT: its oldest pages are evicted and the write
  // is tried once more): file_space_keeper.h.
  PageStatus SetOne(const PageKey& key, const PageBuffer& buffer,
                    const std::optional<PageKey>& parent = std::nullopt) {
    if (value_bytes_ > index_->capacity()) return PageStatus::kNoSpace;
    BlockFileSizeSignalOnThisThread();
    if (!space_->AdmitWrite()) return PageStatus::kNoSpace;
    int error = 0;
    PageStatus st = WriteOne(key, buffer, parent, error);
    if (st != PageStatus::kNoSpace) return st;
    if (!space_->RetryAfterFull(error)) return PageStatus::kNoSpace;
    return WriteOne(key, buffer, parent, error);
  }

  // The free-space keeper's eviction: this store's least recently used pages (a chain's tail
  // first) of at least `bytes`, their files (and every other waiting one) unlinked before it
  // returns, so the space they held is free; the pages evicted.
  int64_t EvictOldest(int64_t bytes) {
    const int64_t evicted = index_->pages() > 0 ? index_->EvictOldest(bytes) : 0;
    reclaimer_->Drain();
    return evicted;
  }

  // One attempt at writing a page: a temporary file in its shard directory, renamed into place.
  // kNoSpace with `error` ENOSPC or EDQUOT when the file system has no room (said by SetOne, not
  // here), kFailed with a warning for any other failure (EFBIG past the file-size limit: said at
  // the 1st, 2nd, 4th ... time, as a full disk is). Every phase's time goes into write_profile_
  // (StorageStats' set_*_seconds).
  PageStatus WriteOne(const PageKey& key, const PageBuffer& buffer,
                      const std::optional<PageKey>& parent, int& error) {
    const auto full = [](int e) { return e == ENOSPC || e == EDQUOT; };
    using WClock = WriteProfile::Clock;
    const WClock::time_point start = WClock::now();
    const std::string hex = key.Hex();
    Fd shard = OpenShard(hex, /*create=*/true);
    if (!shard.ok()) {
      error = errno;
      if (full(error)) return PageStatus::kNoSpace;
      util::Log(util::LogLevel::kWarning, "storage {}: cannot open the directory {}/{}: {}", url(),
                ns_name_, hex.substr(0, 2),
                error == ELOOP ? "a symlink is on its path, which a store never follows"
                               : std::strerror(error));
      return PageStatus::kFailed;
    }
    const std::string temp =
        fmt::format("{}{}.{}.{}", kTempPrefix, ::getpid(), temp_counter_.fetch_add(1), hex);
    Fd fd(::openat(
        shard.get(), temp.c_str(),
        O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW | (config_.direct ? O_DIRECT : 0),
        0600));
    if (!fd.ok()) {
      error = errno;
      if (full(error)) return PageStatus::kNoSpace;
      util::Log(util::LogLevel::kWarning, "storage {}: cannot create {}/{}/{}: {}", url(), ns_name_,
                hex.substr(0, 2), temp, std::strerror(error));
      return PageStatus::kFailed;
    }
    const WClock::time_point opened = WClock::now();
    WriteTimes io;
    bool ok = io_.WritePage(fd.get(), key, buffer, parent, &io);
    const WClock::time_point written = WClock::now();
    ok = ok && (!config_.fsync || ::fdatasync(fd.get()) == 0);
    const WClock::time_point synced = config_.fsync ? WClock::now() : written;
    // Room in the reclaimer for the one file this write may detach (the page its Put evicts, or
    // the key's older file it replaces): the waiting files stay within their bound, so the files
    // on disk within the capacity. Unlinks on this thread only when the reclaimer falls behind.
    reclaimer_->Reserve(value_bytes_);
    struct Room {
      FileReclaimer& r;
      int64_t bytes;
      ~Room() { r.Release(bytes); }
    } room{*reclaimer_, value_bytes_};
    const WClock::time_point reserved = WClock::now();
    int64_t stamp = 0;
    bool replaced = false;  // the key's older file swapped out to `temp` (PublishFile)
    if (ok) {
      stamp = index_->NextStamp();
      const timespec times[2] = {{0, UTIME_OMIT}, ToTimespec(stamp)};
      ok = ::futimens(fd.get(), times) == 0 &&
           PublishFile(shard.get(), temp.c_str(), hex.c_str(), &replaced);
    }
    if (!ok) {
      error = errno;
      ::unlinkat(shard.get(), temp.c_str(), 0);
      if (full(error)) return PageStatus::kNoSpace;
      if (error == EFBIG) {  // every page fails alike: said as a full disk is, not per page
        if (const int64_t n = CountAndSay(file_too_large_)) {
          util::Log(util::LogLevel::kWarning,
                    "storage {}: cannot write a page file of {} bytes: {} (the process's file-size "
                    "limit, ulimit -f, is below it); {} page(s) not written so far",
                    url(), value_bytes_, std::strerror(error), n);
        }
        return PageStatus::kFailed;
      }
      util::Log(util::LogLevel::kWarning, "storage {}: cannot write {}/{}/{}: {}", url(), ns_name_,
                hex.substr(0, 2), hex, std::strerror(error));
      return PageStatus::kFailed;
    }
    if (config_.fsync) ::fsync(shard.get());
    // The older file of the key, swapped out: unlinked by the reclaimer, as the evicted ones.
    if (replaced) reclaimer_->Add(std::move(shard), temp, value_bytes_);
    const WClock::time_point published = WClock::now();
    space_->NoteWritten();
    index_->Put(key, value_bytes_, stamp, parent);
    const WClock::time_point indexed = WClock::now();
    reclaimer_->Relieve();  // files detached beyond the reservations (none, mostly)
    // The unlink phase: what this writer unlinked itself, making room and after its Put.
    write_profile_.Add(WriteProfile::Ns(opened - start), io, WriteProfile::Ns(synced - written),
                       WriteProfile::Ns(published - reserved),
                       WriteProfile::Ns(indexed - published),
                       WriteProfile::Ns((reserved - synced) + (WClock::now() - indexed)));
    return PageStatus::kOk;
  }

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

}  // namespace

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

Result<std::unique_ptr<StorageBackend>> OpenFileStorage(std::string_view url,
                                                        const StorageNamespace& ns,
                                                        const StorageOptions& options) {
  KVTIER_ASSIGN_OR_RETURN(StorageUrl parsed, ParseStorageUrl(url));
  FileBackend::Config config;
  KVTIER_ASSIGN_OR_RETURN(std::optional<int64_t> capacity, parsed.TakeByteSize("capacity"));
  KVTIER_ASSIGN_OR_RETURN(std::optional<bool> fsync, parsed.TakeBool("fsync"));
  const std::optional<std::string> io = parsed.Take("io");
  KVTIER_ASSIGN_OR_RETURN(std::optional<bool> direct, parsed.TakeBool("direct"));
  KVTIER_RETURN_IF_ERROR(parsed.CheckAllTaken(url));
  config.direct = direct.value_or(false);
  const int64_t page_file_bytes = static_cast<int64_t>(kFilePayloadOffset) + ns.page_bytes();
  if (capacity && *capacity < page_file_bytes) {
    return Status::InvalidArgument(fmt::format(
        "storage URL '{}': capacity must hold at least one page file ({} bytes: the page's {} "
        "after its 4 KiB header block); leave it out for a bound derived from the free space",
        url, page_file_bytes, ns.page_bytes()));
  }
  config.capacity = capacity;
  config.fsync = fsync.value_or(false);
  if (io && *io != "uring" && *io != "threads") {
    return Status::InvalidArgument(
        fmt::format("storage URL '{}': io must be uring or threads, got '{}'", url, *io));
  }
#if KVTIER_HAVE_URING
  config.io_uring = io && *io == "uring";
#else
  if (io && *io == "uring") {
    return Status::InvalidArgument(
        fmt::format("storage URL '{}': io=uring, but kvtier was built without liburing", url));
  }
#endif
  std::string root = parsed.rest;
  if (root.empty() || root[0] != '/') {
    return Status::InvalidArgument(fmt::format(
        "storage URL '{}': the file backend needs an absolute path (file:///abs/dir)", url));
  }
  if (root.find("/../") != std::string::npos || root.ends_with("/..")) {
    return Status::InvalidArgument(
        fmt::format("storage URL '{}': the path must not contain '..'", url));
  }
  while (root.size() > 1 && root.back() == '/') root.pop_back();
  config.root = root;
  auto backend =
      std::make_unique<FileBackend>(fmt::format("file://{}", root), ns, options, std::move(config));
  KVTIER_RETURN_IF_ERROR(backend->Open());
  return std::unique_ptr<StorageBackend>(std::move(backend));
}

}  // namespace kvtier::storage
