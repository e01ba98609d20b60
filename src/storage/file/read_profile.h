// Internal: where the file store's page reads on the thread path spend their time
// (file_backend.cc's 1-in-ReadProfile::kSampleEvery Get profile, logged at close).
//
// Thread safety: ThreadTimes is per thread; ReadProfile's totals are relaxed atomics, read after
// the I/O threads have stopped.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>

namespace kvtier::storage {

// This thread's clock, its CPU time (CLOCK_THREAD_CPUTIME_ID: exact, where getrusage's is
// updated only at ticks) and its voluntary / involuntary context switches (getrusage).
struct ThreadTimes {
  using Clock = std::chrono::steady_clock;
  Clock::time_point wall;
  int64_t cpu_ns = 0, sleeps = 0, preemptions = 0;

  // At the start of what is measured (`start`: the clock read last) or its end (first), so the
  // system calls here are not in the measured wall time.
  static ThreadTimes Now(bool start);
};

// Where the thread path's page reads spent their time, summed over pages and threads (relaxed
// atomics: totals, read after the I/O threads have stopped).
class ReadProfile {
 public:
  using Clock = std::chrono::steady_clock;
  // One page in this many of each I/O thread is profiled: the two clock readings and getrusage
  // at each end cost about 1.6 us, 0.5 % of a hot 2 MiB read, 0.06 % sampled.
  static constexpr uint32_t kSampleEvery = 8;

  struct Totals {
    int64_t pages = 0, hits = 0, wall_ns = 0, open_ns = 0, read_ns = 0, stamp_ns = 0, cpu_ns = 0,
            sleeps = 0, preemptions = 0;
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
  }

  Totals Get() const {
    return {pages_.load(kRelaxed),   hits_.load(kRelaxed),    wall_ns_.load(kRelaxed),
            open_ns_.load(kRelaxed), read_ns_.load(kRelaxed), stamp_ns_.load(kRelaxed),
            cpu_ns_.load(kRelaxed),  sleeps_.load(kRelaxed),  preemptions_.load(kRelaxed)};
  }

 private:
  static constexpr std::memory_order kRelaxed = std::memory_order_relaxed;
  std::atomic<int64_t> pages_{0}, hits_{0}, wall_ns_{0}, open_ns_{0}, read_ns_{0}, stamp_ns_{0},
      cpu_ns_{0}, sleeps_{0}, preemptions_{0};
};

}  // namespace kvtier::storage
