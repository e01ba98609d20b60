// Internal: the page I/O of the file store — one page file's bytes (file_backend.h's layout: the
// header, zeros up to kFilePayloadOffset, then the payload) moved between a file the backend has
// opened and a page buffer, with the checks of page_format.h. Paths, the index, stamps and the
// backend's requests are the backend's (file_backend.cc); nothing here opens, names or removes a
// file.
//
// Reads. Thread path (ReadPage): the header and the first chunk of the payload in one preadv,
// then chunk by chunk (256 KiB, the later chunks at file offsets that are multiples of it; a
// remainder of at most 64 KiB goes with the chunk before it, one call less per page), every
// read straight into the caller's buffer and each chunk hashed as soon as it has landed, while it
// is still in this core's cache; the checks run in the documented order (length, header,
// padding, payload checksum) and a bad header ends the read early. io_uring
// (ReadBatchWithUring): each page in one readv, a batch's reads in flight together on the I/O
// thread's ring, each page checked by that thread as its read completes. direct=1 (O_DIRECT
// files): buffers aligned as DirectAligned says are read in one readv (the header block and the
// payload's last partial block land in a small aligned block and are copied into place), others
// chunk by chunk through a per-thread aligned bounce buffer.
//
// Writes (WritePage): the payload chunk by chunk after the header's place, each chunk hashed right
// before its pwritev, then the header (version 2, naming the page's parent) with that checksum at
// offset 0 (direct=1: through the
// bounce buffer, the last block padded to 4 KiB and the file cut to size after). The caller
// publishes the file (rename) only after WritePage returns true.
//
// Thread safety: a PageFileIo is immutable; its calls may run on any number of threads at once
// (a PageRead belongs to one call; bounce buffers and rings are per thread).
#pragma once

#include <sys/types.h>
#include <sys/uio.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>

#include "kvtier/page_key.h"
#include "kvtier/storage.h"
#include "storage/file/file_backend.h"
#include "storage/file/file_io.h"
#include "storage/file/write_profile.h"
#include "storage/page_format.h"

#if KVTIER_HAVE_URING
struct io_uring;
#endif

namespace kvtier::storage {

// Direct I/O (direct=1): file offsets, lengths and memory aligned to this.
inline constexpr size_t kDirectAlign = 4096;

// Whether a direct read can land straight in `buffer`: every segment starts on a 4 KiB boundary
// and every one but the last holds whole 4 KiB blocks.
bool DirectAligned(const PageBuffer& buffer);

struct AlignedFree {
  void operator()(std::byte* p) const;
};

// One page being read: its file (set by the caller, closed with this), and where the header, the
// payload and one byte past a page (to notice a file longer than a page) go.
struct PageRead {
  static constexpr int64_t kNotRead = -3, kCancelled = -2, kReadError = -1;

  PageRead() = default;
  PageRead(const PageRead&) = delete;
  PageRead& operator=(const PageRead&) = delete;
  ~PageRead();

  int fd = -1;
  // The file's mtime at the open (ns since the epoch; set by the file backend, which writes a
  // hit's stamp only when this is older than it by more than its granularity).
  int64_t mtime_ns = 0;
  // Direct reads: [0, 4 KiB) takes the header block, [4 KiB, 8 KiB) the payload's last partial
  // block, whose bytes then go to `tail_dst`.
  std::unique_ptr<std::byte, AlignedFree> block;
  std::byte* tail_dst = nullptr;
  size_t tail_bytes = 0;
  // The header block: the header (either version's), then zeros up to the payload.
  std::byte head[kFilePayloadOffset];
  std::byte extra;
  iovec iov[PageBuffer::kMaxSegments + 3];
  int iovcnt = 0;
  int64_t got = kNotRead;  // bytes read, or one of the k... codes above
  // Once its header block checked out (whatever the payload's outcome): the header's version and
  // the parent it names (nullopt: none, or version 1). The file store records them for a page
  // another process wrote (file_index.h), reusing the read instead of reading the header again.
  uint16_t version = 0;
  std::optional<PageKey> parent;
  // Where the thread path's reads found the bytes (ReadFullNoting); direct reads: kDisk; io_uring
  // reads: kNotProbed.
  ReadSource source = ReadSource::kNotProbed;

  // Whether the header block is zero from `header_bytes` (the parsed header's length) on.
  bool PadIsZero(size_t header_bytes) const;
  // The iovecs of one read of the whole file.
  void Prepare(const PageBuffer& buffer);
  // The iovecs of one O_DIRECT read of the whole file. REQUIRES: DirectAligned(buffer).
  void PrepareDirect(const PageBuffer& buffer);
  // After a direct read: the header and padding, and the payload's tail, where the checks and
  // the caller expect them.
  void PlaceDirect();
};

class PageFileIo {
 public:
  // Files of `file_bytes` (kFilePayloadOffset + a page's bytes) in the namespace whose hash is
  // `namespace_hash`; `direct`: the caller opens them with O_DIRECT.
  PageFileIo(uint64_t namespace_hash, int64_t file_bytes, bool direct)
      : namespace_hash_(namespace_hash), file_bytes_(file_bytes), direct_(direct) {}

  // Sets `read` up for a whole-file read of the page in `read.fd` (a regular file of
  // `file_bytes`, just opened) into `buffer`.
  void PrepareRead(const PageBuffer& buffer, PageRead& read) const;

  // Reads and checks the page prepared in `read`: kOk with the payload in `buffer`; kCorrupt or
  // kWrongNamespace for a page that does not check out; kFailed for a read error.
  PageStatus ReadPage(const PageKey& key, const PageBuffer& buffer, PageRead& read) const;

  // Writes the page into `fd` (a new, empty file, O_DIRECT when direct) with a version-2 header
  // naming `parent` (nullopt: none known); false with errno. `times` (optional): where the
  // write's time went (write_profile.h).
  bool WritePage(int fd, const PageKey& key, const PageBuffer& buffer,
                 const std::optional<PageKey>& parent = std::nullopt,
                 WriteTimes* times = nullptr) const;

#if KVTIER_HAVE_URING
  // This I/O thread's ring, made at its first use; null when io_uring is not available (then
  // reads go through the thread path).
  static io_uring* ThreadRing();

  // Reads the pages whose `out[i]` is kOk (each prepared by PrepareRead) with their reads in
  // flight together on `ring` (IOSQE_ASYNC: the kernel's workers copy in parallel), checking each
  // page as its read completes and calling `on_hit(i)` for each that checks out; `out[i]` is then
  // that page's outcome. Past the deadline the reads still in flight are cancelled and waited
  // for (the kernel may be writing into the caller's buffers until they complete); pages not
  // read by then are kTimedOut. Pages whose `out[i]` is not kOk are left alone.
  void ReadBatchWithUring(io_uring& ring, std::span<const PageKey> keys,
                          std::span<const PageBuffer> buffers, std::span<PageRead> reads,
                          std::span<PageStatus> out, std::chrono::steady_clock::time_point deadline,
                          const std::function<void(size_t)>& on_hit) const;
#endif

 private:
  // Checks what a whole-file read brought into `read` (its length, header block and payload).
  PageStatus CheckWholeRead(const PageKey& key, const PageBuffer& buffer, PageRead& read) const;
  // The header block in `read` (the header, then its zero padding) checked for a page of
  // `buffer`'s size under `key`; kOk fills `*parsed` and `read.version`, `read.parent`.
  PageStatus CheckHeaderBlock(const PageKey& key, const PageBuffer& buffer, PageRead& read,
                              PageHeader* parsed) const;
  // For the reads that hash chunk by chunk: checks the header block and starts `*hasher` of the
  // stored checksum's kind; the payload's digest must then equal `*stored_checksum`.
  PageStatus StartChunkedCheck(const PageKey& key, const PageBuffer& buffer, PageRead& read,
                               std::optional<PayloadHasher>* hasher,
                               uint64_t* stored_checksum) const;
  PageStatus ReadChunked(const PageKey& key, const PageBuffer& buffer, PageRead& read) const;
  PageStatus ReadBounced(const PageKey& key, const PageBuffer& buffer, PageRead& read) const;
  // The payload of `buffer` hashed into `hasher` and written, then `header` with that checksum.
  bool WriteChunked(int fd, const PageBuffer& buffer, PageHeader& header, PayloadHasher& hasher,
                    WriteTimes& times) const;
  bool WriteDirect(int fd, const PageBuffer& buffer, PageHeader& header, PayloadHasher& hasher,
                   WriteTimes& times) const;
#if KVTIER_HAVE_URING
  // A completed uring read of one page: a short read is read again the plain way; then checked.
  PageStatus FinishUringRead(const PageKey& key, const PageBuffer& buffer, PageRead& read,
                             bool cancelled) const;
#endif

  const uint64_t namespace_hash_;
  const int64_t file_bytes_;
  const bool direct_;
};

}  // namespace kvtier::storage
