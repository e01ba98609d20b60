// util::Mutex / MutexLock / CondVar: the lock excludes, TryLock fails while another thread holds
// it, and a waiter is woken by a notify. No timing: every wait is on a condition another thread
// sets. Names match the thread-sanitizer step of scripts/setup.sh ("Thread").
#include "util/mutex.h"

#include <gtest/gtest.h>

#include <thread>
#include <vector>

namespace kvtier::util {
namespace {

TEST(MutexThreadTest, LockExcludesOtherThreads) {
  Mutex mu;
  int64_t n = 0;  // guarded by mu (a local: the analysis checks only members)
  constexpr int kThreads = 4, kAdds = 20000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < kAdds; ++i) {
        MutexLock lock(mu);
        ++n;
      }
    });
  }
  for (std::thread& t : threads) t.join();
  MutexLock lock(mu);
  EXPECT_EQ(n, int64_t{kThreads} * kAdds);
}

// Whether `mu` was free: taken by TryLock and let go at once.
bool TryLockAndUnlock(Mutex& mu) {
  if (!mu.TryLock()) return false;
  mu.Unlock();
  return true;
}

TEST(MutexThreadTest, TryLockFailsWhileHeldElsewhere) {
  Mutex mu;
  bool other_got_it = true;
  mu.Lock();
  std::thread([&] { other_got_it = TryLockAndUnlock(mu); }).join();
  mu.Unlock();
  EXPECT_FALSE(other_got_it);
  // Free again: TryLock succeeds, and a MutexLock adopting it releases it.
  bool adopted = false;
  if (mu.TryLock()) {
    MutexLock lock(mu, kAdoptLock);
    adopted = true;
  }
  EXPECT_TRUE(adopted);
  bool free_after_adopt = false;
  std::thread([&] { free_after_adopt = TryLockAndUnlock(mu); }).join();
  EXPECT_TRUE(free_after_adopt);
}

TEST(MutexThreadTest, WaiterWokenByNotify) {
  Mutex mu;
  CondVar started, cv;
  bool waiting = false, ready = false, seen = false;  // guarded by mu
  std::thread waiter([&] {
    MutexLock lock(mu);
    waiting = true;
    started.NotifyAll();
    while (!ready) cv.Wait(mu);
    seen = ready;
  });
  {
    // The waiter held mu from setting `waiting` until its Wait released it: from here on it is
    // inside Wait, so only the notify below (or a spurious wake-up, then the loop) returns it.
    MutexLock lock(mu);
    while (!waiting) started.Wait(mu);
    ready = true;
  }
  cv.NotifyAll();
  waiter.join();
  MutexLock lock(mu);
  EXPECT_TRUE(seen);
}

TEST(MutexThreadTest, WaitUntilReturnsHoldingTheMutex) {
  Mutex mu;
  CondVar cv;
  int stage = 0;  // guarded by mu
  std::thread other([&] {
    MutexLock lock(mu);
    while (stage != 1) cv.Wait(mu);
    stage = 2;
    cv.NotifyAll();
  });
  MutexLock lock(mu);
  stage = 1;
  cv.NotifyAll();
  // A deadline far off: woken by the notify, not by the clock; the mutex held again on return.
  while (stage != 2) cv.WaitFor(mu, std::chrono::hours(1));
  EXPECT_EQ(stage, 2);
  mu.AssertHeld();
  other.join();  // `other` finished its critical section: it set stage 2 under mu
}

}  // namespace
}  // namespace kvtier::util
