// Internal: where the file store's page reads on the thread path spend their time
// (file_backend.cc's 1-in-ReadProfile::kSampleEvery Get profile, logged at close).
//
// Thread safety: ThreadTimes is per thread; ReadProfile's totals are relaxed atomics, read after
// the I/O threads have stopped.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>

#include "kvtier/storage.h"

namespace kvtier::storage {

// This thread's clock, its CPU time (CLOCK_THREAD_CPUTIME_ID: exact, where getrusage's is
// updated only at ticks), its voluntary / involuntary context switches (getrusage) and its time
// waiting for a core so far (runnable, another thread on every core it may use: the scheduler's
// run delay, the second field of /proc/thread-self/schedstat, read through a file this thread
// keeps open; -1 where the kernel does not say).
struct ThreadTimes {
  using Clock = std::chrono::steady_clock;
  Clock::time_point wall;
  int64_t cpu_ns = 0, sleeps = 0, preemptions = 0, run_delay_ns = -1;

  // At the start of what is measured (`start`: the clock read first) or its end (last), so the
  // counters are read inside the measured wall time: a wait for a core that comes at one of
  // these system calls' return (frequent on a loaded machine) is in the wall time too, and CPU
  // time and run delay never exceed it (read outside it, a page of 0.1 ms showed 40x its time
  // waiting for a core on the loaded build box). Costs the page about 3 us of its time.
  static ThreadTimes Now(bool start);
};

// Where the thread path's page reads spent their time, summed over pages and threads (relaxed
// atomics: totals, read after the I/O threads have stopped).
class ReadProfile {
 public:
  using Clock = std::chrono::steady_clock;
  // One page in this many of each I/O thread is profiled: the clock readings, getrusage and the
  // schedstat pread at both ends cost 9 us of CPU a page on the build box's VM (5 without the
  // pread; measured in a loop): if the H100 is as slow, 4 % of a hot 512 KiB read (0.21 ms),
  // 0.5 % sampled.
  static constexpr uint32_t kSampleEvery = 8;

  struct Totals {
    int64_t pages = 0, hits = 0, wall_ns = 0, open_ns = 0, read_ns = 0, stamp_ns = 0, cpu_ns = 0,
            sleeps = 0, preemptions = 0;
    // Of the pages, those whose run delay the kernel gave, and their time waiting for a core.
    int64_t run_delay_pages = 0, run_delay_ns = 0;
  };

  // One page: started at `start`, opened at `opened`, read and checked at `checked`, done (a
  // hit: marked in the index, its stamp left pending for the stamper) at `end`.
  void Add(const ThreadTimes& start, Clock::time_point opened, Clock::time_point checked,
           const ThreadTimes& end, bool hit) {
    auto ns = [](Clock::duration d) {
      return std::chrono::duration_cast<std::chrono::nanoseconds>(d).count();
    };
    pages_.fetch_add(1, kRelaxed);
    if (hit) hits_.fetch_add(1, kRelaxed);
    wall_ns_.fetch_add(ns(end.wall - start.wall), kRelaxed);
    open_ns_.fetch_add(ns(opened - start.wall), kRelaxed);
    read_ns_.fetch_add(ns(checked - opened), kRelaxed);
    stamp_ns_.fetch_add(ns(end.wall - checked), kRelaxed);
    cpu_ns_.fetch_add(end.cpu_ns - start.cpu_ns, kRelaxed);
    sleeps_.fetch_add(end.sleeps - start.sleeps, kRelaxed);
    preemptions_.fetch_add(end.preemptions - start.preemptions, kRelaxed);
    if (start.run_delay_ns >= 0 && end.run_delay_ns >= 0) {
      run_delay_pages_.fetch_add(1, kRelaxed);
      run_delay_ns_.fetch_add(end.run_delay_ns - start.run_delay_ns, kRelaxed);
    }
  }

  Totals Get() const {
    return {
        pages_.load(kRelaxed),           hits_.load(kRelaxed),        wall_ns_.load(kRelaxed),
        open_ns_.load(kRelaxed),         read_ns_.load(kRelaxed),     stamp_ns_.load(kRelaxed),
        cpu_ns_.load(kRelaxed),          sleeps_.load(kRelaxed),      preemptions_.load(kRelaxed),
        run_delay_pages_.load(kRelaxed), run_delay_ns_.load(kRelaxed)};
  }

  // Into StorageStats' get_profiled_* (a snapshot whose fields may be a page apart).
  void Fill(StorageStats& stats) const;

 private:
  static constexpr std::memory_order kRelaxed = std::memory_order_relaxed;
  std::atomic<int64_t> pages_{0}, hits_{0}, wall_ns_{0}, open_ns_{0}, read_ns_{0}, stamp_ns_{0},
      cpu_ns_{0}, sleeps_{0}, preemptions_{0}, run_delay_pages_{0}, run_delay_ns_{0};
};

}  // namespace kvtier::storage
