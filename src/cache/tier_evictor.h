// Internal: the part of a HierarchicalCache that makes room — evicts device pages (dropping them,
// or keeping the node in host memory), host pages (keeping the node in storage, or forgetting it),
// and trims the storage-only part of the tree to its bound. Eviction is page-granular: a victim
// node is split so that only the pages needed go. Under write_back (the BackupPolicy says so),
// victims without a copy below are handed to a WriteBackPlanner (the BackupPlanner) first and
// evicted once copied.
//
// Thread safety: every method REQUIRES the cache's mutex (cache/cache_core.h); nothing here waits
// or copies.
#pragma once

#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "cache/backup_policy.h"
#include "cache/cache_core.h"

namespace kvtier {

// What eviction asks of the tiers below before it evicts a node that has no copy there
// (write_back, as the policy says): a backup to host memory, a store to storage. The
// BackupPlanner implements it (cache/backup_planner.h, where the calls are described). An
// interface, so that the parts do not form a cycle: the planner uses the evictor (to make room in
// host memory, to drop nodes resident nowhere), the evictor only this.
class WriteBackPlanner {
 public:
  virtual const BackupPolicy& policy() const = 0;
  // Device -> host for the unbacked path ending at `node`; false when nothing changed.
  virtual bool Backup(RadixNode* node, CacheWork* work, bool write_back)
      KVTIER_REQUIRES(kCacheLock) = 0;
  // Host -> storage for the unstored host path ending at `node`; false when nothing was queued.
  // `deferred`: it waits for a store or copy in flight; `refused_pages`: the pages admission
  // refused, for the caller to count.
  virtual bool Store(RadixNode* node, CacheWork* work, bool* deferred, int64_t* refused_pages)
      KVTIER_REQUIRES(kCacheLock) = 0;
  // Pages the bounded store queue takes now; <= 0: it is full.
  virtual int64_t StoreQueueRoom() const KVTIER_REQUIRES(kCacheLock) = 0;

 protected:
  ~WriteBackPlanner() = default;
};

class TierEvictor {
 public:
  // `planner` must outlive this.
  TierEvictor(CacheCore& core, WriteBackPlanner& planner) : core_(core), planner_(planner) {}
  TierEvictor(const TierEvictor&) = delete;
  TierEvictor& operator=(const TierEvictor&) = delete;

  // Frees at least `need` device pages if it can; returns the pages freed now. Under write_back,
  // unbacked leaves are submitted for backup instead (added to `work`); they become evictable once
  // the copy has completed.
  int64_t EvictDevice(int64_t need, CacheWork* work) KVTIER_REQUIRES(kCacheLock);
  // Frees at least `need` host pages if it can; returns the pages freed now. Under write_back with
  // a storage tier, unstored leaves are submitted for a store instead, and eviction stops at a
  // leaf whose path waits for a store in flight (it is stored, then evictable, later).
  int64_t EvictHost(int64_t need, CacheWork* work) KVTIER_REQUIRES(kCacheLock);
  // Keeps the storage-only part of the tree within its bound; orphans go at once.
  void TrimStorage(CacheWork* work) KVTIER_REQUIRES(kCacheLock);
  // Removes `node` and its subtree when it is resident nowhere any more (its children can only be
  // storage-only or orphans then), unpinned and not busy.
  void DropIfNowhere(RadixNode* node) KVTIER_REQUIRES(kCacheLock);

  // Host pages that eviction could free now (an upper bound: pins and busy nodes excluded).
  int64_t HostReclaimable() const KVTIER_REQUIRES(kCacheLock);
  // Device pages eviction could free once the copies in flight have completed (pins and the
  // engine's pages excluded).
  int64_t DeviceReclaimable() const KVTIER_REQUIRES(kCacheLock);
  // `pages` free host pages if eviction can make them (nothing is evicted when it cannot).
  bool EnsureHostPages(int64_t pages, CacheWork* work) KVTIER_REQUIRES(kCacheLock);

  // `pages` device pages for `owner`, evicting first what must go. With allow_fewer, as many as
  // can be had. OutOfMemory naming `what` when pins and the engine's pages leave too little (before
  // anything is evicted). `waits` collects operations whose completion would free more (write_back
  // copies, busy nodes); the caller may wait for them outside the lock and retry.
  Result<std::vector<int64_t>> TryAllocateDevice(int64_t pages, bool allow_fewer,
                                                 DevicePageLedger::Owner owner,
                                                 std::string_view what, CacheWork* work,
                                                 std::vector<std::shared_ptr<CopyOp>>* waits)
      KVTIER_REQUIRES(kCacheLock);

 private:
  void CountEviction(CacheClock::time_point start, int64_t freed_pages) KVTIER_REQUIRES(kCacheLock);

  CacheCore& core_;
  WriteBackPlanner& planner_;
};

}  // namespace kvtier
