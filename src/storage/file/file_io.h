// Internal: the file system calls of the file backend — whole reads and writes that survive
// EINTR and short counts, and opens resolved beneath a directory without following symlinks.
//
// Beneath: every path the file store opens is relative to a directory it holds open (the store
// root) and is resolved with openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS)
// where the kernel has it (Linux 5.6), else one openat(O_NOFOLLOW) per component from that
// directory (an EPERM that the per-component open gives too, such as O_NOATIME on a file of
// another owner, is the file's answer and does not give openat2 up). Either way a symlink anywhere
// on the path (a shard directory replaced by one, a symlinked page file) fails the open with
// ELOOP, and no component can leave the directory.
// Components are never "." or ".." (the callers build them from hex digits and the namespace
// name; OpenBeneath refuses them with EINVAL).
//
// Thread safety: pure functions of their arguments (the openat2 probe is a relaxed atomic).
#pragma once

#include <sys/types.h>
#include <sys/uio.h>

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string_view>

#include "kvtier/page_file.h"

namespace kvtier::storage {

// An open file descriptor, closed on scope exit.
class Fd {
 public:
  explicit Fd(int fd = -1) : fd_(fd) {}
  ~Fd() { Reset(); }
  Fd(Fd&& other) noexcept : fd_(other.Release()) {}
  Fd& operator=(Fd&& other) noexcept {
    if (this != &other) {
      Reset();
      fd_ = other.Release();
    }
    return *this;
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;

  int get() const { return fd_; }
  bool ok() const { return fd_ >= 0; }
  int Release() {
    const int fd = fd_;
    fd_ = -1;
    return fd;
  }
  void Reset();

 private:
  int fd_;
};

// Reads into `iov[0..iovcnt)` from file offset `offset` until the iovecs are full or the file
// ends, retrying on EINTR and after short reads. Returns the bytes read (less than asked only at
// the end of the file), or -1 with errno. `iov` is consumed (advanced past what was read).
ssize_t ReadFull(int fd, iovec* iov, int iovcnt, off_t offset);
ssize_t ReadFull(int fd, void* buf, size_t bytes, off_t offset);
// Where the bytes of ReadFullNoting came from.
enum class ReadSource : uint8_t {
  kNotProbed,  // nothing read yet
  kCache,      // every read so far was served whole by the page cache
  kDisk,       // some read needed the disk (later reads are not probed)
  kUnknown,    // the file system does not take RWF_NOWAIT (later reads are not probed)
};
// ReadFull that tells whether the page cache held the bytes: it first reads with RWF_NOWAIT
// (preadv2: only what the page cache holds, never waiting for the disk; a miss starts the
// kernel's readahead), and reads what that left the plain way. `*source` (kNotProbed for the
// first read of a file) becomes kDisk when the plain read had bytes to read, kCache when the
// probe read everything; once kDisk or kUnknown it reads plainly, so a cold page costs one
// extra (failed) call and a hot one none. Best effort: a readahead the probe started that a fast
// disk finishes before the probe gives up counts as the page cache.
ssize_t ReadFullNoting(int fd, iovec* iov, int iovcnt, off_t offset, ReadSource* source);
// The same for a file opened with O_DIRECT, whose reads must start on an `align` boundary: it
// stops after a read that ends off one (the end of the file; the tail is then in the iovecs).
ssize_t ReadFullDirect(int fd, iovec* iov, int iovcnt, off_t offset, size_t align);

// Writes all of `iov[0..iovcnt)` at `offset`, retrying on EINTR and after short writes. False with
// errno on an error (a write of 0 bytes is EIO). `iov` is consumed.
bool WriteFull(int fd, iovec* iov, int iovcnt, off_t offset);
bool WriteFull(int fd, const void* buf, size_t bytes, off_t offset);

// PublishFile (putting a written page file in place): kvtier/page_file.h, public so that the
// bench's write ceiling does the same.
using kvtier::PublishFile;

// Opens `dirfd`/components[0]/.../components[n-1] beneath `dirfd` with no symlink followed (see
// above). `flags` apply to the last component (O_NOFOLLOW and O_CLOEXEC are always added);
// `mode` is used with O_CREAT. The intermediate components must be directories. -1 with errno
// (ELOOP for a symlink on the path, ENOENT, ...) on failure.
int OpenBeneath(int dirfd, std::initializer_list<std::string_view> components, int flags,
                mode_t mode = 0);

// Test hook: resolve with the openat fallback even where openat2 works (false: probe the kernel).
void ForceOpenatFallbackForTesting(bool force);
// Test hook: whether OpenBeneath uses openat2: 1 yes, -1 no (the fallback), 0 not known yet.
int Openat2StateForTesting();

}  // namespace kvtier::storage
