// The `file://` backend (file_backend.h).
//
// Index invariants (under `mu_`): `entries_` holds the pages this backend knows to be stored,
// `lru_` lists exactly those keys, most recently used first, in the order of their stamps;
// `bytes_` is the sum of their file sizes and, after a Set returns, at most `capacity_` (when
// there is one). A stamp (nanoseconds since the epoch, stored as the file's mtime) is strictly
// greater than every stamp handed out before by this backend or found in the directory at start.
//
// Thread safety: the index under `mu_`; files are reached only through open/rename/unlink, which
// the kernel orders.
#include "storage/file_backend.h"

#include <dirent.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <list>
#include <mutex>
#include <optional>
#include <unordered_map>

#if KVTIER_HAVE_URING
#include <liburing.h>
#endif

#include "storage/page_format.h"
#include "storage/storage_url.h"
#include "util/log.h"
#include "util/thread_pool.h"

namespace kvtier::storage {
namespace {

using Clock = std::chrono::steady_clock;
constexpr std::string_view kTempPrefix = ".tmp.";

// An open file descriptor, closed on scope exit.
class Fd {
 public:
  explicit Fd(int fd = -1) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }
  bool ok() const { return fd_ >= 0; }

 private:
  int fd_;
};

int64_t RealtimeNs() {
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
}

timespec ToTimespec(int64_t ns) {
  return timespec{static_cast<time_t>(ns / 1'000'000'000), static_cast<long>(ns % 1'000'000'000)};
}

int64_t MtimeNs(const struct stat& st) {
  return int64_t{st.st_mtim.tv_sec} * 1'000'000'000 + st.st_mtim.tv_nsec;
}

// mkdir with 0700; an existing directory is fine.
bool MakeDir(const std::string& path) {
  return ::mkdir(path.c_str(), 0700) == 0 || errno == EEXIST;
}

// Creates `path` and its missing parents (0700 each).
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

bool IsHexKey(std::string_view name) {
  if (name.size() != 64) return false;
  for (char c : name) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

// Writes all of `iov` at `offset` (pwritev may write less than asked).
bool WriteAll(int fd, iovec* iov, int iovcnt, off_t offset) {
  while (iovcnt > 0) {
    const ssize_t n = ::pwritev(fd, iov, iovcnt, offset);
    if (n < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    if (n == 0) {
      errno = EIO;
      return false;
    }
    offset += n;
    size_t left = static_cast<size_t>(n);
    while (iovcnt > 0 && left >= iov->iov_len) {
      left -= iov->iov_len;
      ++iov, --iovcnt;
    }
    if (iovcnt > 0) {
      iov->iov_base = static_cast<char*>(iov->iov_base) + left;
      iov->iov_len -= left;
    }
  }
  return true;
}

// Reads into `iov` from `start` until the iovecs are full or the file ends; the byte count, or
// -1 with errno.
ssize_t ReadAll(int fd, iovec* iov, int iovcnt, off_t start = 0) {
  off_t offset = start;
  while (iovcnt > 0) {
    const ssize_t n = ::preadv(fd, iov, iovcnt, offset);
    if (n < 0) {
      if (errno == EINTR) continue;
      return -1;
    }
    if (n == 0) break;
    offset += n;
    size_t left = static_cast<size_t>(n);
    while (iovcnt > 0 && left >= iov->iov_len) {
      left -= iov->iov_len;
      ++iov, --iovcnt;
    }
    if (iovcnt > 0) {
      iov->iov_base = static_cast<char*>(iov->iov_base) + left;
      iov->iov_len -= left;
    }
  }
  return offset - start;
}

// Bytes of a page moved per read or write in the thread path: small enough that a chunk is still
// in this core's L2 when it is hashed right after it is read (or right before it is written), so
// the checksum does not make a second pass over the page at memory speed.
constexpr size_t kChunkBytes = size_t{256} << 10;

// Walks a page buffer's segments in chunks of at most kChunkBytes. The first chunk is shorter by
// the payload's offset in the file, so every later chunk starts at a file offset that is a
// multiple of kChunkBytes: the page cache then holds the payload in large folios (writes at
// unaligned offsets leave small ones, which made every later read of the file cost ~50 % more
// kernel time).
class PayloadChunks {
 public:
  explicit PayloadChunks(const PageBuffer& buffer) : buffer_(buffer) { SkipEmpty(); }

  bool done() const { return segment_ >= buffer_.num_segments; }

  // Appends the next chunk's iovecs (at most kMaxSegments) to `iov` at `*iovcnt`; its bytes.
  size_t Next(iovec* iov, int* iovcnt) {
    const size_t limit = first_ ? kChunkBytes - kFilePayloadOffset : kChunkBytes;
    first_ = false;
    size_t bytes = 0;
    while (!done() && bytes < limit) {
      const auto& seg = buffer_.segments[static_cast<size_t>(segment_)];
      const size_t take = std::min(limit - bytes, seg.size() - at_);
      iov[(*iovcnt)++] = {seg.data() + at_, take};
      bytes += take;
      at_ += take;
      if (at_ == seg.size()) {
        ++segment_;
        at_ = 0;
        SkipEmpty();
      }
    }
    return bytes;
  }

 private:
  void SkipEmpty() {
    while (!done() && buffer_.segments[static_cast<size_t>(segment_)].empty()) ++segment_;
  }

  const PageBuffer& buffer_;
  int segment_ = 0;
  size_t at_ = 0;
  bool first_ = true;
};
static_assert(kChunkBytes > kFilePayloadOffset && kChunkBytes % kFilePayloadOffset == 0);

void HashIovecs(PayloadHasher& hasher, const iovec* iov, int iovcnt) {
  for (int i = 0; i < iovcnt; ++i) {
    hasher.Update({static_cast<const std::byte*>(iov[i].iov_base), iov[i].iov_len});
  }
}

class FileBackend final : public StorageBackend {
 public:
  struct Config {
    std::string root;       // the URL's directory
    int64_t capacity = -1;  // bytes of files in this namespace's directory; -1: none
    bool fsync = false;
    bool io_uring = false;  // reads through io_uring (when built with liburing)
  };

  FileBackend(std::string url, const StorageNamespace& ns, const StorageOptions& options,
              Config config)
      : StorageBackend(std::move(url), ns, options),
        config_(std::move(config)),
        ns_dir_(config_.root + "/" + ns.Name()),
        namespace_hash_(ns.Hash()),
        value_bytes_(static_cast<int64_t>(kFilePayloadOffset) + ns.page_bytes()),
        read_pool_(options.io_threads),
        write_pool_(options.io_threads) {}
  ~FileBackend() override { Close(); }

  Status Open() {
    KVTIER_RETURN_IF_ERROR(EnsureDirs());
    KVTIER_RETURN_IF_ERROR(LoadIndex());
    return Start();
  }

 protected:
  ExistsResult DoExists(std::span<const PageKey> keys, Clock::time_point deadline) override {
    ExistsResult r;
    std::unique_lock<std::mutex> lock(mu_);
    for (const PageKey& key : keys) {
      if (entries_.count(key) == 0) {
        // Perhaps written by another process: one stat, outside the lock.
        lock.unlock();
        struct stat st;
        const bool found = Clock::now() <= deadline && ::stat(PathOf(key).c_str(), &st) == 0 &&
                           S_ISREG(st.st_mode);
        lock.lock();
        if (!found) break;
        if (entries_.count(key) == 0) AddLocked(key, st.st_size, MtimeNs(st), /*newest=*/false);
      }
      ++r.leading;
    }
    return r;
  }

  void DoGet(std::span<const PageKey> keys, std::span<const PageBuffer> buffers,
             std::span<PageStatus> out, Clock::time_point deadline) override {
#if KVTIER_HAVE_URING
    if (config_.io_uring) {
      if (io_uring* ring = ThreadRing()) {
        GetWithUring(*ring, keys, buffers, out, deadline);
        return;
      }
    }
#endif
    read_pool_.ParallelFor(static_cast<int64_t>(keys.size()), [&](int64_t i) {
      const size_t k = static_cast<size_t>(i);
      out[k] = Clock::now() > deadline ? PageStatus::kTimedOut : GetOne(keys[k], buffers[k]);
    });
  }

  void DoSet(std::span<const PageKey> keys, std::span<const PageBuffer> buffers,
             std::span<PageStatus> out, Clock::time_point deadline) override {
    write_pool_.ParallelFor(static_cast<int64_t>(keys.size()), [&](int64_t i) {
      const size_t k = static_cast<size_t>(i);
      out[k] = Clock::now() > deadline ? PageStatus::kTimedOut : SetOne(keys[k], buffers[k]);
    });
  }

  void DoRemove(std::span<const PageKey> keys, std::span<PageStatus> out,
                Clock::time_point deadline) override {
    for (size_t i = 0; i < keys.size(); ++i) {
      if (Clock::now() > deadline) {
        out[i] = PageStatus::kTimedOut;
        continue;
      }
      std::lock_guard<std::mutex> lock(mu_);
      const bool gone = ::unlink(PathOf(keys[i]).c_str()) == 0 || errno == ENOENT;
      EraseLocked(keys[i]);
      out[i] = gone ? PageStatus::kOk : PageStatus::kFailed;
    }
  }

  void FillStats(StorageStats& stats) const override {
    std::lock_guard<std::mutex> lock(mu_);
    stats.stored_pages = static_cast<int64_t>(entries_.size());
    stats.stored_bytes = bytes_;
    stats.capacity_bytes = config_.capacity;
    stats.evicted_pages = evicted_;
  }

 private:
  struct Entry {
    int64_t bytes;
    int64_t stamp;
    std::list<PageKey>::iterator lru_pos;
  };

  std::string ShardOf(const std::string& hex) const { return ns_dir_ + "/" + hex.substr(0, 2); }
  std::string PathOf(const PageKey& key) const {
    const std::string hex = key.Hex();
    return ShardOf(hex) + "/" + hex;
  }

  // The root and the namespace directory (again after someone removed them). Shard directories
  // are made by the first Set into them.
  Status EnsureDirs() { return MakeDirs(ns_dir_); }

  // Scans the namespace directory: pages into the index in stamp order, stale temporary files
  // (their writer is gone) removed, anything else left alone.
  Status LoadIndex() {
    struct Found {
      PageKey key;
      int64_t bytes, stamp;
    };
    std::vector<Found> found;
    int64_t newest = 0;
    for (int shard = 0; shard < 256; ++shard) {
      const std::string dir = fmt::format("{}/{:02x}", ns_dir_, shard);
      DIR* d = ::opendir(dir.c_str());
      if (d == nullptr) {
        if (errno == ENOENT) continue;  // no page in this shard yet
        return Status::IOError(
            fmt::format("cannot read directory {}: {}", dir, std::strerror(errno)));
      }
      while (dirent* e = ::readdir(d)) {
        const std::string_view name = e->d_name;
        struct stat st;
        if (::fstatat(::dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0) continue;
        if (name.starts_with(kTempPrefix)) {
          RemoveStaleTemp(dir, name);
          continue;
        }
        if (!IsHexKey(name) || !S_ISREG(st.st_mode)) continue;
        auto key = PageKey::FromHex(name);
        if (!key.ok() || name.substr(0, 2) != dir.substr(dir.size() - 2)) continue;
        found.push_back({*key, st.st_size, MtimeNs(st)});
        newest = std::max(newest, MtimeNs(st));
      }
      ::closedir(d);
    }
    std::sort(found.begin(), found.end(),
              [](const Found& a, const Found& b) { return a.stamp < b.stamp; });
    std::lock_guard<std::mutex> lock(mu_);
    for (const Found& f : found) AddLocked(f.key, f.bytes, f.stamp, /*newest=*/true);
    last_stamp_ = newest;
    EvictLocked(nullptr);  // the capacity may have shrunk since the last run
    return Status::OK();
  }

  // ".tmp.<pid>.<n>.<hex>": removed when process <pid> no longer exists.
  static void RemoveStaleTemp(const std::string& dir, std::string_view name) {
    std::string_view rest = name.substr(kTempPrefix.size());
    const size_t dot = rest.find('.');
    long pid = 0;
    for (char c : rest.substr(0, dot)) {
      if (c < '0' || c > '9' || pid > (1L << 40)) return;
      pid = pid * 10 + (c - '0');
    }
    if (pid <= 0) return;
    if (::kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH) return;  // writer alive
    ::unlink((dir + "/" + std::string(name)).c_str());
  }

  int64_t NextStampLocked() {
    last_stamp_ = std::max(RealtimeNs(), last_stamp_ + 1);
    return last_stamp_;
  }

  // Adds or replaces `key`; at the front (most recent) or the back (oldest: a page found on disk
  // that nobody has used in this run).
  void AddLocked(const PageKey& key, int64_t bytes, int64_t stamp, bool newest) {
    EraseLocked(key);
    auto pos = newest ? lru_.insert(lru_.begin(), key) : lru_.insert(lru_.end(), key);
    entries_.emplace(key, Entry{bytes, stamp, pos});
    bytes_ += bytes;
  }

  void EraseLocked(const PageKey& key) {
    auto it = entries_.find(key);
    if (it == entries_.end()) return;
    bytes_ -= it->second.bytes;
    lru_.erase(it->second.lru_pos);
    entries_.erase(it);
  }

  // Removes least recently used pages (never `keep`) until the bytes fit the capacity.
  void EvictLocked(const PageKey* keep) {
    if (config_.capacity < 0) return;
    auto it = lru_.end();
    while (bytes_ > config_.capacity && it != lru_.begin()) {
      --it;
      if (keep != nullptr && *it == *keep) continue;
      const PageKey victim = *it;
      it = std::next(it);  // EraseLocked invalidates the victim's position only
      ::unlink(PathOf(victim).c_str());
      EraseLocked(victim);
      ++evicted_;
    }
  }

  static constexpr int64_t kNotRead = -3, kCancelled = -2, kReadError = -1;

  // One page being read: its file, and where the header, the payload and one byte past a page
  // (to notice a file longer than a page) go.
  struct PageRead {
    int fd = -1;
    std::byte header[kPageHeaderBytes];
    std::byte pad[kFilePayloadOffset - kPageHeaderBytes];
    std::byte extra;
    iovec iov[PageBuffer::kMaxSegments + 3];
    int iovcnt = 0;
    int64_t got = kNotRead;  // bytes read, or one of the k... codes below

    ~PageRead() {
      if (fd >= 0) ::close(fd);
    }
    bool PadIsZero() const {
      static constexpr std::byte kZeros[sizeof(pad)] = {};
      return std::memcmp(pad, kZeros, sizeof(pad)) == 0;
    }
    void Prepare(const PageBuffer& buffer) {
      iovcnt = 0;
      iov[iovcnt++] = {header, sizeof(header)};
      iov[iovcnt++] = {pad, sizeof(pad)};
      for (int s = 0; s < buffer.num_segments; ++s) {
        const auto& seg = buffer.segments[static_cast<size_t>(s)];
        if (!seg.empty()) iov[iovcnt++] = {seg.data(), seg.size()};
      }
      iov[iovcnt++] = {&extra, 1};
    }
  };

  // Opens the page's file for `read`; kOk, or the page's outcome.
  PageStatus OpenForRead(const PageKey& key, const PageBuffer& buffer, PageRead& read) {
    // O_NONBLOCK: a FIFO or device put in place of a page must not block the open.
    read.fd = ::open(PathOf(key).c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (read.fd < 0) {
      if (errno == ENOENT) {
        std::lock_guard<std::mutex> lock(mu_);
        EraseLocked(key);
        return PageStatus::kAbsent;
      }
      return errno == ELOOP ? PageStatus::kCorrupt : PageStatus::kFailed;  // ELOOP: a symlink
    }
    struct stat st;
    if (::fstat(read.fd, &st) != 0) return PageStatus::kFailed;
    if (!S_ISREG(st.st_mode)) return PageStatus::kCorrupt;
    if (st.st_size != value_bytes_) return PageStatus::kCorrupt;  // truncated or too long
    read.Prepare(buffer);
    return PageStatus::kOk;
  }

  // Checks what `read` brought in; on a hit stamps the file as the most recently used.
  PageStatus FinishRead(const PageKey& key, const PageBuffer& buffer, PageRead& read) {
    if (read.got != value_bytes_) return PageStatus::kCorrupt;  // truncated or too long
    PageHeader parsed;
    PageStatus st = ParsePageHeader(std::span(read.header), namespace_hash_, key,
                                    static_cast<uint64_t>(buffer.bytes()), &parsed);
    if (st == PageStatus::kOk && !read.PadIsZero()) st = PageStatus::kCorrupt;
    if (st == PageStatus::kOk) st = CheckPayload(parsed, buffer);
    if (st != PageStatus::kOk) return st;
    return MarkHit(key, read.fd);
  }

  // Stamps a page just read and checked as the most recently used.
  PageStatus MarkHit(const PageKey& key, int fd) {
    std::lock_guard<std::mutex> lock(mu_);
    const int64_t stamp = NextStampLocked();
    const timespec times[2] = {{0, UTIME_OMIT}, ToTimespec(stamp)};
    ::futimens(fd, times);  // best effort: a read-only store still serves hits
    AddLocked(key, value_bytes_, stamp, /*newest=*/true);
    return PageStatus::kOk;
  }

  // The thread path: the header and the first chunk of the payload in one preadv, then chunk by
  // chunk, every read straight into the caller's buffer; each chunk is hashed as soon as it has
  // landed (the checks run in the documented order: length, header, payload checksum).
  PageStatus GetOne(const PageKey& key, const PageBuffer& buffer) {
    PageRead read;
    const PageStatus opened = OpenForRead(key, buffer, read);
    if (opened != PageStatus::kOk) return opened;
    PayloadChunks chunks(buffer);
    std::optional<PayloadHasher> hasher;
    uint64_t stored_checksum = 0;
    off_t offset = 0;
    bool first = true;
    do {
      iovec iov[PageBuffer::kMaxSegments + 3];
      int iovcnt = 0;
      if (first) {
        iov[iovcnt++] = {read.header, sizeof(read.header)};
        iov[iovcnt++] = {read.pad, sizeof(read.pad)};
      }
      const int payload_from = iovcnt;
      const size_t payload_bytes = chunks.Next(iov, &iovcnt);
      const int payload_to = iovcnt;
      // One byte past the page with the last chunk: a file grown since the open is noticed.
      if (chunks.done()) iov[iovcnt++] = {&read.extra, 1};
      iovec hashed[PageBuffer::kMaxSegments + 3];
      std::copy(iov, iov + iovcnt, hashed);  // ReadAll advances `iov`
      const size_t wanted = (first ? kFilePayloadOffset : 0) + payload_bytes;
      const ssize_t got = ReadAll(read.fd, iov, iovcnt, offset);
      if (got < 0) return PageStatus::kFailed;
      if (static_cast<size_t>(got) != wanted) return PageStatus::kCorrupt;  // length changed
      offset += got;
      if (first) {
        PageHeader parsed;
        const PageStatus st = ParsePageHeader(std::span(read.header), namespace_hash_, key,
                                              static_cast<uint64_t>(buffer.bytes()), &parsed);
        if (st != PageStatus::kOk) return st;
        if (!read.PadIsZero()) return PageStatus::kCorrupt;
        hasher.emplace(parsed.checksum_kind);
        if (!hasher->ok()) return PageStatus::kCorrupt;
        stored_checksum = parsed.payload_checksum;
        first = false;
      }
      HashIovecs(*hasher, hashed + payload_from, payload_to - payload_from);
    } while (!chunks.done());
    if (hasher->Digest() != stored_checksum) return PageStatus::kCorrupt;
    return MarkHit(key, read.fd);
  }

#if KVTIER_HAVE_URING
  // The batch's reads in flight together on this I/O thread's ring (IOSQE_ASYNC: the kernel's
  // workers copy in parallel); each page is checked by this thread as its read completes. Past
  // the deadline the reads still in flight are cancelled and waited for (the kernel may be
  // writing into the caller's buffers until they complete); pages not read by then are
  // kTimedOut.
  void GetWithUring(io_uring& ring, std::span<const PageKey> keys,
                    std::span<const PageBuffer> buffers, std::span<PageStatus> out,
                    Clock::time_point deadline) {
    const size_t n = keys.size();
    std::vector<PageRead> reads(n);
    for (size_t i = 0; i < n; ++i) {
      out[i] = Clock::now() > deadline ? PageStatus::kTimedOut
                                       : OpenForRead(keys[i], buffers[i], reads[i]);
    }
    constexpr uint64_t kCancelTag = ~uint64_t{0};
    size_t next = 0, in_flight = 0;
    bool cancelled = false;
    while (true) {
      while (!cancelled && next < n && in_flight < kRingDepth) {
        PageRead& r = reads[next];
        if (out[next] == PageStatus::kOk) {
          io_uring_sqe* sqe = io_uring_get_sqe(&ring);
          io_uring_prep_readv(sqe, r.fd, r.iov, static_cast<unsigned>(r.iovcnt), 0);
          sqe->flags |= IOSQE_ASYNC;
          io_uring_sqe_set_data64(sqe, next);
          ++in_flight;
        }
        ++next;
      }
      if (in_flight == 0 && (cancelled || next == n)) break;
      io_uring_submit(&ring);
      io_uring_cqe* cqe = nullptr;
      int rc;
      if (cancelled) {
        rc = io_uring_wait_cqe(&ring, &cqe);
      } else {
        const auto left = std::max<int64_t>(
            0,
            std::chrono::duration_cast<std::chrono::nanoseconds>(deadline - Clock::now()).count());
        __kernel_timespec ts{left / 1'000'000'000, left % 1'000'000'000};
        rc = io_uring_wait_cqe_timeout(&ring, &cqe, &ts);
        if (rc == -ETIME) {
          cancelled = true;
          io_uring_sqe* sqe = io_uring_get_sqe(&ring);
          io_uring_prep_cancel64(sqe, 0, IORING_ASYNC_CANCEL_ANY);
          io_uring_sqe_set_data64(sqe, kCancelTag);
          continue;
        }
      }
      if (rc == -EINTR) continue;
      if (rc < 0) break;  // the ring itself failed: pages without a completion are failed below
      const uint64_t tag = io_uring_cqe_get_data64(cqe);
      const int res = cqe->res;
      io_uring_cqe_seen(&ring, cqe);
      if (tag == kCancelTag) continue;
      --in_flight;
      // Check this page now, while the kernel's workers copy the others.
      PageRead& r = reads[tag];
      r.got = res >= 0 ? res : res == -ECANCELED ? kCancelled : kReadError;
      out[tag] = Finish(keys[tag], buffers[tag], r, cancelled);
    }
    for (size_t i = 0; i < n; ++i) {
      // Pages never submitted (cancelled first) or never completed (the ring failed).
      if (out[i] == PageStatus::kOk && reads[i].got == kNotRead) {
        out[i] = cancelled ? PageStatus::kTimedOut : PageStatus::kFailed;
      }
    }
  }

  PageStatus Finish(const PageKey& key, const PageBuffer& buffer, PageRead& r, bool cancelled) {
    if (r.got > 0 && r.got < value_bytes_) {
      // A short read that may not be the end of the file: read it again the plain way.
      r.Prepare(buffer);
      r.got = ReadAll(r.fd, r.iov, r.iovcnt);
    }
    if (r.got == kCancelled || (r.got == kReadError && cancelled)) return PageStatus::kTimedOut;
    if (r.got < 0) return PageStatus::kFailed;
    return FinishRead(key, buffer, r);
  }

  static constexpr unsigned kRingDepth = 64;

  // This I/O thread's ring, made at its first use; null when io_uring is not available (then
  // reads go through the thread pool).
  static io_uring* ThreadRing() {
    struct Ring {
      io_uring ring;
      bool ok = false;
      Ring() { ok = io_uring_queue_init(kRingDepth * 2, &ring, 0) == 0; }
      ~Ring() {
        if (ok) io_uring_queue_exit(&ring);
      }
    };
    thread_local Ring ring;
    return ring.ok ? &ring.ring : nullptr;
  }
#endif

  // Writes the payload chunk by chunk after the header's place, hashing each chunk right before
  // it is written (so the write copies it from cache), then the header with that checksum at
  // offset 0. The file is published only by the rename that follows.
  bool WritePayloadAndHeader(int fd, const PageKey& key, const PageBuffer& buffer) {
    PageHeader header = NewPageHeader(namespace_hash_, key, static_cast<uint64_t>(buffer.bytes()));
    PayloadHasher hasher(header.checksum_kind);
    if (!hasher.ok()) {
      errno = EINVAL;
      return false;
    }
    PayloadChunks chunks(buffer);
    off_t offset = kFilePayloadOffset;  // the header's padding stays a hole (zeros)
    while (!chunks.done()) {
      iovec iov[PageBuffer::kMaxSegments];
      int iovcnt = 0;
      const size_t bytes = chunks.Next(iov, &iovcnt);
      HashIovecs(hasher, iov, iovcnt);
      if (!WriteAll(fd, iov, iovcnt, offset)) return false;
      offset += static_cast<off_t>(bytes);
    }
    header.payload_checksum = hasher.Digest();
    std::byte encoded[kPageHeaderBytes];
    EncodePageHeader(header, encoded);
    iovec iov{encoded, sizeof(encoded)};
    return WriteAll(fd, &iov, 1, 0);
  }

  PageStatus SetOne(const PageKey& key, const PageBuffer& buffer) {
    if (config_.capacity >= 0 && value_bytes_ > config_.capacity) return PageStatus::kFailed;
    const std::string hex = key.Hex();
    const std::string shard = ShardOf(hex);
    const std::string path = shard + "/" + hex;
    const std::string temp = fmt::format("{}/{}{}.{}.{}", shard, kTempPrefix, ::getpid(),
                                         temp_counter_.fetch_add(1), hex);
    const int flags = O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW;
    int raw = ::open(temp.c_str(), flags, 0600);
    if (raw < 0 && errno == ENOENT) {
      // The first page of this shard, or the directories were removed while we ran.
      std::lock_guard<std::mutex> lock(dirs_mu_);
      if (MakeDir(shard) || (errno == ENOENT && EnsureDirs().ok() && MakeDir(shard))) {
        raw = ::open(temp.c_str(), flags, 0600);
      }
    }
    if (raw < 0) {
      util::Log(util::LogLevel::kWarning, "storage {}: cannot create {}: {}", url(), temp,
                std::strerror(errno));
      return PageStatus::kFailed;
    }
    Fd fd(raw);
    bool ok = WritePayloadAndHeader(fd.get(), key, buffer) &&
              (!config_.fsync || ::fdatasync(fd.get()) == 0);
    int64_t stamp = 0;
    if (ok) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        stamp = NextStampLocked();
      }
      const timespec times[2] = {{0, UTIME_OMIT}, ToTimespec(stamp)};
      ok = ::futimens(fd.get(), times) == 0 && ::rename(temp.c_str(), path.c_str()) == 0;
    }
    if (!ok) {
      util::Log(util::LogLevel::kWarning, "storage {}: cannot write {}: {}", url(), path,
                std::strerror(errno));
      ::unlink(temp.c_str());
      return PageStatus::kFailed;
    }
    if (config_.fsync) {
      Fd dir(::open(shard.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
      if (dir.ok()) ::fsync(dir.get());
    }
    std::lock_guard<std::mutex> lock(mu_);
    AddLocked(key, value_bytes_, stamp, /*newest=*/true);
    EvictLocked(&key);
    return PageStatus::kOk;
  }

  const Config config_;
  const std::string ns_dir_;
  const uint64_t namespace_hash_;
  const int64_t value_bytes_;
  // Pages of a batch run in parallel on these; reads and writes have a pool each, so a Get
  // never waits for a Set's loop (a pool runs one loop at a time).
  util::ThreadPool read_pool_;
  util::ThreadPool write_pool_;
  std::atomic<uint64_t> temp_counter_{0};
  std::mutex dirs_mu_;  // one EnsureDirs at a time

  mutable std::mutex mu_;
  std::unordered_map<PageKey, Entry, PageKeyHash> entries_;
  std::list<PageKey> lru_;
  int64_t bytes_ = 0;
  int64_t evicted_ = 0;
  int64_t last_stamp_ = 0;
};

}  // namespace

Result<std::unique_ptr<StorageBackend>> OpenFileStorage(std::string_view url,
                                                        const StorageNamespace& ns,
                                                        const StorageOptions& options) {
  KVTIER_ASSIGN_OR_RETURN(StorageUrl parsed, ParseStorageUrl(url));
  FileBackend::Config config;
  KVTIER_ASSIGN_OR_RETURN(std::optional<int64_t> capacity, parsed.TakeByteSize("capacity"));
  KVTIER_ASSIGN_OR_RETURN(std::optional<bool> fsync, parsed.TakeBool("fsync"));
  const std::optional<std::string> io = parsed.Take("io");
  KVTIER_RETURN_IF_ERROR(parsed.CheckAllTaken(url));
  config.capacity = capacity.value_or(-1);
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
