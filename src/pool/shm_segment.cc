// Internal: the shared-memory object behind a shared host pool (see shm_segment.h).
//
// A segment named N is the POSIX shared-memory object "/kvtier.N" (a tmpfs file under /dev/shm)
// or, when huge pages were asked for and a hugetlbfs mount has room, the file "kvtier.N" on that
// mount. Space is reserved when the segment is made (posix_fallocate on tmpfs, huge pages on
// hugetlbfs) so that a full /dev/shm is an OutOfMemory at creation rather than a SIGBUS at the
// first write of some later page.
//
// Thread safety: see shm_segment.h.
#include "pool/shm_segment.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>
#include <utility>

#include "util/log.h"

namespace kvtier::shm {

namespace {

constexpr size_t kMaxNameLength = 200;

std::string ShmObjectName(std::string_view name) { return fmt::format("/kvtier.{}", name); }
std::string ShmPath(std::string_view name) { return fmt::format("/dev/shm/kvtier.{}", name); }

// The first hugetlbfs mount point in /proc/mounts, or "" when there is none.
std::string HugetlbfsMount() {
  std::FILE* f = std::fopen("/proc/mounts", "r");
  if (f == nullptr) return "";
  char line[1024];
  std::string mount;
  while (std::fgets(line, sizeof(line), f) != nullptr) {
    char device[256], dir[512], type[64];
    if (std::sscanf(line, "%255s %511s %63s", device, dir, type) == 3 &&
        std::strcmp(type, "hugetlbfs") == 0) {
      mount = dir;
      break;
    }
  }
  std::fclose(f);
  return mount;
}

std::string HugetlbfsPath(const std::string& mount, std::string_view name) {
  return fmt::format("{}/kvtier.{}", mount, name);
}

// A file descriptor closed on destruction.
class Fd {
 public:
  explicit Fd(int fd = -1) : fd_(fd) {}
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  int get() const { return fd_; }

 private:
  int fd_;
};

Status SetPermissions(int fd, const std::string& path, int64_t group_id) {
  const mode_t mode = group_id >= 0 ? 0660 : 0600;
  if (group_id >= 0 && fchown(fd, static_cast<uid_t>(-1), static_cast<gid_t>(group_id)) != 0) {
    return Status::InvalidArgument(fmt::format("shared host pool: cannot give {} to group {}: {}",
                                               path, group_id, std::strerror(errno)));
  }
  // fchmod: the mode given to open is masked by the umask.
  if (fchmod(fd, mode) != 0) {
    return Status::IOError(fmt::format("shared host pool: chmod {:o} {} failed: {}", mode, path,
                                       std::strerror(errno)));
  }
  return Status::OK();
}

Result<std::byte*> MapWhole(int fd, int64_t bytes, const std::string& path) {
  void* addr = mmap(nullptr, static_cast<size_t>(bytes), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (addr == MAP_FAILED) {
    return Status::OutOfMemory(fmt::format("shared host pool: mmap of {} bytes of {} failed: {}",
                                           bytes, path, std::strerror(errno)));
  }
  return static_cast<std::byte*>(addr);
}

bool Exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

}  // namespace

// Fills SharedMapping's private fields (a friend).
struct SegmentFiles {
  static SharedMapping Make(std::byte* data, int64_t bytes, std::string path, bool huge,
                            const struct stat& st) {
    SharedMapping m;
    m.data_ = data;
    m.bytes_ = bytes;
    m.path_ = std::move(path);
    m.huge_pages_ = huge;
    m.device_ = static_cast<uint64_t>(st.st_dev);
    m.inode_ = static_cast<uint64_t>(st.st_ino);
    return m;
  }

  // On a hugetlbfs mount: the mapping, or an error after which nothing is left behind.
  static Result<SharedMapping> CreateHuge(const std::string& mount, std::string_view name,
                                          const CreateSegmentOptions& options) {
    const std::string path = HugetlbfsPath(mount, name);
    Fd fd(::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
    if (fd.get() < 0) {
      return Status::IOError(fmt::format("open {}: {}", path, std::strerror(errno)));
    }
    struct stat st {};
    if (fstat(fd.get(), &st) != 0) {
      const int e = errno;
      ::unlink(path.c_str());
      return Status::IOError(fmt::format("fstat {}: {}", path, std::strerror(e)));
    }
    const int64_t huge_bytes = st.st_blksize > 0 ? st.st_blksize : (2 << 20);
    const int64_t bytes = (options.bytes + huge_bytes - 1) / huge_bytes * huge_bytes;
    Status s = SetPermissions(fd.get(), path, options.group_id);
    if (s.ok() && ftruncate(fd.get(), bytes) != 0) {
      s = Status::OutOfMemory(
          fmt::format("ftruncate {} to {} bytes: {}", path, bytes, std::strerror(errno)));
    }
    // A MAP_SHARED hugetlbfs mapping reserves its huge pages at mmap time, so too few free ones
    // fail here rather than fault later.
    Result<std::byte*> data = s.ok() ? MapWhole(fd.get(), bytes, path) : Result<std::byte*>(s);
    if (!data.ok()) {
      ::unlink(path.c_str());
      return data.status();
    }
    return Make(*data, bytes, path, /*huge=*/true, st);
  }
};

SharedMapping::SharedMapping(SharedMapping&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      bytes_(std::exchange(other.bytes_, 0)),
      path_(std::move(other.path_)),
      huge_pages_(other.huge_pages_),
      device_(other.device_),
      inode_(other.inode_) {}

SharedMapping& SharedMapping::operator=(SharedMapping&& other) noexcept {
  if (this != &other) {
    std::swap(data_, other.data_);
    std::swap(bytes_, other.bytes_);
    std::swap(path_, other.path_);
    std::swap(huge_pages_, other.huge_pages_);
    std::swap(device_, other.device_);
    std::swap(inode_, other.inode_);
  }
  return *this;  // `other` unmaps what this held
}

SharedMapping::~SharedMapping() {
  if (data_ != nullptr && munmap(data_, static_cast<size_t>(bytes_)) != 0) {
    util::Log(util::LogLevel::kError, "shared host pool: munmap of {} failed: {}", path_,
              std::strerror(errno));
  }
  data_ = nullptr;
}

Status ValidateSegmentName(std::string_view name) {
  if (name.empty() || name.size() > kMaxNameLength) {
    return Status::InvalidArgument(
        fmt::format("shared host pool name '{}' must be 1 to {} characters", name, kMaxNameLength));
  }
  if (name.front() == '.') {
    return Status::InvalidArgument(
        fmt::format("shared host pool name '{}' must not start with '.'", name));
  }
  for (char c : name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '.' || c == '_' || c == '-';
    if (!ok) {
      return Status::InvalidArgument(fmt::format(
          "shared host pool name '{}' has the character '{}'; use only A-Z a-z 0-9 . _ -", name,
          c));
    }
  }
  return Status::OK();
}

Result<SharedMapping> CreateSegment(std::string_view name, const CreateSegmentOptions& options) {
  KVTIER_RETURN_IF_ERROR(ValidateSegmentName(name));
  if (options.bytes <= 0) {
    return Status::InvalidArgument(
        fmt::format("shared host pool: segment size {} must be positive", options.bytes));
  }
  const std::string mount = HugetlbfsMount();
  const std::string shm_path = ShmPath(name);
  if (Exists(shm_path) || (!mount.empty() && Exists(HugetlbfsPath(mount, name)))) {
    return Status::FailedPrecondition(
        fmt::format("shared host pool '{}' exists already ({}); attach to it, or remove it with "
                    "`kvtier shm destroy {}`",
                    name, Exists(shm_path) ? shm_path : HugetlbfsPath(mount, name), name));
  }

  if (options.huge_pages) {
    if (mount.empty()) {
      util::Log(util::LogLevel::kWarning,
                "shared host pool '{}': huge pages requested but no hugetlbfs is mounted; using "
                "/dev/shm with normal pages (mount one: `mount -t hugetlbfs none /dev/hugepages`, "
                "and reserve pages: `sysctl vm.nr_hugepages=N`)",
                name);
    } else {
      Result<SharedMapping> huge = SegmentFiles::CreateHuge(mount, name, options);
      if (huge.ok()) return huge;
      util::Log(util::LogLevel::kWarning,
                "shared host pool '{}': huge pages requested but {} bytes on {} failed: {}; "
                "using /dev/shm with normal pages (reserve pages: `sysctl vm.nr_hugepages=N`)",
                name, options.bytes, mount, huge.status().message());
    }
  }

  const std::string object = ShmObjectName(name);
  Fd fd(shm_open(object.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
  if (fd.get() < 0) {
    if (errno == EEXIST) {
      return Status::FailedPrecondition(
          fmt::format("shared host pool '{}' exists already ({}); attach to it, or remove it with "
                      "`kvtier shm destroy {}`",
                      name, shm_path, name));
    }
    return Status::IOError(
        fmt::format("shared host pool: shm_open {} failed: {}", object, std::strerror(errno)));
  }
  Status s = SetPermissions(fd.get(), shm_path, options.group_id);
  if (s.ok()) {
    const int err = posix_fallocate(fd.get(), 0, static_cast<off_t>(options.bytes));
    if (err == EOPNOTSUPP || err == EINVAL) {
      if (ftruncate(fd.get(), static_cast<off_t>(options.bytes)) != 0) {
        s = Status::OutOfMemory(fmt::format("shared host pool: ftruncate {} to {} bytes: {}",
                                            shm_path, options.bytes, std::strerror(errno)));
      }
    } else if (err != 0) {
      s = Status::OutOfMemory(fmt::format(
          "shared host pool: reserving {} bytes in {} failed: {} (is /dev/shm large enough? "
          "`df -h /dev/shm`)",
          options.bytes, shm_path, std::strerror(err)));
    }
  }
  struct stat st {};
  if (s.ok() && fstat(fd.get(), &st) != 0) {
    s = Status::IOError(
        fmt::format("shared host pool: fstat {} failed: {}", shm_path, std::strerror(errno)));
  }
  Result<std::byte*> data =
      s.ok() ? MapWhole(fd.get(), options.bytes, shm_path) : Result<std::byte*>(s);
  if (!data.ok()) {
    shm_unlink(object.c_str());
    return data.status();
  }
  // Transparent huge pages for tmpfs where the system allows them (shmem_enabled=advise).
  (void)madvise(*data, static_cast<size_t>(options.bytes), MADV_HUGEPAGE);
  return SegmentFiles::Make(*data, options.bytes, shm_path, /*huge=*/false, st);
}

Result<SharedMapping> OpenSegment(std::string_view name) {
  KVTIER_RETURN_IF_ERROR(ValidateSegmentName(name));
  std::string path = ShmPath(name);
  int raw = shm_open(ShmObjectName(name).c_str(), O_RDWR | O_CLOEXEC, 0);
  bool huge = false;
  if (raw < 0 && errno == ENOENT) {
    const std::string mount = HugetlbfsMount();
    if (!mount.empty()) {
      path = HugetlbfsPath(mount, name);
      raw = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
      huge = true;
    }
  }
  if (raw < 0) {
    if (errno == ENOENT) {
      return Status::NotFound(fmt::format(
          "shared host pool '{}' does not exist (no {}); create it first (`kvtier shm create`)",
          name, ShmPath(name)));
    }
    return Status::IOError(
        fmt::format("shared host pool: opening {} failed: {}", path, std::strerror(errno)));
  }
  Fd fd(raw);
  struct stat st {};
  if (fstat(fd.get(), &st) != 0) {
    return Status::IOError(
        fmt::format("shared host pool: fstat {} failed: {}", path, std::strerror(errno)));
  }
  if (st.st_size <= 0) {
    return Status::Unavailable(fmt::format(
        "shared host pool '{}' ({}) is empty: its creator has not sized it yet, or died", name,
        path));
  }
  KVTIER_ASSIGN_OR_RETURN(std::byte * data, MapWhole(fd.get(), st.st_size, path));
  return SegmentFiles::Make(data, st.st_size, path, huge, st);
}

Status UnlinkSegment(std::string_view name) {
  KVTIER_RETURN_IF_ERROR(ValidateSegmentName(name));
  bool removed = false;
  if (shm_unlink(ShmObjectName(name).c_str()) == 0) {
    removed = true;
  } else if (errno != ENOENT) {
    return Status::IOError(fmt::format("shared host pool: shm_unlink {} failed: {}",
                                       ShmObjectName(name), std::strerror(errno)));
  }
  const std::string mount = HugetlbfsMount();
  if (!mount.empty()) {
    const std::string path = HugetlbfsPath(mount, name);
    if (::unlink(path.c_str()) == 0) {
      removed = true;
    } else if (errno != ENOENT) {
      return Status::IOError(
          fmt::format("shared host pool: unlink {} failed: {}", path, std::strerror(errno)));
    }
  }
  if (!removed) {
    return Status::NotFound(
        fmt::format("shared host pool '{}' does not exist (no {})", name, ShmPath(name)));
  }
  return Status::OK();
}

Status UnlinkSegmentIfSame(const SharedMapping& mapping) {
  if (mapping.path_.empty()) return Status::NotFound("shared memory: no segment mapped");
  struct stat st {};
  if (::stat(mapping.path_.c_str(), &st) != 0 ||
      static_cast<uint64_t>(st.st_dev) != mapping.device_ ||
      static_cast<uint64_t>(st.st_ino) != mapping.inode_) {
    return Status::NotFound(
        fmt::format("shared memory: {} no longer names this segment", mapping.path_));
  }
  if (::unlink(mapping.path_.c_str()) != 0) {
    if (errno == ENOENT) {
      return Status::NotFound(fmt::format("shared memory: {} is gone", mapping.path_));
    }
    return Status::IOError(
        fmt::format("shared memory: unlink {} failed: {}", mapping.path_, std::strerror(errno)));
  }
  return Status::OK();
}

}  // namespace kvtier::shm
