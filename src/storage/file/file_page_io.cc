// Page I/O of the file store (file_page_io.h): whole and chunked reads with their checks, the
// io_uring batch, direct I/O through a bounce buffer, and the writes.
#include "storage/file/file_page_io.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#if KVTIER_HAVE_URING
#include <liburing.h>
#endif

#include "storage/file/file_io.h"

namespace kvtier::storage {
namespace {

using Clock = std::chrono::steady_clock;

static_assert(kFilePayloadOffset == kDirectAlign);

// Bytes of a page moved per read or write in the thread path: small enough that a chunk is still
// in this core's L2 when it is hashed right after it is read (or right before it is written), so
// the checksum does not make a second pass over the page at memory speed.
constexpr size_t kChunkBytes = size_t{256} << 10;

// Reads take a remainder of at most this many bytes with the chunk before it (a page of whole
// chunks has a 4 KiB tail, the header's place: one read call less per page, the chunk still well
// within L2).
constexpr size_t kMergedTailBytes = size_t{64} << 10;

// Walks a page buffer's segments in chunks of at most kChunkBytes. The first chunk is shorter by
// the payload's offset in the file, so every later chunk starts at a file offset that is a
// multiple of kChunkBytes: the page cache then holds the payload in large folios (writes at
// unaligned offsets leave small ones, which made every later read of the file cost ~50 % more
// kernel time). With `merge_tail` (reads) a last chunk of at most kMergedTailBytes is taken with
// the one before it.
class PayloadChunks {
 public:
  explicit PayloadChunks(const PageBuffer& buffer, bool merge_tail = false)
      : buffer_(buffer), left_(static_cast<size_t>(buffer.bytes())), merge_tail_(merge_tail) {
    SkipEmpty();
  }

  bool done() const { return segment_ >= buffer_.num_segments; }

  // Appends the next chunk's iovecs (at most kMaxSegments) to `iov` at `*iovcnt`; its bytes.
  size_t Next(iovec* iov, int* iovcnt) {
    size_t limit = first_ ? kChunkBytes - kFilePayloadOffset : kChunkBytes;
    if (merge_tail_ && left_ > limit && left_ - limit <= kMergedTailBytes) limit = left_;
    first_ = false;
    size_t bytes = 0;
    while (!done() && bytes < limit) {
      const auto& seg = buffer_.segments[static_cast<size_t>(segment_)];
      const size_t take = std::min(limit - bytes, seg.size() - at_);
      iov[(*iovcnt)++] = {seg.data() + at_, take};
      bytes += take;
      at_ += take;
      left_ -= take;
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
  size_t left_;  // bytes not yet in a chunk
  const bool merge_tail_;
  bool first_ = true;
};
static_assert(kChunkBytes > kFilePayloadOffset && kChunkBytes % kFilePayloadOffset == 0);

void HashIovecs(PayloadHasher& hasher, const iovec* iov, int iovcnt) {
  for (int i = 0; i < iovcnt; ++i) {
    hasher.Update({static_cast<const std::byte*>(iov[i].iov_base), iov[i].iov_len});
  }
}

// This I/O thread's 4 KiB-aligned bounce buffer of one chunk (pages whose buffers are not
// aligned, and every direct write).
std::byte* Bounce() {
  thread_local std::unique_ptr<std::byte, AlignedFree> buffer(
      static_cast<std::byte*>(std::aligned_alloc(kDirectAlign, kChunkBytes)));
  return buffer.get();
}

ssize_t DirectRead(int fd, iovec* iov, int iovcnt, off_t offset) {
  return ReadFullDirect(fd, iov, iovcnt, offset, kDirectAlign);
}

#if KVTIER_HAVE_URING
constexpr unsigned kRingDepth = 64;
#endif

}  // namespace

void AlignedFree::operator()(std::byte* p) const { std::free(p); }

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

PageRead::~PageRead() {
  if (fd >= 0) ::close(fd);
}

bool PageRead::PadIsZero(size_t header_bytes) const {
  // memcmp against zeros: a byte-by-byte loop over the 4 KiB was ~1 % of a 512 KiB Get's CPU.
  static constexpr std::byte kZeros[sizeof(head)] = {};
  const size_t from = std::min(header_bytes, sizeof(head));
  return std::memcmp(head + from, kZeros, sizeof(head) - from) == 0;
}

void PageRead::Prepare(const PageBuffer& buffer) {
  iovcnt = 0;
  iov[iovcnt++] = {head, sizeof(head)};
  for (int s = 0; s < buffer.num_segments; ++s) {
    const auto& seg = buffer.segments[static_cast<size_t>(s)];
    if (!seg.empty()) iov[iovcnt++] = {seg.data(), seg.size()};
  }
  iov[iovcnt++] = {&extra, 1};
}

void PageRead::PrepareDirect(const PageBuffer& buffer) {
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

void PageRead::PlaceDirect() {
  std::memcpy(head, block.get(), sizeof(head));
  if (tail_bytes > 0) std::memcpy(tail_dst, block.get() + kDirectAlign, tail_bytes);
}

void PageFileIo::PrepareRead(const PageBuffer& buffer, PageRead& read) const {
  if (direct_) {
    if (DirectAligned(buffer)) read.PrepareDirect(buffer);
  } else {
    read.Prepare(buffer);
  }
}

PageStatus PageFileIo::ReadPage(const PageKey& key, const PageBuffer& buffer,
                                PageRead& read) const {
  if (!direct_) return ReadChunked(key, buffer, read);
  read.source = ReadSource::kDisk;  // O_DIRECT: past the page cache
  if (!read.block) return ReadBounced(key, buffer, read);
  read.got = DirectRead(read.fd, read.iov, read.iovcnt, 0);
  if (read.got < 0) return PageStatus::kFailed;
  return CheckWholeRead(key, buffer, read);
}

PageStatus PageFileIo::CheckWholeRead(const PageKey& key, const PageBuffer& buffer,
                                      PageRead& read) const {
  if (read.got != file_bytes_) return PageStatus::kCorrupt;  // truncated or too long
  if (read.block) read.PlaceDirect();
  PageHeader parsed;
  const PageStatus st = CheckHeaderBlock(key, buffer, read, &parsed);
  if (st != PageStatus::kOk) return st;
  return CheckPayload(parsed, buffer);
}

PageStatus PageFileIo::CheckHeaderBlock(const PageKey& key, const PageBuffer& buffer,
                                        PageRead& read, PageHeader* parsed) const {
  const PageStatus st = ParsePageHeader(std::span(read.head), namespace_hash_, key,
                                        static_cast<uint64_t>(buffer.bytes()), parsed);
  if (st != PageStatus::kOk) return st;
  if (!read.PadIsZero(parsed->bytes())) return PageStatus::kCorrupt;
  read.version = parsed->version;
  read.parent = parsed->parent;
  return PageStatus::kOk;
}

PageStatus PageFileIo::StartChunkedCheck(const PageKey& key, const PageBuffer& buffer,
                                         PageRead& read, std::optional<PayloadHasher>* hasher,
                                         uint64_t* stored_checksum) const {
  PageHeader parsed;
  const PageStatus st = CheckHeaderBlock(key, buffer, read, &parsed);
  if (st != PageStatus::kOk) return st;
  hasher->emplace(parsed.checksum_kind);
  if (!(*hasher)->ok()) return PageStatus::kCorrupt;
  *stored_checksum = parsed.payload_checksum;
  return PageStatus::kOk;
}

// The header and the first chunk of the payload in one preadv, then chunk by chunk, every read
// straight into the caller's buffer; each chunk is hashed as soon as it has landed.
PageStatus PageFileIo::ReadChunked(const PageKey& key, const PageBuffer& buffer,
                                   PageRead& read) const {
  PayloadChunks chunks(buffer, /*merge_tail=*/true);
  std::optional<PayloadHasher> hasher;
  uint64_t stored_checksum = 0;
  off_t offset = 0;
  bool first = true;
  do {
    iovec iov[PageBuffer::kMaxSegments + 3];
    int iovcnt = 0;
    if (first) iov[iovcnt++] = {read.head, sizeof(read.head)};
    const int payload_from = iovcnt;
    const size_t payload_bytes = chunks.Next(iov, &iovcnt);
    const int payload_to = iovcnt;
    // One byte past the page with the last chunk: a file grown since the open is noticed.
    if (chunks.done()) iov[iovcnt++] = {&read.extra, 1};
    iovec hashed[PageBuffer::kMaxSegments + 3];
    std::copy(iov, iov + iovcnt, hashed);  // ReadFull advances `iov`
    const size_t wanted = (first ? kFilePayloadOffset : 0) + payload_bytes;
    const ssize_t got = ReadFullNoting(read.fd, iov, iovcnt, offset, &read.source);
    if (got < 0) return PageStatus::kFailed;
    if (static_cast<size_t>(got) != wanted) return PageStatus::kCorrupt;  // length changed
    offset += got;
    if (first) {
      const PageStatus st = StartChunkedCheck(key, buffer, read, &hasher, &stored_checksum);
      if (st != PageStatus::kOk) return st;
      first = false;
    }
    HashIovecs(*hasher, hashed + payload_from, payload_to - payload_from);
  } while (!chunks.done());
  return hasher->Digest() == stored_checksum ? PageStatus::kOk : PageStatus::kCorrupt;
}

// A direct read through the bounce buffer, chunk by chunk, each chunk hashed and copied out.
PageStatus PageFileIo::ReadBounced(const PageKey& key, const PageBuffer& buffer,
                                   PageRead& read) const {
  std::byte* bounce = Bounce();
  std::optional<PayloadHasher> hasher;
  uint64_t stored_checksum = 0;
  int seg = 0;
  size_t at = 0;  // in segment `seg`
  for (off_t offset = 0; offset < file_bytes_; offset += static_cast<off_t>(kChunkBytes)) {
    iovec iov{bounce, kChunkBytes};
    const ssize_t got = DirectRead(read.fd, &iov, 1, offset);
    if (got < 0) return PageStatus::kFailed;
    const size_t wanted = static_cast<size_t>(std::min<int64_t>(kChunkBytes, file_bytes_ - offset));
    if (static_cast<size_t>(got) != wanted) return PageStatus::kCorrupt;  // length changed
    size_t from = 0;
    if (offset == 0) {
      std::memcpy(read.head, bounce, sizeof(read.head));
      const PageStatus st = StartChunkedCheck(key, buffer, read, &hasher, &stored_checksum);
      if (st != PageStatus::kOk) return st;
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
  return hasher->Digest() == stored_checksum ? PageStatus::kOk : PageStatus::kCorrupt;
}

#if KVTIER_HAVE_URING
void PageFileIo::ReadBatchWithUring(io_uring& ring, std::span<const PageKey> keys,
                                    std::span<const PageBuffer> buffers, std::span<PageRead> reads,
                                    std::span<PageStatus> out, Clock::time_point deadline,
                                    const std::function<void(size_t)>& on_hit) const {
  const size_t n = keys.size();
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
          0, std::chrono::duration_cast<std::chrono::nanoseconds>(deadline - Clock::now()).count());
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
    r.got = res >= 0 ? res : res == -ECANCELED ? PageRead::kCancelled : PageRead::kReadError;
    out[tag] = FinishUringRead(keys[tag], buffers[tag], r, cancelled);
    if (out[tag] == PageStatus::kOk) on_hit(tag);
  }
  for (size_t i = 0; i < n; ++i) {
    // Pages never submitted (cancelled first) or never completed (the ring failed).
    if (out[i] == PageStatus::kOk && reads[i].got == PageRead::kNotRead) {
      out[i] = cancelled ? PageStatus::kTimedOut : PageStatus::kFailed;
    }
  }
}

PageStatus PageFileIo::FinishUringRead(const PageKey& key, const PageBuffer& buffer, PageRead& r,
                                       bool cancelled) const {
  if (r.got > 0 && r.got < file_bytes_) {
    // A short read that may not be the end of the file: read it again the plain way.
    if (r.block) {
      r.PrepareDirect(buffer);
      r.got = DirectRead(r.fd, r.iov, r.iovcnt, 0);
    } else {
      r.Prepare(buffer);
      r.got = ReadFull(r.fd, r.iov, r.iovcnt, 0);
    }
  }
  if (r.got == PageRead::kCancelled || (r.got == PageRead::kReadError && cancelled)) {
    return PageStatus::kTimedOut;
  }
  if (r.got < 0) return PageStatus::kFailed;
  return CheckWholeRead(key, buffer, r);
}

io_uring* PageFileIo::ThreadRing() {
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

bool PageFileIo::WritePage(int fd, const PageKey& key, const PageBuffer& buffer,
                           const std::optional<PageKey>& parent, WriteTimes* times) const {
  PageHeader header =
      NewPageHeaderWithParent(namespace_hash_, key, static_cast<uint64_t>(buffer.bytes()), parent);
  PayloadHasher hasher(header.checksum_kind);
  if (!hasher.ok()) {
    errno = EINVAL;
    return false;
  }
  WriteTimes unused;
  WriteTimes& t = times != nullptr ? *times : unused;
  return direct_ ? WriteDirect(fd, buffer, header, hasher, t)
                 : WriteChunked(fd, buffer, header, hasher, t);
}

// The payload chunk by chunk after the header's place, each chunk hashed right before it is
// written (so the write copies it from cache), then the header with that checksum at offset 0.
bool PageFileIo::WriteChunked(int fd, const PageBuffer& buffer, PageHeader& header,
                              PayloadHasher& hasher, WriteTimes& times) const {
  PayloadChunks chunks(buffer);
  off_t offset = kFilePayloadOffset;  // the header's padding stays a hole (zeros)
  Clock::time_point t0 = Clock::now();
  while (!chunks.done()) {
    iovec iov[PageBuffer::kMaxSegments];
    int iovcnt = 0;
    const size_t bytes = chunks.Next(iov, &iovcnt);
    HashIovecs(hasher, iov, iovcnt);
    const Clock::time_point hashed = Clock::now();
    times.hash_ns += WriteProfile::Ns(hashed - t0);
    const bool ok = WriteFull(fd, iov, iovcnt, offset);
    t0 = Clock::now();
    times.write_ns += WriteProfile::Ns(t0 - hashed);
    if (!ok) return false;
    offset += static_cast<off_t>(bytes);
  }
  header.payload_checksum = hasher.Digest();
  std::byte encoded[kMaxPageHeaderBytes];
  EncodePageHeader(header, encoded);
  const bool ok = WriteFull(fd, encoded, header.bytes(), 0);
  times.write_ns += WriteProfile::Ns(Clock::now() - t0);
  return ok;
}

// A direct write: the payload copied chunk by chunk into the bounce buffer (hashed there), each
// chunk written at its 4 KiB-aligned place, the last one padded to 4 KiB; then the header block
// at offset 0 and the file cut to its size.
bool PageFileIo::WriteDirect(int fd, const PageBuffer& buffer, PageHeader& header,
                             PayloadHasher& hasher, WriteTimes& times) const {
  std::byte* bounce = Bounce();
  off_t offset = kFilePayloadOffset;
  size_t fill = 0;
  Clock::time_point t0 = Clock::now();
  auto flush = [&]() {
    const Clock::time_point copied = Clock::now();
    times.copy_ns += WriteProfile::Ns(copied - t0);
    hasher.Update({bounce, fill});
    const size_t padded = (fill + kDirectAlign - 1) / kDirectAlign * kDirectAlign;
    std::memset(bounce + fill, 0, padded - fill);
    const Clock::time_point hashed = Clock::now();
    times.hash_ns += WriteProfile::Ns(hashed - copied);
    const bool ok = WriteFull(fd, bounce, padded, offset);
    t0 = Clock::now();
    times.write_ns += WriteProfile::Ns(t0 - hashed);
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
  EncodePageHeader(header, std::span(bounce, kDirectAlign));
  const bool ok = WriteFull(fd, bounce, kDirectAlign, 0) && ::ftruncate(fd, file_bytes_) == 0;
  times.write_ns += WriteProfile::Ns(Clock::now() - t0);
  return ok;
}

}  // namespace kvtier::storage
