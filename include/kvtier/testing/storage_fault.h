// kvtier/testing/storage_fault.h — a storage backend that injects faults into a real one, for tests
// of the layers above (cache, replay): delays, failed pages, corrupted reads, dropped writes, and a
// "down" switch under which every call fails as against a stopped server.
//
// The wrapper is itself a StorageBackend (own bounded queue and I/O threads); its hooks decide
// the faults of a batch, pass what is left to the wrapped backend and wait for it. What the
// layers above see is what a real fault produces, never bytes that did not check out:
//   delay            every call waits this long first; past the call's deadline its pages are
//                    kTimedOut (Exists: Unavailable) and the wrapped backend is not called
//   error_fraction   each page (each Exists call) fails with kFailed (Exists: Unavailable) with
//                    this probability, without reaching the wrapped backend; 1 = every call
//   corrupt_fraction Get: each page read with kOk gets one byte flipped in the caller's buffer
//                    and becomes kCorrupt (what a checksum catches after a bad read)
//   drop_fraction    Set: each page reports kOk but is not written (a lost write); a later Get
//                    misses
//   down             every call fails at once: Get/Set/Remove pages kFailed, Exists Unavailable
//   writes held      a slow store's writes: each Set and Remove waits (holding its I/O thread)
//                    until the writes are released or its deadline passes (then its pages are
//                    kTimedOut and the wrapped backend is not called); reads are not held
//   reads held       chosen pages arrive late: a Get naming one of the held keys waits the same
//                    way until those reads are released, while other Gets go on (give the
//                    wrapper enough I/O threads), so a caller's batches complete out of order
// Random choices come from one generator seeded by `seed`, drawn page by page in the order the
// wrapper runs its calls: with io_threads = 1 the same seed and call sequence give the same faults.
//
// Thread safety: every method may be called from any thread; a changed setting applies to calls
// that start after it.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <random>
#include <span>
#include <vector>

#include "kvtier/storage.h"

namespace kvtier {

// The settings of a FaultInjectingStorage at one moment.
struct StorageFaults {
  std::chrono::milliseconds delay{0};
  double error_fraction = 0;
  double corrupt_fraction = 0;
  double drop_fraction = 0;
  bool down = false;
};

// How many faults were injected so far.
struct InjectedFaults {
  int64_t delayed_calls = 0;
  int64_t timed_out_calls = 0;  // calls whose delay passed their deadline
  int64_t failed_pages = 0;     // by error_fraction
  int64_t failed_exists = 0;    // Exists calls failed by error_fraction
  int64_t corrupted_pages = 0;
  int64_t dropped_pages = 0;
  int64_t down_calls = 0;
};

class FaultInjectingStorage final : public StorageBackend {
 public:
  // Wraps `inner` (owned; closed and destroyed with the wrapper). The wrapper takes `inner`'s
  // URL with a "faulty+" prefix, its namespace, and `options` for its own queue (the deadline of
  // a call includes the wrapped backend's time). InvalidArgument for a null `inner` or bad
  // options.
  static Result<std::unique_ptr<FaultInjectingStorage>> Wrap(std::unique_ptr<StorageBackend> inner,
                                                             uint64_t seed,
                                                             const StorageOptions& options = {});
  ~FaultInjectingStorage() override;

  // Each setter takes effect for calls that start after it. Fractions must be in [0, 1] and the
  // delay non-negative, else InvalidArgument naming the setting (and nothing changes).
  Status SetDelay(std::chrono::milliseconds delay);
  Status SetErrorFraction(double fraction);
  Status SetCorruptFraction(double fraction);
  Status SetDropFraction(double fraction);
  void SetDown(bool down);
  // Holds every Set and Remove that starts (or waits) while `hold` is true; false releases them.
  void HoldWrites(bool hold);
  // Gauge: Set and Remove calls waiting in HoldWrites now.
  int held_writes() const;
  // Holds every Get that names one of `keys` and starts (or waits) while they are held; an
  // empty list releases them. The other settings apply to a held Get once it is released.
  void HoldReads(std::vector<PageKey> keys);
  // Gauge: Get calls waiting in HoldReads now.
  int held_reads() const;
  // Back to no faults.
  void ClearFaults();
  // Runs `check` on the caller's thread at the start of every call (StorageBackend::CheckCaller);
  // a non-OK status rejects the call. For tests of the layers above (e.g. "never called under
  // the cache's mutex"). Null: no check.
  void SetCallerCheck(std::function<Status(std::string_view call)> check);

  StorageFaults faults() const;
  InjectedFaults injected() const;
  StorageBackend& inner() { return *inner_; }

  // The wrapped store's own evictions (StorageBackend::TrackEvictions).
  void TrackEvictions(bool on) override { inner_->TrackEvictions(on); }
  std::vector<PageKey> TakeEvictions(int64_t* dropped = nullptr) override {
    return inner_->TakeEvictions(dropped);
  }

 protected:
  ExistsResult DoExists(std::span<const PageKey> keys,
                        std::chrono::steady_clock::time_point deadline) override;
  void DoGet(std::span<const PageKey> keys, std::span<const PageBuffer> buffers,
             std::span<PageStatus> out, std::chrono::steady_clock::time_point deadline) override;
  void DoSet(std::span<const PageKey> keys, std::span<const PageBuffer> buffers,
             std::span<PageStatus> out, std::chrono::steady_clock::time_point deadline) override;
  // The parents go to the wrapped backend with the pages forwarded.
  void DoSetChained(std::span<const PageKey> keys, std::span<const PageBuffer> buffers,
                    std::span<const std::optional<PageKey>> parents, std::span<PageStatus> out,
                    std::chrono::steady_clock::time_point deadline) override;
  void DoRemove(std::span<const PageKey> keys, std::span<PageStatus> out,
                std::chrono::steady_clock::time_point deadline) override;
  // The wrapped backend's gauges (stored pages and bytes, capacity, evictions) and where its
  // hits were read from (page cache or disk).
  void FillStats(StorageStats& stats) const override;
  Status CheckCaller(std::string_view call) const override;

 private:
  FaultInjectingStorage(std::unique_ptr<StorageBackend> inner, uint64_t seed,
                        const StorageOptions& options);
  // Waits out the delay; false (and counts it) when the deadline comes first.
  bool Delay(std::chrono::steady_clock::time_point deadline);
  // True with probability `fraction`, from the seeded generator.
  bool Draw(double fraction);
  // A "down" store fails every page; a delay past the deadline, or (a `write`: Set, Remove) held
  // writes not released by then, times every page out: then `out` is filled and true is
  // returned, and the call is not forwarded to the inner backend.
  bool AnsweredWithoutForwarding(std::span<PageStatus> out,
                                 std::chrono::steady_clock::time_point deadline, bool write);
  // A position in [0, n) from the seeded generator.
  uint64_t DrawIndex(uint64_t n);
  // Waits while writes are held; false when the deadline came first.
  bool WaitForWrites(std::chrono::steady_clock::time_point deadline);
  // Waits while one of `keys` is held; false when the deadline came first.
  bool WaitForReads(std::span<const PageKey> keys, std::chrono::steady_clock::time_point deadline);

  std::unique_ptr<StorageBackend> inner_;
  std::atomic<int64_t> delay_ms_{0};
  std::atomic<double> error_fraction_{0};
  std::atomic<double> corrupt_fraction_{0};
  std::atomic<double> drop_fraction_{0};
  std::atomic<bool> down_{false};

  mutable std::mutex mu_;
  std::condition_variable writes_cv_;    // with mu_: held writes and held reads
  bool hold_writes_ = false;             // guarded by mu_
  int held_writes_ = 0;                  // guarded by mu_
  std::vector<PageKey> held_read_keys_;  // guarded by mu_
  int held_reads_ = 0;                   // guarded by mu_
  std::mt19937_64 rng_;                  // guarded by mu_
  InjectedFaults counts_;                // guarded by mu_
  std::shared_ptr<const std::function<Status(std::string_view)>> caller_check_;  // guarded by mu_
};

}  // namespace kvtier
