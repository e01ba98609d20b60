// The `file://` backend (file_backend.h): page I/O here; which pages are stored, their LRU order
// and the capacity live in the index (file_index.h); whole reads/writes and opens beneath the
// store root in file_io.h.
//
// Paths: the backend holds the store root open (`root_`, reopened by path if the root is removed
// while running) and reaches every file through OpenBeneath from it: "<ns>/<shard>/<hex>" for a
// page, "<ns>/<shard>" for the directory a Set writes its temporary file in and renames it in.
// A symlink anywhere below the root fails that open: a Get of such a page is kCorrupt, a Set
// into a shard that is a symlink kFailed (with a warning), so nothing is written outside the
// store.
//
// Thread safety: the index has its own mutex; `root_` is swapped under `dirs_mu_` and read
// through an atomic shared_ptr; files are reached only through open/rename/unlink, which the
// kernel orders.
#include "storage/file_backend.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>

#if KVTIER_HAVE_URING
#include <liburing.h>
#endif

#include "storage/file_index.h"
#include "storage/file_io.h"
#include "storage/page_format.h"
#include "storage/storage_url.h"
#include "util/log.h"

namespace kvtier::storage {
namespace {

using Clock = std::chrono::steady_clock;

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

// Direct I/O (direct=1): file offsets, lengths and memory aligned to this.
constexpr size_t kDirectAlign = 4096;
static_assert(kFilePayloadOffset == kDirectAlign);

struct AlignedFree {
  void operator()(std::byte* p) const { std::free(p); }
};

// Whether a direct read can land straight in `buffer`: every segment starts on a 4 KiB boundary
// and every one but the last holds whole 4 KiB blocks.
bool DirectAligned(const PageBuffer& buffer) {
  int last = buffer.num_segments - 1;
  while (last > 0 && buffer.segments[static_cast<size_t>(last)].empty()) --last;
  for (int s = 0; s <= last; ++s) {
    const auto& seg = buffer.segments[static_cast<size_t>(s)];
    if (reinterpret_cast<uintptr_t>(seg.data()) % kDirectAlign != 0) return false;
    if (s < last && seg.size() % kDirectAlign != 0) return false;
  }
  return true;
}

std::string FormatBytes(int64_t bytes) {
  return fmt::format("{:.1f} GiB", static_cast<double>(bytes) / double(int64_t{1} << 30));
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
        value_bytes_(static_cast<int64_t>(kFilePayloadOffset) + ns.page_bytes()) {}
  ~FileBackend() override { Close(); }

  Status Open() {
    KVTIER_RETURN_IF_ERROR(OpenRoot());
    Fd ns_dir;
    KVTIER_RETURN_IF_ERROR(EnsureNamespaceDir(&ns_dir));
    if (config_.direct) KVTIER_RETURN_IF_ERROR(ProbeDirect(ns_dir.get()));
    KVTIER_ASSIGN_OR_RETURN(std::vector<FileIndex::Found> found, ScanPages(ns_dir.get()));
    int64_t capacity = 0;
    if (config_.capacity) {
      capacity = *config_.capacity;
    } else {
      KVTIER_ASSIGN_OR_RETURN(capacity, DefaultCapacity(ns_dir.get(), found));
    }
    index_ = std::make_unique<FileIndex>(capacity, [this](const PageKey& key) { RemoveFile(key); });
    index_->Load(std::move(found));
    return Start();
  }

 protected:
  ExistsResult DoExists(std::span<const PageKey> keys, Clock::time_point deadline) override {
    ExistsResult r;
    for (const PageKey& key : keys) {
      if (!index_->Contains(key)) {
        // Perhaps written by another process: one open and stat.
        if (Clock::now() > deadline) break;
        const std::string hex = key.Hex();
        const auto root = Root();
        Fd fd(
            OpenBeneath(root->get(), {ns_name_, std::string_view(hex).substr(0, 2), hex}, O_PATH));
        struct stat st;
        if (!fd.ok() || ::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode)) break;
        index_->AddFound(key, st.st_size,
                         int64_t{st.st_mtim.tv_sec} * 1'000'000'000 + st.st_mtim.tv_nsec);
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
      if (io_uring* ring = ThreadRing()) {
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

  void FillStats(StorageStats& stats) const override {
    stats.stored_pages = index_->pages();
    stats.stored_bytes = index_->bytes();
    stats.capacity_bytes = index_->capacity();
    stats.evicted_pages = index_->evicted();
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

  // With no `capacity` in the URL: half of what the file system lets this user write at open,
  // plus the pages of this namespace already there, at least one page (header comment).
  Result<int64_t> DefaultCapacity(int ns_dirfd, const std::vector<FileIndex::Found>& found) {
    struct statvfs vfs;
    if (::fstatvfs(ns_dirfd, &vfs) != 0) {
      return Status::IOError(
          fmt::format("cannot read the free space of {}: {}", config_.root, std::strerror(errno)));
    }
    const int64_t free_bytes = static_cast<int64_t>(std::min<unsigned __int128>(
        static_cast<unsigned __int128>(vfs.f_bavail) * vfs.f_frsize, int64_t{1} << 60));
    int64_t stored = 0;
    for (const auto& f : found) stored += f.bytes;
    const int64_t capacity = std::max(value_bytes_, (free_bytes + stored) / 2);
    util::Log(util::LogLevel::kInfo,
              "storage {}: no capacity given; using {} (half of the {} free at open plus the {} "
              "this namespace already stores); set ?capacity= to choose",
              url(), FormatBytes(capacity), FormatBytes(free_bytes), FormatBytes(stored));
    return capacity;
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

  // Unlinks a page's file (evicted or removed); true when it is gone (or was never there).
  bool RemoveFile(const PageKey& key) {
    const std::string hex = key.Hex();
    Fd shard = OpenShard(hex, /*create=*/false);
    if (!shard.ok()) return errno == ENOENT;
    return ::unlinkat(shard.get(), hex.c_str(), 0) == 0 || errno == ENOENT;
  }

  static constexpr int64_t kNotRead = -3, kCancelled = -2, kReadError = -1;

  // One page being read: its file, and where the header, the payload and one byte past a page
  // (to notice a file longer than a page) go.
  struct PageRead {
    int fd = -1;
    // Direct reads: [0, 4 KiB) takes the header block, [4 KiB, 8 KiB) the payload's last partial
    // block, whose bytes then go to `tail_dst`.
    std::unique_ptr<std::byte, AlignedFree> block;
    std::byte* tail_dst = nullptr;
    size_t tail_bytes = 0;
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
    // The iovecs of one O_DIRECT read of the whole file. REQUIRES: DirectAligned(buffer).
    void PrepareDirect(const PageBuffer& buffer) {
      if (!block)
        block.reset(static_cast<std::byte*>(std::aligned_alloc(kDirectAlign, 2 * kDirectAlign)));
      iovcnt = 0;
      tail_dst = nullptr;
      tail_bytes = 0;
      iov[iovcnt++] = {block.get(), kDirectAlign};
      int last = buffer.num_segments - 1;
      while (last > 0 && buffer.segments[static_cast<size_t>(last)].empty()) --last;
      for (int s = 0; s <= last; ++s) {
        const auto& seg = buffer.segments[static_cast<size_t>(s)];
        const size_t whole = s < last ? seg.size() : seg.size() / kDirectAlign * kDirectAlign;
        if (whole > 0) iov[iovcnt++] = {seg.data(), whole};
        if (s == last && whole < seg.size()) {
          tail_dst = seg.data() + whole;
          tail_bytes = seg.size() - whole;
          iov[iovcnt++] = {block.get() + kDirectAlign, kDirectAlign};
        }
      }
    }
    // After a direct read: the header and padding, and the payload's tail, where the checks and
    // the caller expect them.
    void PlaceDirect() {
      std::memcpy(header, block.get(), sizeof(header));
      std::memcpy(pad, block.get() + sizeof(header), sizeof(pad));
      if (tail_bytes > 0) std::memcpy(tail_dst, block.get() + kDirectAlign, tail_bytes);
    }
  };

  // Opens the page's file for `read`; kOk, or the page's outcome.
  PageStatus OpenForRead(const PageKey& key, const PageBuffer& buffer, PageRead& read) {
    // O_NONBLOCK: a FIFO or device put in place of a page must not block the open.
    const std::string hex = key.Hex();
    read.fd = OpenBeneath(Root()->get(), {ns_name_, std::string_view(hex).substr(0, 2), hex},
                          O_RDONLY | O_NONBLOCK | (config_.direct ? O_DIRECT : 0));
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
    if (config_.direct) {
      if (DirectAligned(buffer)) read.PrepareDirect(buffer);
    } else {
      read.Prepare(buffer);
    }
    return PageStatus::kOk;
  }

  // Checks what `read` brought in; on a hit stamps the file as the most recently used.
  PageStatus FinishRead(const PageKey& key, const PageBuffer& buffer, PageRead& read) {
    if (read.got != value_bytes_) return PageStatus::kCorrupt;  // truncated or too long
    if (read.block) read.PlaceDirect();
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
    const int64_t stamp = index_->Touch(key, value_bytes_);
    const timespec times[2] = {{0, UTIME_OMIT}, ToTimespec(stamp)};
    ::futimens(fd, times);  // best effort: a read-only store still serves hits
    return PageStatus::kOk;
  }

  // The thread path: the header and the first chunk of the payload in one preadv, then chunk by
  // chunk, every read straight into the caller's buffer; each chunk is hashed as soon as it has
  // landed (the checks run in the documented order: length, header, payload checksum).
  PageStatus GetOne(const PageKey& key, const PageBuffer& buffer) {
    PageRead read;
    const PageStatus opened = OpenForRead(key, buffer, read);
    if (opened != PageStatus::kOk) return opened;
    if (config_.direct) {
      if (!read.block) return GetOneBounced(key, buffer, read);
      read.got = DirectRead(read.fd, read.iov, read.iovcnt, 0);
      if (read.got < 0) return PageStatus::kFailed;
      return FinishRead(key, buffer, read);
    }
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
      std::copy(iov, iov + iovcnt, hashed);  // ReadFull advances `iov`
      const size_t wanted = (first ? kFilePayloadOffset : 0) + payload_bytes;
      const ssize_t got = ReadFull(read.fd, iov, iovcnt, offset);
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
      if (r.block) {
        r.PrepareDirect(buffer);
        r.got = DirectRead(r.fd, r.iov, r.iovcnt, 0);
      } else {
        r.Prepare(buffer);
        r.got = ReadFull(r.fd, r.iov, r.iovcnt, 0);
      }
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
      if (!WriteFull(fd, iov, iovcnt, offset)) return false;
      offset += static_cast<off_t>(bytes);
    }
    header.payload_checksum = hasher.Digest();
    std::byte encoded[kPageHeaderBytes];
    EncodePageHeader(header, encoded);
    return WriteFull(fd, encoded, sizeof(encoded), 0);
  }

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

  // This I/O thread's 4 KiB-aligned bounce buffer of one chunk (pages whose buffers are not
  // aligned, and every direct write).
  static std::byte* Bounce() {
    thread_local std::unique_ptr<std::byte, AlignedFree> buffer(
        static_cast<std::byte*>(std::aligned_alloc(kDirectAlign, kChunkBytes)));
    return buffer.get();
  }

  static ssize_t DirectRead(int fd, iovec* iov, int iovcnt, off_t offset) {
    return ReadFullDirect(fd, iov, iovcnt, offset, kDirectAlign);
  }

  // A direct read through the bounce buffer, chunk by chunk, each chunk hashed and copied out.
  PageStatus GetOneBounced(const PageKey& key, const PageBuffer& buffer, PageRead& read) {
    std::byte* bounce = Bounce();
    std::optional<PayloadHasher> hasher;
    uint64_t stored_checksum = 0;
    int seg = 0;
    size_t at = 0;  // in segment `seg`
    for (off_t offset = 0; offset < value_bytes_; offset += static_cast<off_t>(kChunkBytes)) {
      iovec iov{bounce, kChunkBytes};
      const ssize_t got = DirectRead(read.fd, &iov, 1, offset);
      if (got < 0) return PageStatus::kFailed;
      const size_t wanted =
          static_cast<size_t>(std::min<int64_t>(kChunkBytes, value_bytes_ - offset));
      if (static_cast<size_t>(got) != wanted) return PageStatus::kCorrupt;  // length changed
      size_t from = 0;
      if (offset == 0) {
        std::memcpy(read.header, bounce, sizeof(read.header));
        std::memcpy(read.pad, bounce + sizeof(read.header), sizeof(read.pad));
        PageHeader parsed;
        const PageStatus st = ParsePageHeader(std::span(read.header), namespace_hash_, key,
                                              static_cast<uint64_t>(buffer.bytes()), &parsed);
        if (st != PageStatus::kOk) return st;
        if (!read.PadIsZero()) return PageStatus::kCorrupt;
        hasher.emplace(parsed.checksum_kind);
        if (!hasher->ok()) return PageStatus::kCorrupt;
        stored_checksum = parsed.payload_checksum;
        from = kFilePayloadOffset;
      }
      hasher->Update({bounce + from, wanted - from});
      while (from < wanted) {  // copy out into the segments
        const auto& s = buffer.segments[static_cast<size_t>(seg)];
        const size_t take = std::min(wanted - from, s.size() - at);
        std::memcpy(s.data() + at, bounce + from, take);
        from += take;
        at += take;
        if (at == s.size()) ++seg, at = 0;
      }
    }
    if (hasher->Digest() != stored_checksum) return PageStatus::kCorrupt;
    return MarkHit(key, read.fd);
  }

  // A direct write: the payload copied chunk by chunk into the bounce buffer (hashed there), each
  // chunk written at its 4 KiB-aligned place, the last one padded to 4 KiB; then the header block
  // at offset 0 and the file cut to its size.
  bool WriteDirect(int fd, const PageKey& key, const PageBuffer& buffer) {
    PageHeader header = NewPageHeader(namespace_hash_, key, static_cast<uint64_t>(buffer.bytes()));
    PayloadHasher hasher(header.checksum_kind);
    if (!hasher.ok()) {
      errno = EINVAL;
      return false;
    }
    std::byte* bounce = Bounce();
    off_t offset = kFilePayloadOffset;
    size_t fill = 0;
    auto flush = [&]() {
      hasher.Update({bounce, fill});
      const size_t padded = (fill + kDirectAlign - 1) / kDirectAlign * kDirectAlign;
      std::memset(bounce + fill, 0, padded - fill);
      const bool ok = WriteFull(fd, bounce, padded, offset);
      offset += static_cast<off_t>(padded);
      fill = 0;
      return ok;
    };
    for (int s = 0; s < buffer.num_segments; ++s) {
      const auto& seg = buffer.segments[static_cast<size_t>(s)];
      for (size_t at = 0; at < seg.size();) {
        const size_t take = std::min(kChunkBytes - fill, seg.size() - at);
        std::memcpy(bounce + fill, seg.data() + at, take);
        fill += take;
        at += take;
        if (fill == kChunkBytes && !flush()) return false;
      }
    }
    if (fill > 0 && !flush()) return false;
    header.payload_checksum = hasher.Digest();
    std::memset(bounce, 0, kDirectAlign);
    EncodePageHeader(header, std::span(bounce, kDirectAlign).first<kPageHeaderBytes>());
    return WriteFull(fd, bounce, kDirectAlign, 0) && ::ftruncate(fd, value_bytes_) == 0;
  }

  PageStatus SetOne(const PageKey& key, const PageBuffer& buffer,
                    const std::optional<PageKey>& parent = std::nullopt) {
    if (value_bytes_ > index_->capacity()) return PageStatus::kNoSpace;
    const std::string hex = key.Hex();
    Fd shard = OpenShard(hex, /*create=*/true);
    if (!shard.ok()) {
      util::Log(util::LogLevel::kWarning, "storage {}: cannot open the directory {}/{}: {}", url(),
                ns_name_, hex.substr(0, 2),
                errno == ELOOP ? "a symlink is on its path, which a store never follows"
                               : std::strerror(errno));
      return PageStatus::kFailed;
    }
    const std::string temp =
        fmt::format("{}{}.{}.{}", kTempPrefix, ::getpid(), temp_counter_.fetch_add(1), hex);
    Fd fd(::openat(
        shard.get(), temp.c_str(),
        O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW | (config_.direct ? O_DIRECT : 0),
        0600));
    if (!fd.ok()) {
      util::Log(util::LogLevel::kWarning, "storage {}: cannot create {}/{}/{}: {}", url(), ns_name_,
                hex.substr(0, 2), temp, std::strerror(errno));
      return PageStatus::kFailed;
    }
    bool ok = (config_.direct ? WriteDirect(fd.get(), key, buffer)
                              : WritePayloadAndHeader(fd.get(), key, buffer)) &&
              (!config_.fsync || ::fdatasync(fd.get()) == 0);
    int64_t stamp = 0;
    if (ok) {
      stamp = index_->NextStamp();
      const timespec times[2] = {{0, UTIME_OMIT}, ToTimespec(stamp)};
      ok = ::futimens(fd.get(), times) == 0 &&
           ::renameat(shard.get(), temp.c_str(), shard.get(), hex.c_str()) == 0;
    }
    if (!ok) {
      const int error = errno;
      util::Log(util::LogLevel::kWarning, "storage {}: cannot write {}/{}/{}: {}", url(), ns_name_,
                hex.substr(0, 2), hex, std::strerror(error));
      ::unlinkat(shard.get(), temp.c_str(), 0);
      // The file system is full (or the user's quota is): no room, not a fault of the page.
      return error == ENOSPC || error == EDQUOT ? PageStatus::kNoSpace : PageStatus::kFailed;
    }
    if (config_.fsync) ::fsync(shard.get());
    index_->Put(key, value_bytes_, stamp, parent);
    return PageStatus::kOk;
  }

  const Config config_;
  const std::string ns_name_;
  const uint64_t namespace_hash_;
  const int64_t value_bytes_;
  std::shared_ptr<const Fd> root_;    // read and swapped through std::atomic_load / atomic_store
  std::unique_ptr<FileIndex> index_;  // set by Open, before the I/O threads start
  std::atomic<uint64_t> temp_counter_{0};
  std::mutex dirs_mu_;  // one re-creation of missing directories at a time
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
  KVTIER_ASSIGN_OR_RETURN(std::optional<bool> direct, parsed.TakeBool("direct"));
  KVTIER_RETURN_IF_ERROR(parsed.CheckAllTaken(url));
  config.direct = direct.value_or(false);
  if (capacity && *capacity < 1) {
    return Status::InvalidArgument(fmt::format(
        "storage URL '{}': capacity must be at least 1 byte (leave it out for a bound derived "
        "from the free space)",
        url));
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
