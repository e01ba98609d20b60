// The `file://` backend's directories and files, reached beneath its root
// (file_backend_internal.h "Paths"): the root made and held open (made again if removed while
// running), the namespace and shard directories (made when a Set needs them, one re-creation at a
// time), a page file opened for reading without following a symlink and without writing its
// atime where the file is this user's, a page file removed, and the O_DIRECT probe of direct=1.
// -1 / false / a Status with errno's text on failure; nothing here touches the index.
#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>

#include "storage/file/file_backend_internal.h"
#include "util/log.h"

namespace kvtier::storage {
namespace {

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

}  // namespace

// Creates the root directory (and its parents) and holds it open.
Status FileBackend::OpenRoot() {
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
Status FileBackend::EnsureNamespaceDir(Fd* out) {
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

// The shard directory of `hex` beneath the root; with `create`, made (with the namespace
// directory, and the root if it was removed) when missing. -1 with errno on failure (ELOOP when
// a symlink is on the path).
Fd FileBackend::OpenShard(const std::string& hex, bool create) {
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

// Opens the page file of `key` read-only beneath the root with `flags` added, and O_NOATIME:
// a read does not write the file's atime (an inode write, on ext4 a journal handle, on every
// read of a file whose mtime a hit moved past its atime). O_NOATIME is refused (EPERM) for a
// file this process does not own (a store another user wrote, without CAP_FOWNER): that open
// is made again without it, and once that works this backend opens without it from then on
// (said once in the log). -1 with errno on failure.
int FileBackend::OpenPageForRead(const PageKey& key, int flags) {
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

// Unlinks a page's file (evicted or removed); true when it is gone (or was never there).
bool FileBackend::RemoveFile(const PageKey& key) {
  const std::string hex = key.Hex();
  Fd shard = OpenShard(hex, /*create=*/false);
  if (!shard.ok()) return errno == ENOENT;
  return ::unlinkat(shard.get(), hex.c_str(), 0) == 0 || errno == ENOENT;
}

// O_DIRECT works on the store's file system (tmpfs, for one, refuses it).
Status FileBackend::ProbeDirect(int ns_dirfd) {
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

}  // namespace kvtier::storage
