// The file store's index and restart scan (file_index.h).
//
// Thread safety: the index under `mu_`, its queued touches under `pending_mu_` (taken after
// `mu_`, or alone by a Touch that found `mu_` held); the scan touches only its own directory
// handles (each shard's on the one thread that scans it).
#include "storage/file/file_index.h"

#include <dirent.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <signal.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <iterator>
#include <string>
#include <system_error>
#include <thread>

#include "storage/file/file_backend.h"
#include "storage/page_format.h"

namespace kvtier::storage {
namespace {

int64_t RealtimeNs() {
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
}

int64_t MtimeNs(const struct stat& st) {
  return int64_t{st.st_mtim.tv_sec} * 1'000'000'000 + st.st_mtim.tv_nsec;
}

bool IsHexKey(std::string_view name) {
  if (name.size() != 64) return false;
  for (char c : name) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

// ".tmp.<pid>.<n>.<hex>" in `dirfd`: removed when process <pid> no longer exists.
void RemoveStaleTemp(int dirfd, std::string_view name) {
  std::string_view rest = name.substr(kTempPrefix.size());
  const size_t dot = rest.find('.');
  long pid = 0;
  for (char c : rest.substr(0, dot)) {
    if (c < '0' || c > '9' || pid > (1L << 40)) return;
    pid = pid * 10 + (c - '0');
  }
  if (pid <= 0) return;
  if (::kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH) return;  // writer alive
  ::unlinkat(dirfd, std::string(name).c_str(), 0);
}

// The header of page file `name` in `dirfd` (a regular file found by the scan): ReadFoundHeader.
void ReadHeader(int dirfd, const char* name, uint64_t namespace_hash, FileIndex::Found& f) {
  if (f.bytes < static_cast<int64_t>(kFilePayloadOffset)) return;
  // O_NONBLOCK: a FIFO put in place since the fstatat must not block; O_NOFOLLOW: nor a symlink.
  // O_NOATIME: the scan writes no inode (a file of another owner refuses it: opened without).
  const int flags = O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC;
  int fd = ::openat(dirfd, name, flags | O_NOATIME);
  if (fd < 0 && errno == EPERM) fd = ::openat(dirfd, name, flags);
  if (fd < 0) return;
  ReadFoundHeader(fd, namespace_hash, f);
  ::close(fd);
}

}  // namespace

void ReadFoundHeader(int fd, uint64_t namespace_hash, FileIndex::Found& f) {
  if (f.bytes < static_cast<int64_t>(kFilePayloadOffset)) return;
  std::byte bytes[kMaxPageHeaderBytes];
  const ssize_t got = ::pread(fd, bytes, sizeof(bytes), 0);
  if (got != static_cast<ssize_t>(sizeof(bytes))) return;
  PageHeader header;
  if (ParsePageHeader(std::span(bytes), namespace_hash, f.key,
                      static_cast<uint64_t>(f.bytes) - kFilePayloadOffset,
                      &header) != PageStatus::kOk) {
    return;
  }
  f.parent = header.parent;
  f.version = header.version;
}

FileIndex::FileIndex(int64_t capacity, std::function<void(const PageKey&)> remove,
                     std::function<bool(const PageKey&)> pinned, OnTouched on_touched)
    : capacity_(capacity),
      remove_(std::move(remove)),
      pinned_(std::move(pinned)),
      on_touched_(std::move(on_touched)) {}

void FileIndex::Load(std::vector<Found> found) {
  std::sort(found.begin(), found.end(),
            [](const Found& a, const Found& b) { return a.stamp < b.stamp; });
  util::MutexLock lock(mu_);
  ApplyPendingLocked();
  for (const Found& f : found) {
    pages_.Add(f.key, f.bytes, f.parent, /*newest=*/true);
    last_stamp_ = std::max(last_stamp_, f.stamp);
  }
  EvictLocked(nullptr);
}

int64_t FileIndex::NextStamp() {
  util::MutexLock lock(mu_);
  return NextStampLocked();
}

int64_t FileIndex::NextStampLocked() {
  last_stamp_ = std::max(RealtimeNs(), last_stamp_ + 1);
  return last_stamp_;
}

void FileIndex::Put(const PageKey& key, int64_t bytes, int64_t stamp,
                    const std::optional<PageKey>& parent) {
  util::MutexLock lock(mu_);
  ApplyPendingLocked();
  last_stamp_ = std::max(last_stamp_, stamp);
  pages_.Add(key, bytes, parent, /*newest=*/true);
  EvictLocked(&key);
}

std::optional<int64_t> FileIndex::Touch(const PageKey& key, int64_t bytes,
                                        const std::optional<PageKey>& parent, int64_t mtime_ns) {
  if (mu_.TryLock()) {
    util::MutexLock lock(mu_, util::kAdoptLock);
    ApplyPendingLocked();
    ++touched_at_once_;
    return TouchLocked(key, bytes, parent, mtime_ns);
  }
  // Held by another thread (perhaps removing a victim's file): queued, applied by the next
  // method that uses the order.
  util::MutexLock pending_lock(pending_mu_);
  if (pending_.size() >= pending_limit_) {
    pending_.pop_front();
    ++dropped_;
  }
  pending_.push_back({key, bytes, parent, mtime_ns});
  ++deferred_;
  has_pending_.store(true, std::memory_order_release);
  return std::nullopt;
}

int64_t FileIndex::TouchLocked(const PageKey& key, int64_t bytes,
                               const std::optional<PageKey>& parent, int64_t mtime_ns) {
  const int64_t stamp = NextStampLocked();
  pages_.Add(key, bytes, parent, /*newest=*/true);  // nullopt keeps its parent
  if (on_touched_) on_touched_(key, stamp, mtime_ns);
  return stamp;
}

void FileIndex::ApplyPendingLocked() {
  if (!has_pending_.load(std::memory_order_acquire)) return;
  std::deque<PendingTouch> batch;
  {
    util::MutexLock pending_lock(pending_mu_);
    batch.swap(pending_);
    has_pending_.store(false, std::memory_order_relaxed);
  }
  for (const PendingTouch& t : batch) {
    if (pages_.Contains(t.key)) TouchLocked(t.key, t.bytes, t.parent, t.mtime_ns);
  }
}

void FileIndex::ApplyPendingTouches() {
  util::MutexLock lock(mu_);
  ApplyPendingLocked();
}

FileIndex::TouchCounts FileIndex::touch_counts() const {
  TouchCounts c;
  {
    util::MutexLock lock(mu_);
    c.at_once = touched_at_once_;
  }
  util::MutexLock pending_lock(pending_mu_);
  c.deferred = deferred_;
  c.dropped = dropped_;
  return c;
}

void FileIndex::set_pending_touch_limit(size_t limit) {
  util::MutexLock pending_lock(pending_mu_);
  pending_limit_ = std::max<size_t>(limit, 1);
}

bool FileIndex::AddFound(const PageKey& key, int64_t bytes, int64_t stamp,
                         const std::optional<PageKey>& parent) {
  util::MutexLock lock(mu_);
  ApplyPendingLocked();
  if (pages_.Contains(key)) return false;
  last_stamp_ = std::max(last_stamp_, stamp);
  pages_.Add(key, bytes, parent, /*newest=*/false);
  return true;
}

bool FileIndex::DropOrphan(const PageKey& key, const PageKey& parent, bool parent_in_batch) {
  util::MutexLock lock(mu_);
  ApplyPendingLocked();
  if (pages_.Contains(parent) || !pages_.Contains(key)) return false;
  if (!parent_in_batch && !pages_.Evicted(parent)) return false;
  if (remove_) remove_(key);
  pages_.Evict(key);
  ++evicted_;
  return true;
}

int64_t FileIndex::EvictOldest(int64_t bytes) {
  util::MutexLock lock(mu_);
  ApplyPendingLocked();
  const auto pinned = [this](const PageKey& key) { return pinned_ && pinned_(key); };
  const int64_t target = pages_.bytes() - bytes;
  int64_t n = 0;
  while (pages_.bytes() > target && pages_.pages() > 0) {
    const std::optional<PageKey> victim = pages_.Victim(nullptr, pinned).key;
    if (!victim) break;
    if (remove_) remove_(*victim);
    pages_.Evict(*victim);
    ++evicted_;
    ++n;
  }
  return n;
}

bool FileIndex::Gone(const PageKey& key) const {
  util::MutexLock lock(mu_);
  return !pages_.Contains(key) && pages_.Evicted(key);
}

void FileIndex::Erase(const PageKey& key) {
  util::MutexLock lock(mu_);
  ApplyPendingLocked();
  pages_.Erase(key);
}

bool FileIndex::Contains(const PageKey& key) const {
  util::MutexLock lock(mu_);
  return pages_.Contains(key);
}

int64_t FileIndex::pages() const {
  util::MutexLock lock(mu_);
  return pages_.pages();
}

int64_t FileIndex::bytes() const {
  util::MutexLock lock(mu_);
  return pages_.bytes();
}

int64_t FileIndex::evicted() const {
  util::MutexLock lock(mu_);
  return evicted_;
}

std::vector<PageKey> FileIndex::LruOrder() {
  util::MutexLock lock(mu_);
  ApplyPendingLocked();
  return pages_.Order();
}

std::optional<PageKey> FileIndex::ParentOf(const PageKey& key) {
  util::MutexLock lock(mu_);
  ApplyPendingLocked();
  return pages_.ParentOf(key);
}

void FileIndex::EvictLocked(const PageKey* keep) {
  const auto pinned = [this](const PageKey& key) { return pinned_ && pinned_(key); };
  while (pages_.bytes() > capacity_) {
    const std::optional<PageKey> victim = pages_.Victim(keep, pinned).key;
    if (!victim) return;
    if (remove_) remove_(*victim);
    pages_.Evict(*victim);
    ++evicted_;
  }
}

namespace {

// One shard directory of the restart scan (ScanPages): its pages appended to `found`.
Status ScanShard(int ns_dirfd, int shard, uint64_t namespace_hash,
                 std::vector<FileIndex::Found>& found) {
  const std::string name = fmt::format("{:02x}", shard);
  const int fd = ::openat(ns_dirfd, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) {
    // No page in this shard yet; or a symlink / non-directory in its place: not ours.
    if (errno == ENOENT || errno == ELOOP || errno == ENOTDIR) return Status::OK();
    return Status::IOError(
        fmt::format("cannot read shard directory {}: {}", name, std::strerror(errno)));
  }
  DIR* d = ::fdopendir(fd);
  if (d == nullptr) {
    ::close(fd);
    return Status::IOError(
        fmt::format("cannot read shard directory {}: {}", name, std::strerror(errno)));
  }
  while (dirent* e = ::readdir(d)) {
    const std::string_view entry = e->d_name;
    struct stat st;
    if (::fstatat(fd, e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0) continue;
    if (entry.starts_with(kTempPrefix)) {
      if (S_ISREG(st.st_mode)) RemoveStaleTemp(fd, entry);
      continue;
    }
    if (!IsHexKey(entry) || !S_ISREG(st.st_mode) || entry.substr(0, 2) != name) continue;
    auto key = PageKey::FromHex(entry);
    if (!key.ok()) continue;
    FileIndex::Found f{*key, st.st_size, MtimeNs(st)};
    ReadHeader(fd, e->d_name, namespace_hash, f);
    found.push_back(std::move(f));
  }
  ::closedir(d);  // closes `fd`
  return Status::OK();
}

}  // namespace

Result<std::vector<FileIndex::Found>> ScanPages(int ns_dirfd, uint64_t namespace_hash) {
  // The 256 shards are scanned by 16 threads at once, whatever the cores: reading the headers
  // costs one random read per page when the files are not in the page cache, and the threads
  // mostly wait for those while the device serves many at once (measured: 16 threads read cold
  // headers about 3x as fast as one, 32 no faster than 16). Threads that cannot be started are
  // done without (the shards are shared out as they are taken).
  constexpr int kShards = 256;
  constexpr int kThreads = 16;
  std::vector<std::vector<FileIndex::Found>> parts(static_cast<size_t>(kThreads));
  std::vector<Status> errors(kShards);
  std::atomic<int> next{0};
  auto work = [&](size_t part) {
    for (int shard = next.fetch_add(1); shard < kShards; shard = next.fetch_add(1)) {
      errors[static_cast<size_t>(shard)] = ScanShard(ns_dirfd, shard, namespace_hash, parts[part]);
    }
  };
  {
    std::vector<std::jthread> pool;
    try {
      for (int t = 1; t < kThreads; ++t) pool.emplace_back(work, static_cast<size_t>(t));
    } catch (const std::system_error&) {  // no more threads: the ones running share the rest
    }
    work(0);
  }  // joined
  for (const Status& st : errors) {
    if (!st.ok()) return st;  // the first shard (in name order) that could not be read
  }
  std::vector<FileIndex::Found> found;
  for (auto& part : parts) {
    found.insert(found.end(), std::make_move_iterator(part.begin()),
                 std::make_move_iterator(part.end()));
  }
  return found;
}

}  // namespace kvtier::storage
