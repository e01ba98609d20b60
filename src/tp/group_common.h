// Internal: what the leader (tp_group.cc) and the followers (tp_follower.cc) of a TP group share
// besides the ring's layout (tp/decision_ring.h): deadlines, rank states, waking the other side,
// and the storage decision's operations.
//
// Thread safety: pure functions; Bump is an atomic increment and a wake, SleepOn a futex wait.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>

#include "tp/decision_ring.h"

namespace kvtier::tp {

using Clock = std::chrono::steady_clock;

inline double SecondsLeft(Clock::time_point deadline) {
  return std::chrono::duration<double>(deadline - Clock::now()).count();
}
inline Clock::time_point After(double seconds) {
  return Clock::now() +
         std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
}

// A rank record's state beyond RankState: a follower is filling in its record (not attached yet).
inline constexpr uint32_t kClaiming = 3;

inline uint32_t StateOf(const RankRecord& r) { return r.state.load(std::memory_order_acquire); }

// Publishes a change of `word`'s side (release) and wakes every waiter on it.
inline void Bump(std::atomic<uint32_t>* word) {
  word->fetch_add(1, std::memory_order_release);
  FutexWakeAll(word);
}

// The hot path's wake: publishes a change (made before the call) by bumping `word`, and makes
// the FUTEX_WAKE system call (several microseconds where the sleeper must be woken on another
// CPU, more on a VM) only when a waiter announced itself in `sleepers` (SleepOn). Sequentially
// consistent on both sides: either the waker sees the sleeper, or the sleeper's futex wait sees
// the bumped word and returns at once.
// Returns whether it made the call.
inline bool BumpIfSleeping(std::atomic<uint32_t>* word, std::atomic<uint32_t>* sleepers) {
  word->fetch_add(1, std::memory_order_seq_cst);
  if (sleepers->load(std::memory_order_seq_cst) == 0) return false;
  FutexWakeAll(word);
  return true;
}

// Waits on `word` while it still holds `seen` (read before the caller checked its condition),
// at most timeout_s, announced in `sleepers` (BumpIfSleeping).
inline void SleepOn(std::atomic<uint32_t>* word, std::atomic<uint32_t>* sleepers, uint32_t seen,
                    double timeout_s) {
  sleepers->fetch_add(1, std::memory_order_seq_cst);
  FutexWait(word, seen, timeout_s);
  sleepers->fetch_sub(1, std::memory_order_seq_cst);
}

// One iteration of a spin-wait.
inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// A storage decision's payload (a kStorage record's message): op (u32: 1 get, 2 set), 4 bytes of
// padding, the page count n (u64), n page keys, then n host page starts (int64 slots).
enum class StorageOp : uint32_t { kGet = 1, kSet = 2 };

}  // namespace kvtier::tp
