// Internal: the operations in flight of a cache — device <-> host copies (on a CUDA stream or the
// cpu thread pool) and host <-> storage transfers (on the storage backend's threads) — and how
// their completion is observed: CUDA events and a condition variable signalled by the thread that
// completes an operation, never by sleeping.
//
// An operation is created and registered under the cache's mutex (its pages already reserved, its
// nodes marked busy), submitted after the mutex is released, completed by whichever thread runs
// it, and reaped (its effects on the tree applied) under the mutex again. Waiting happens outside
// the cache's mutex.
//
// Thread safety: Add / TakeDone / ops() under the cache's mutex; Complete*, Wait* and the progress
// readers from any thread (they take the tracker's own small mutex, never the cache's).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "cache/cache_lock_role.h"
#include "kvtier/device.h"
#include "kvtier/page_key.h"
#include "kvtier/status.h"
#include "kvtier/storage.h"

namespace kvtier {

class RadixNode;

struct CopyOp {
  enum class Kind : uint8_t {
    kBackup,    // device -> host (write policy or write_back eviction)
    kLoad,      // host -> device (LoadBack)
    kPrefetch,  // storage -> host
    kStore,     // host -> storage
    kRemove,    // storage objects no lookup can use (corrupt, or past a page a store did not
                // write), removed so that the next store writes them again
  };
  Kind kind = Kind::kBackup;
  bool gpu = false;         // completion through `event` (kBackup, kLoad on a GPU backend)
  bool write_back = false;  // kBackup made by a write_back eviction

  // ---- guarded by the cache's mutex ------------------------------------------------------
  // Nodes this operation marked busy (once each), top-down. A split adds the new upper node.
  std::vector<RadixNode*> nodes;
  // Device pages (kLoad: the destination, owned by the op until published) or host pages
  // (kPrefetch: the destination, owned until they become host hits or are freed) that the cache
  // must free when the operation has completed.
  std::vector<int64_t> free_on_completion;
  bool concluded = false;  // kPrefetch: its result was taken (FinishPrefetch / Release)
  // kStore: registered, not submitted: one of its keys has a removal in flight
  // (CacheCore::removing); queued when the last such removal is reaped (CacheCore::ReapRemove).
  bool held = false;
  // kStore: registered, waiting in the cache's write backlog (cache/store_backlog.h) for room in
  // the store's queue; not submitted. `backlog_dropped`: given up for a store likelier to be
  // reused (completed by the planner without a write; counted as backlog drops).
  bool backlogged = false;
  bool backlog_dropped = false;
  // kLoad: its LoadBack has not taken it back under the mutex yet (from MakeLoad until
  // PublishLoad, or its failure). Not reaped until then, even when complete: the copy runs
  // outside the mutex, and a Reap by another call in between (a Release, a Match) would free the
  // device pages the LoadBack is about to publish.
  bool unpublished = false;
  // kPrefetch: leading pages already handed to the tree (a streamed LoadBack takes the arrived
  // prefix while the rest is still being read); `pages` before this index are the tree's.
  int64_t handed_pages = 0;

  // ---- immutable once registered ---------------------------------------------------------
  std::vector<int64_t> src, dst;  // slots (device <-> host copies)
  std::vector<int64_t> pages;     // page starts of the destination (or host source for kStore)
  std::vector<PageKey> keys;      // storage operations: one per page
  // kStore: the key of the page before keys[0] in its prompt (nullopt: keys[0] is a first page,
  // or the key is unknown); the store evicts a chain's tail before its head.
  std::optional<PageKey> first_parent;
  int64_t tokens = 0;
  int64_t bytes = 0;
  int64_t batch_pages = 0;     // storage operations: pages per batch
  int64_t reuse_estimate = 0;  // kStore: StoreAdmission's estimate of its first page
  // kStore: admitted pages of its path past its last page, left out for want of room in the
  // store's queue (or the backlog's per-store bound). They follow when it lands whole
  // (BackupPlanner::StoreBelow); when it does not, or is given up in the backlog, they are counted
  // under the reason of its first page that did not make it.
  int64_t tail_pages = 0;
  std::chrono::steady_clock::time_point start;
  std::chrono::steady_clock::time_point deadline;  // kPrefetch with the timeout policy
  std::shared_ptr<CudaEventHandle> wait_before;    // GPU: the engine's writes to wait for
  CudaEventHandle event;                           // GPU: recorded after the copy
  // GPU loads: a timing event recorded right before the copy (`event` then times too): the
  // copy's time on the device, begin to end, is what load_back_seconds counts.
  CudaEventHandle begin;
  std::unique_ptr<LayerEvents> layer_events;  // GPU loads

  // ---- completion (the tracker's mutex) ---------------------------------------------------
  Status status;                        // the first failure
  std::vector<PageStatus> page_status;  // storage operations
  std::vector<uint8_t> batch_done;      // storage operations, per batch
  int64_t batches_left = 0;
  int64_t present_pages = 0;  // kStore: pages storage already held (not written)
  // Storage operations: pages of batches the backend's queue rejected (Unavailable: its queue
  // was full), left kSkipped.
  int64_t rejected_pages = 0;
  bool submitted = false;
  bool abandoned = false;  // kPrefetch: concluded; WaitArrival returns at once
  std::atomic<bool> done{false};
  std::chrono::steady_clock::time_point finished;

  int64_t num_batches() const {
    return batch_pages == 0 ? 0
                            : (static_cast<int64_t>(keys.size()) + batch_pages - 1) / batch_pages;
  }
};

class CopyTracker {
 public:
  CopyTracker() = default;
  // Every completion notifies under mu_, but a reaper sees an op done through its atomic `done`
  // without mu_ (IsDone), so the cache may be torn down while the op's completer (a storage I/O
  // thread) is still inside its critical section: taking mu_ once here waits for it to leave
  // before cv_ and mu_ go.
  ~CopyTracker() { std::lock_guard<std::mutex> lk(mu_); }
  CopyTracker(const CopyTracker&) = delete;
  CopyTracker& operator=(const CopyTracker&) = delete;
  // Registers an operation (under the cache's mutex).
  void Add(std::shared_ptr<CopyOp> op) KVTIER_REQUIRES(kCacheLock) {
    ops_.push_back(std::move(op));
  }
  const std::vector<std::shared_ptr<CopyOp>>& ops() const KVTIER_REQUIRES(kCacheLock) {
    return ops_;
  }
  // Removes and returns the operations that have completed (non-blocking: GPU events are
  // queried). Under the cache's mutex.
  std::vector<std::shared_ptr<CopyOp>> TakeDone() KVTIER_REQUIRES(kCacheLock);
  // Reaping: takes the operations that have completed and hands each to `reap(op)` (under the
  // cache's mutex), in the order they were registered. Until its turn comes, a completed
  // operation stays visible to ForEachOp (a split while an earlier one is reaped must find its
  // nodes). `reap` may Add operations (they are reaped by a later call).
  template <typename Fn>
  void Reap(Fn&& reap) KVTIER_REQUIRES(kCacheLock) {
    reaping_ = TakeDone();
    for (auto& entry : reaping_) {
      const std::shared_ptr<CopyOp> op = std::move(entry);
      reap(op);
    }
    reaping_.clear();
  }
  // Calls `f(op)` for every registered operation and every completed one not reaped yet. Under
  // the cache's mutex.
  template <typename F>
  void ForEachOp(F&& f) const KVTIER_REQUIRES(kCacheLock) {
    for (const auto& op : ops_) f(op);
    for (const auto& op : reaping_) {
      if (op) f(op);
    }
  }

  // ---- completion, from the thread that ran the operation -----------------------------------
  // A copy (or the submission of a GPU copy: `submitted` without `done`).
  void MarkSubmitted(CopyOp& op, Status status);
  void Complete(CopyOp& op, Status status);
  // Storage: one batch's page outcomes (pages [first, first + statuses.size())). True when this
  // batch completed the operation (exactly one call per operation returns true); then `on_last`
  // (if set) runs first, under the tracker's mutex, before anyone can see the op complete.
  bool CompleteBatch(CopyOp& op, int64_t batch, const Status& status,
                     const std::vector<PageStatus>& statuses,
                     const std::function<void(const CopyOp&)>& on_last = nullptr);
  // kStore: `present_pages` more pages storage held already (each batch's Exists).
  void AddPresent(CopyOp& op, int64_t present_pages);

  // ---- observation (any thread; never under the cache's mutex when it may block) -----------
  bool IsDone(CopyOp& op);
  // Blocks until the operation has completed.
  void Wait(CopyOp& op) KVTIER_EXCLUDES(kCacheLock);
  // Blocks until it has completed or `deadline` passed; true when completed.
  bool WaitUntil(CopyOp& op, std::chrono::steady_clock::time_point deadline)
      KVTIER_EXCLUDES(kCacheLock);
  // Storage operations: pages with kOk from the first on, over completed batches only.
  int64_t ArrivedPages(CopyOp& op);
  // A storage read's arrival as a streamed LoadBack sees it: the arrived prefix (ArrivedPages),
  // and whether it can still grow (false once every batch completed, once the page after the
  // prefix is known not to arrive — its batch completed without it — or once the op was
  // abandoned).
  struct Arrival {
    int64_t pages = 0;
    bool final = false;
  };
  // Blocks until more than `pages` pages arrived, the arrival is final, or `deadline` passed
  // (time_point::max(): no deadline).
  Arrival WaitArrival(CopyOp& op, int64_t pages, std::chrono::steady_clock::time_point deadline)
      KVTIER_EXCLUDES(kCacheLock);
  // Wakes WaitArrival for good: `op`'s result was taken (Prefetcher::Conclude).
  void Abandon(CopyOp& op);
  // A snapshot of the page outcomes and which batches completed.
  void Snapshot(CopyOp& op, std::vector<PageStatus>* pages, std::vector<uint8_t>* batches,
                Status* status);

 private:
  Arrival ArrivalLocked(const CopyOp& op) const;  // REQUIRES: mu_

  std::vector<std::shared_ptr<CopyOp>> ops_ KVTIER_GUARDED_BY(kCacheLock);
  // Reap's; null once reaped.
  std::vector<std::shared_ptr<CopyOp>> reaping_ KVTIER_GUARDED_BY(kCacheLock);
  std::mutex mu_;
  std::condition_variable cv_;
};

}  // namespace kvtier
