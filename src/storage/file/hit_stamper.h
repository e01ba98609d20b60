// Internal: the file store's hit stamps written behind the reads (file_backend.cc).
//
// The stamps of hits waiting to be written to their page files' mtimes (file_index.h "Stamps"),
// and the one thread that writes them, so that no read waits for an inode write (on ext4 a
// journal handle, which blocks behind heavy writers: issue 23). A key has at most one pending
// stamp, its latest. Bounded: a stamp added to a full map drops the oldest pending one (that page
// keeps its older stamp on disk: counted as dropped). The thread takes everything pending every
// `period`, or at once when `wake_at` are pending, and writes it oldest first through `write`
// (which says whether it wrote it); Stop writes what is left within its budget, then gives up.
//
// Thread safety: Add and counts from any thread; Start, then Stop (idempotent) from one.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <utility>

#include "kvtier/page_key.h"

namespace kvtier::storage {

class HitStamper {
 public:
  using Clock = std::chrono::steady_clock;
  enum class Outcome { kWritten, kSkipped };  // skipped: the file is gone, newer, or refused it
  using Write = std::function<Outcome(const PageKey& key, int64_t stamp)>;

  struct Counts {
    int64_t written = 0, skipped = 0, dropped = 0, left = 0, pending = 0;
  };

  HitStamper(size_t limit, size_t wake_at, Clock::duration period, Write write)
      : limit_(std::max<size_t>(limit, 1)),
        wake_at_(std::max<size_t>(wake_at, 1)),
        period_(period),
        write_(std::move(write)) {}
  ~HitStamper() { Stop(Clock::duration::zero()); }
  HitStamper(const HitStamper&) = delete;
  HitStamper& operator=(const HitStamper&) = delete;

  void Start();
  // `stamp` for `key` (greater than any stamp added for it before: NextStamp's are increasing).
  void Add(const PageKey& key, int64_t stamp);
  // Stops the thread after it has written what is pending, giving up on what it has not written
  // within `budget` (counted as left). Idempotent.
  void Stop(Clock::duration budget);
  Counts counts() const;

 private:
  void Loop();
  // Takes what is pending and writes it, oldest first, until the stop deadline (if any).
  void WriteAll();

  const size_t limit_, wake_at_;
  const Clock::duration period_;
  const Write write_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::unordered_map<PageKey, int64_t, PageKeyHash> stamp_of_;  // key -> its pending stamp
  std::map<int64_t, PageKey> by_stamp_;                         // the same, oldest first
  bool stopping_ = false;
  int64_t written_ = 0, skipped_ = 0, dropped_ = 0, left_ = 0;
  // Steady-clock ticks after which nothing more is written (max until Stop).
  std::atomic<Clock::rep> stop_deadline_{std::numeric_limits<Clock::rep>::max()};
  std::thread thread_;
};

}  // namespace kvtier::storage
