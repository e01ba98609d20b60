// util::Mutex, util::MutexLock and util::CondVar: std::mutex and std::condition_variable as
// capabilities Clang's thread-safety analysis checks (util/thread_annotations.h). libstdc++'s
// std::mutex carries no annotations, so `KVTIER_GUARDED_BY(mu_)` on a std::mutex member is never
// checked; with a util::Mutex it is, in the `-Wthread-safety -Werror` build (scripts/setup.sh
// step 0). The same shape as Abseil's absl::Mutex / LevelDB's port::Mutex, over the standard types
// (no cost beyond theirs: every method is an inline call of the std one).
//
//   util::Mutex mu_;
//   int64_t n_ KVTIER_GUARDED_BY(mu_);
//   void Add() KVTIER_EXCLUDES(mu_) { util::MutexLock lock(mu_); ++n_; }
//   // waiting: a loop at the call site (a predicate lambda is analysed without the lock held)
//   { util::MutexLock lock(mu_); while (n_ == 0) cv_.Wait(mu_); }
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>

#include "util/thread_annotations.h"

namespace kvtier::util {

class KVTIER_CAPABILITY("mutex") Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void Lock() KVTIER_ACQUIRE() { mu_.lock(); }
  void Unlock() KVTIER_RELEASE() { mu_.unlock(); }
  // Takes the mutex when it is free; whether it did (never waits).
  bool TryLock() KVTIER_TRY_ACQUIRE(true) { return mu_.try_lock(); }
  // Tells the analysis the caller holds it (a contract it cannot follow, e.g. through a callback);
  // checks nothing at run time.
  void AssertHeld() const KVTIER_ASSERT_CAPABILITY(this) {}

 private:
  friend class CondVar;
  std::mutex mu_;
};

// Tag of MutexLock's constructor that takes over a mutex the caller already holds (TryLock).
struct AdoptLock {};
inline constexpr AdoptLock kAdoptLock{};

// Holds a Mutex from construction to destruction.
class KVTIER_SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex& mu) KVTIER_ACQUIRE(mu) : mu_(mu) { mu_.Lock(); }
  // `mu` already held by the caller (e.g. after a successful TryLock): released at destruction.
  MutexLock(Mutex& mu, AdoptLock) KVTIER_REQUIRES(mu) : mu_(mu) {}
  ~MutexLock() KVTIER_RELEASE() { mu_.Unlock(); }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

 private:
  Mutex& mu_;
};

// A condition variable waited on with a util::Mutex held (std::condition_variable underneath:
// the wait releases the mutex and takes it again before returning, as std's does). Spurious
// wake-ups happen: wait in a loop on the condition.
class CondVar {
 public:
  CondVar() = default;
  CondVar(const CondVar&) = delete;
  CondVar& operator=(const CondVar&) = delete;

  void Wait(Mutex& mu) KVTIER_REQUIRES(mu) {
    std::unique_lock<std::mutex> lock(mu.mu_, std::adopt_lock);
    cv_.wait(lock);
    lock.release();  // still held: the caller's
  }
  // Waits until notified or `deadline`; std::cv_status::timeout when the deadline passed.
  template <class Clock, class Duration>
  std::cv_status WaitUntil(Mutex& mu, const std::chrono::time_point<Clock, Duration>& deadline)
      KVTIER_REQUIRES(mu) {
    std::unique_lock<std::mutex> lock(mu.mu_, std::adopt_lock);
    const std::cv_status status = cv_.wait_until(lock, deadline);
    lock.release();
    return status;
  }
  template <class Rep, class Period>
  std::cv_status WaitFor(Mutex& mu, const std::chrono::duration<Rep, Period>& timeout)
      KVTIER_REQUIRES(mu) {
    return WaitUntil(mu, std::chrono::steady_clock::now() + timeout);
  }
  void NotifyOne() { cv_.notify_one(); }
  void NotifyAll() { cv_.notify_all(); }

 private:
  std::condition_variable cv_;
};

}  // namespace kvtier::util
