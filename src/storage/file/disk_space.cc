// The file store's free-space floor and the process's claims on each file system (disk_space.h).
//
// Thread safety: DiskFloor's readings under `read_mu_` (the estimate's parts are atomics read
// without it), its watcher under `watch_mu_`; the claims under one process-wide mutex.
#include "storage/file/disk_space.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <sys/statvfs.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <utility>

namespace kvtier::storage {
namespace {

int64_t Capped(unsigned long count, unsigned long unit) {
  return static_cast<int64_t>(std::min<unsigned __int128>(
      static_cast<unsigned __int128>(count) * unit, static_cast<unsigned __int128>(1) << 60));
}

}  // namespace

Result<DiskReading> ReadDisk(int fd) {
  struct statvfs vfs;
  struct stat st;
  if (::fstatvfs(fd, &vfs) != 0 || ::fstat(fd, &st) != 0) {
    return Status::IOError(fmt::format("cannot read the free space: {}", std::strerror(errno)));
  }
  return DiskReading{Capped(vfs.f_blocks, vfs.f_frsize), Capped(vfs.f_bavail, vfs.f_frsize),
                     st.st_dev};
}

int64_t AllocatedBytes(int64_t bytes) { return (std::max<int64_t>(bytes, 0) + 4095) / 4096 * 4096; }

std::string FormatBytes(int64_t bytes) {
  static constexpr const char* kUnits[] = {"KiB", "MiB", "GiB", "TiB", "PiB"};
  if (bytes < 1024) return fmt::format("{} B", bytes);
  double value = static_cast<double>(bytes) / 1024;
  size_t unit = 0;
  while (value >= 1024 && unit + 1 < std::size(kUnits)) {
    value /= 1024;
    ++unit;
  }
  return fmt::format("{:.1f} {}", value, kUnits[unit]);
}

// ---- DiskFloor ---------------------------------------------------------------------------------

Result<std::unique_ptr<DiskFloor>> DiskFloor::Open(int dir, int64_t floor,
                                                   Clock::duration poll_every,
                                                   Clock::duration watch_every) {
  Fd fd(::fcntl(dir, F_DUPFD_CLOEXEC, 0));
  if (!fd.ok()) {
    return Status::IOError(
        fmt::format("cannot watch the free space: dup failed: {}", std::strerror(errno)));
  }
  KVTIER_RETURN_IF_ERROR(ReadDisk(fd.get()).status());
  std::unique_ptr<DiskFloor> f(
      new DiskFloor(std::move(fd), std::max<int64_t>(floor, 1), poll_every, watch_every));
  f->Read(/*wait=*/true);
  return f;
}

DiskFloor::DiskFloor(Fd dir, int64_t floor, Clock::duration poll_every, Clock::duration watch_every)
    : dir_(std::move(dir)), floor_(floor), poll_every_(poll_every), watch_every_(watch_every) {}

DiskFloor::~DiskFloor() { Stop(); }

int64_t DiskFloor::Read(bool wait) {
  std::unique_lock<std::mutex> lock(read_mu_, std::defer_lock);
  if (wait) {
    lock.lock();
  } else if (!lock.try_lock()) {
    return free_.load(std::memory_order_relaxed);  // another thread is reading it now
  }
  Result<DiskReading> r = ReadDisk(dir_.get());
  if (r.ok()) {
    // What this store wrote before the reading is in it: the estimate starts afresh. (A write
    // racing the reading may be counted twice: the estimate errs towards less free space.)
    written_.store(0, std::memory_order_relaxed);
    free_.store(r->free, std::memory_order_relaxed);
  }
  read_at_.store(Clock::now().time_since_epoch().count(), std::memory_order_relaxed);
  return free_.load(std::memory_order_relaxed);
}

int64_t DiskFloor::Headroom(bool fresh) {
  const Clock::rep now = Clock::now().time_since_epoch().count();
  if (fresh || now - read_at_.load(std::memory_order_relaxed) >= poll_every_.count()) {
    Read(/*wait=*/fresh);
  }
  return free_.load(std::memory_order_relaxed) - written_.load(std::memory_order_relaxed) - floor_;
}

void DiskFloor::Watch(OnLow on_low) {
  std::lock_guard<std::mutex> lock(watch_mu_);
  if (watcher_.joinable() || stopping_) return;
  watcher_ = std::thread([this, on_low = std::move(on_low)] {
    std::unique_lock<std::mutex> lock(watch_mu_);
    while (!stopping_) {
      watch_cv_.wait_for(lock, watch_every_, [&] { return stopping_; });
      if (stopping_) break;
      lock.unlock();
      const int64_t headroom = Headroom(/*fresh=*/true);
      if (headroom < 0) on_low(-headroom);
      lock.lock();
    }
  });
}

void DiskFloor::Stop() {
  {
    std::lock_guard<std::mutex> lock(watch_mu_);
    stopping_ = true;
  }
  watch_cv_.notify_all();
  if (watcher_.joinable()) watcher_.join();
}

// ---- DiskClaims --------------------------------------------------------------------------------

namespace {

struct ClaimEntry {
  dev_t device;
  DiskClaims::Unfilled unfilled;
};

struct ClaimRegistry {
  std::mutex mu;
  uint64_t next_id = 1;
  std::map<uint64_t, ClaimEntry> claims;
};

ClaimRegistry& Registry() {
  static ClaimRegistry* registry = new ClaimRegistry();  // never destroyed: stores may outlive main
  return *registry;
}

}  // namespace

DiskClaims::Claim::~Claim() {
  if (id_ == 0) return;
  ClaimRegistry& r = Registry();
  std::lock_guard<std::mutex> lock(r.mu);
  r.claims.erase(id_);
}

DiskClaims::Claim& DiskClaims::Claim::operator=(Claim&& other) noexcept {
  if (this != &other) {
    Claim dropped(std::exchange(id_, std::exchange(other.id_, 0)));
  }
  return *this;
}

DiskClaims::Claim DiskClaims::Add(dev_t device, Unfilled unfilled) {
  ClaimRegistry& r = Registry();
  std::lock_guard<std::mutex> lock(r.mu);
  const uint64_t id = r.next_id++;
  r.claims.emplace(id, ClaimEntry{device, std::move(unfilled)});
  return Claim(id);
}

int64_t DiskClaims::UnfilledOn(dev_t device) {
  ClaimRegistry& r = Registry();
  std::lock_guard<std::mutex> lock(r.mu);
  int64_t sum = 0;
  for (const auto& [id, c] : r.claims) {
    if (c.device == device) sum += std::max<int64_t>(c.unfilled(), 0);
  }
  return sum;
}

}  // namespace kvtier::storage
