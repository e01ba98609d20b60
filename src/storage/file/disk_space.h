// Internal: the file store's view of its file system's free space — the free-space floor each
// store keeps (DiskFloor, StorageOptions::min_free_bytes) and the room the file stores open in
// this process have claimed on each file system (DiskClaims), which a store opened without a
// capacity leaves to them.
//
// The floor (like nginx proxy_cache's min_free): the free space is read with fstatvfs (f_bavail:
// what this user may still write) at most once per `poll_every` on the write path, and in between
// estimated as the last reading less the bytes this store wrote since, plus those it freed; a
// watcher thread reads it every `watch_every` whatever the store does, so a store that writes
// nothing still sees another writer (another store, another process, anything) fill the disk.
// When the free space is under the floor, `on_low` is told by how much (the file store evicts its
// oldest pages that far, file_backend.cc); the store admits no page while it stays under.
//
// Thread safety: every method may be called from any thread; `on_low` runs on the watcher's
// thread (or on a writer's, through the file store's own calls), never under this class's mutex.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>

#include "kvtier/status.h"
#include "storage/file/file_io.h"

namespace kvtier::storage {

// One reading of a file system: its size and the bytes this user may still write (statvfs
// f_blocks and f_bavail, times f_frsize, each capped at 2^60), and its device.
struct DiskReading {
  int64_t total = 0;
  int64_t free = 0;
  dev_t device = 0;
};
// IOError naming errno when fstatvfs or fstat of `fd` fails.
Result<DiskReading> ReadDisk(int fd);

// The bytes a file of `bytes` takes on a file system: rounded up to 4 KiB blocks (what ext4, xfs
// and tmpfs allocate for a dense file).
int64_t AllocatedBytes(int64_t bytes);

// "512 B", "32.0 MiB", "3.2 GiB": the largest binary unit the value reaches (for the log).
std::string FormatBytes(int64_t bytes);

class DiskFloor {
 public:
  using Clock = std::chrono::steady_clock;
  using OnLow = std::function<void(int64_t deficit)>;

  // Watches the file system of `dir` (an open directory, duplicated and kept) with `floor` bytes
  // (> 0). IOError when it cannot be read.
  static Result<std::unique_ptr<DiskFloor>> Open(int dir, int64_t floor, Clock::duration poll_every,
                                                 Clock::duration watch_every);
  ~DiskFloor();
  DiskFloor(const DiskFloor&) = delete;
  DiskFloor& operator=(const DiskFloor&) = delete;

  int64_t floor() const { return floor_; }
  // The free space less the floor (negative: under the floor by that much): from a reading when
  // the last is `poll_every` old (one thread takes it, the others use the estimate meanwhile) or
  // `fresh` (waits for it), the estimate otherwise.
  int64_t Headroom(bool fresh = false);
  // The store wrote / freed `bytes` (allocated) since: the estimate moves by them.
  void NoteWritten(int64_t bytes) { written_.fetch_add(bytes, std::memory_order_relaxed); }
  void NoteFreed(int64_t bytes) { written_.fetch_sub(bytes, std::memory_order_relaxed); }
  // Starts the watcher thread: every `watch_every` a reading; under the floor, `on_low(deficit)`.
  void Watch(OnLow on_low);
  // Stops and joins the watcher (idempotent).
  void Stop();

 private:
  DiskFloor(Fd dir, int64_t floor, Clock::duration poll_every, Clock::duration watch_every);
  // A reading now (the last one kept when it fails); its free bytes. Without `wait`, none when
  // another thread is taking one (its result will do).
  int64_t Read(bool wait);

  const Fd dir_;
  const int64_t floor_;
  const Clock::duration poll_every_, watch_every_;
  std::mutex read_mu_;                  // one reading at a time
  std::atomic<int64_t> free_{0};        // at the last reading
  std::atomic<int64_t> written_{0};     // by the store since the last reading (less freed)
  std::atomic<Clock::rep> read_at_{0};  // when the last reading was taken
  std::mutex watch_mu_;
  std::condition_variable watch_cv_;
  bool stopping_ = false;  // guarded by watch_mu_
  std::thread watcher_;
};

// The room the file stores open in this process have claimed on each file system and not filled
// yet (their capacity less their bytes), so that a store opened without a capacity takes half of
// what is left after them (the floor too), not half of a free space they are about to fill.
class DiskClaims {
 public:
  using Unfilled = std::function<int64_t()>;
  // A store's claim, withdrawn when destroyed.
  class Claim {
   public:
    Claim() = default;
    ~Claim();
    Claim(Claim&& other) noexcept : id_(std::exchange(other.id_, 0)) {}
    Claim& operator=(Claim&& other) noexcept;

   private:
    friend class DiskClaims;
    explicit Claim(uint64_t id) : id_(id) {}
    uint64_t id_ = 0;
  };
  // Registers a store on `device`; `unfilled` (called under the registry's mutex: it must not
  // open a store) says how much of its capacity it has not filled.
  static Claim Add(dev_t device, Unfilled unfilled);
  // The sum of the unfilled room of every store registered on `device`.
  static int64_t UnfilledOn(dev_t device);
};

}  // namespace kvtier::storage
