// Whole reads and writes, and opens beneath a directory (file_io.h).
//
// Thread safety: pure functions; `g_openat2` is a relaxed atomic that only moves from "unknown"
// to "yes" or "no" (and the test hook).
#include "storage/file/file_io.h"

#include <fcntl.h>
#include <linux/openat2.h>
#include <stdio.h>  // renameat2
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <string>

namespace kvtier::storage {
namespace {

// Whether openat2 works here: 0 unknown, 1 yes, -1 no (ENOSYS, or refused by a seccomp filter).
std::atomic<int> g_openat2{0};

// Advances `iov` past `n` bytes; the iovecs left.
int Consume(iovec*& iov, int iovcnt, size_t n) {
  while (iovcnt > 0 && n >= iov->iov_len) {
    n -= iov->iov_len;
    ++iov, --iovcnt;
  }
  if (iovcnt > 0) {
    iov->iov_base = static_cast<char*>(iov->iov_base) + n;
    iov->iov_len -= n;
  }
  return iovcnt;
}

bool IsPlainComponent(std::string_view c) {
  return !c.empty() && c != "." && c != ".." && c.find('/') == std::string_view::npos;
}

int OpenWithOpenat2(int dirfd, std::initializer_list<std::string_view> components, int flags,
                    mode_t mode) {
  std::string path;
  for (std::string_view c : components) {
    if (!path.empty()) path += '/';
    path += c;
  }
  open_how how{};
  how.flags = static_cast<uint64_t>(flags);
  how.mode = (flags & (O_CREAT | O_TMPFILE)) != 0 ? mode : 0;
  how.resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS;
  for (;;) {
    const long fd = ::syscall(SYS_openat2, dirfd, path.c_str(), &how, sizeof(how));
    if (fd >= 0 || errno != EINTR) return static_cast<int>(fd);
  }
}

int OpenWithOpenat(int dirfd, std::initializer_list<std::string_view> components, int flags,
                   mode_t mode) {
  int at = dirfd;
  Fd held;  // the intermediate directory `at` refers to (not the caller's `dirfd`)
  size_t left = components.size();
  for (std::string_view c : components) {
    const std::string name(c);
    if (--left == 0) return ::openat(at, name.c_str(), flags, mode);
    const int next = ::openat(at, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (next < 0) return -1;
    held = Fd(next);
    at = next;
  }
  errno = EINVAL;
  return -1;
}

}  // namespace

void Fd::Reset() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

namespace {
// Reads until the iovecs are full, the file ends, or (align > 0) a read ends off an `align`
// boundary.
ssize_t ReadUntil(int fd, iovec* iov, int iovcnt, off_t offset, size_t align) {
  const off_t start = offset;
  while (iovcnt > 0) {
    const ssize_t n = ::preadv(fd, iov, iovcnt, offset);
    if (n < 0) {
      if (errno == EINTR) continue;
      return -1;
    }
    if (n == 0) break;  // end of file
    offset += n;
    if (align > 0 && offset % static_cast<off_t>(align) != 0) break;
    iovcnt = Consume(iov, iovcnt, static_cast<size_t>(n));
  }
  return offset - start;
}
}  // namespace

ssize_t ReadFull(int fd, iovec* iov, int iovcnt, off_t offset) {
  return ReadUntil(fd, iov, iovcnt, offset, 0);
}

ssize_t ReadFullNoting(int fd, iovec* iov, int iovcnt, off_t offset, ReadSource* source) {
  if (*source == ReadSource::kDisk || *source == ReadSource::kUnknown) {
    return ReadUntil(fd, iov, iovcnt, offset, 0);
  }
  size_t wanted = 0;
  for (int i = 0; i < iovcnt; ++i) wanted += iov[i].iov_len;
  ssize_t n = -1;
  do {
    n = ::preadv2(fd, iov, iovcnt, offset, RWF_NOWAIT);
  } while (n < 0 && errno == EINTR);
  if (n < 0) {
    if (errno != EAGAIN) *source = ReadSource::kUnknown;  // EOPNOTSUPP: no probing here
    n = 0;                                                // the plain read says what failed
  }
  if (static_cast<size_t>(n) == wanted) {
    *source = ReadSource::kCache;
    return n;
  }
  iovcnt = Consume(iov, iovcnt, static_cast<size_t>(n));
  const ssize_t rest = ReadUntil(fd, iov, iovcnt, offset + n, 0);
  if (rest < 0) return -1;
  if (*source != ReadSource::kUnknown) {
    // More bytes after the probe: they were not in the page cache (none: the file ended).
    *source = rest > 0 ? ReadSource::kDisk : ReadSource::kCache;
  }
  return n + rest;
}

ssize_t ReadFullDirect(int fd, iovec* iov, int iovcnt, off_t offset, size_t align) {
  return ReadUntil(fd, iov, iovcnt, offset, align);
}

ssize_t ReadFull(int fd, void* buf, size_t bytes, off_t offset) {
  iovec iov{buf, bytes};
  return ReadFull(fd, &iov, 1, offset);
}

bool WriteFull(int fd, iovec* iov, int iovcnt, off_t offset) {
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
    iovcnt = Consume(iov, iovcnt, static_cast<size_t>(n));
  }
  return true;
}

bool WriteFull(int fd, const void* buf, size_t bytes, off_t offset) {
  iovec iov{const_cast<void*>(buf), bytes};
  return WriteFull(fd, &iov, 1, offset);
}

int OpenBeneath(int dirfd, std::initializer_list<std::string_view> components, int flags,
                mode_t mode) {
  if (components.size() == 0) {
    errno = EINVAL;
    return -1;
  }
  for (std::string_view c : components) {
    if (!IsPlainComponent(c)) {
      errno = EINVAL;
      return -1;
    }
  }
  flags |= O_NOFOLLOW | O_CLOEXEC;
  if (g_openat2.load(std::memory_order_relaxed) >= 0) {
    const int fd = OpenWithOpenat2(dirfd, components, flags, mode);
    if (fd >= 0) {
      g_openat2.store(1, std::memory_order_relaxed);
      return fd;
    }
    // ENOSYS (before Linux 5.6), or EPERM from a seccomp filter that does not know openat2,
    // before it ever worked: resolve component by component from now on. EPERM is also the
    // file's own answer (O_NOATIME on a file of another owner): openat2 is given up only when
    // the component-by-component open does not say EPERM too.
    const int error = errno;
    if ((error != ENOSYS && error != EPERM) || g_openat2.load(std::memory_order_relaxed) != 0) {
      return -1;
    }
    const int fd2 = OpenWithOpenat(dirfd, components, flags, mode);
    if (error == ENOSYS || fd2 >= 0 || errno != EPERM)
      g_openat2.store(-1, std::memory_order_relaxed);
    return fd2;
  }
  return OpenWithOpenat(dirfd, components, flags, mode);
}

void ForceOpenatFallbackForTesting(bool force) {
  g_openat2.store(force ? -1 : 0, std::memory_order_relaxed);
}

int Openat2StateForTesting() { return g_openat2.load(std::memory_order_relaxed); }

}  // namespace kvtier::storage

namespace kvtier {

// kvtier/page_file.h
bool PublishFile(int dirfd, const char* temp, const char* name, bool* replaced) {
  *replaced = false;
  // A few tries: what was at `name` may go (an eviction) between the two calls.
  for (int attempt = 0; attempt < 3; ++attempt) {
    if (::renameat2(dirfd, temp, dirfd, name, RENAME_NOREPLACE) == 0) return true;
    if (errno != EEXIST) break;  // EINVAL / ENOSYS: no flags here; anything else: below
    struct stat st;
    if (::fstatat(dirfd, name, &st, AT_SYMLINK_NOFOLLOW) != 0) {
      if (errno == ENOENT) continue;
      break;
    }
    if (!S_ISREG(st.st_mode)) break;  // a plain rename decides (a directory: EISDIR)
    if (::renameat2(dirfd, temp, dirfd, name, RENAME_EXCHANGE) == 0) {
      *replaced = true;
      return true;
    }
    if (errno != ENOENT) break;
  }
  return ::renameat(dirfd, temp, dirfd, name) == 0;
}

}  // namespace kvtier
