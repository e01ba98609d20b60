// Internal: the core of a HierarchicalCache with its parts wired together (see cache/cache_core.h
// for the state and the locking discipline): the copy executor, the tier evictor, the backup
// planner, the prefetcher, the shared-host adopter and the pins, and what binds them — reaping
// (each completed operation goes to the part that made it) and the tree's split hook (a split
// node's operations list both halves). HierarchicalCache's Impl is this plus the waiting calls; the
// parts' unit tests build one directly.
//
// Thread safety: as CacheCore: Reap and OnSplit REQUIRE the mutex; Drain takes it (`lk`) and
// releases it while it waits; Open and Close run while no other thread uses the object.
#pragma once

#include <memory>

#include "cache/backup_planner.h"
#include "cache/cache_core.h"
#include "cache/copy_executor.h"
#include "cache/pin_table.h"
#include "cache/prefetcher.h"
#include "cache/shared_adopter.h"
#include "cache/tier_evictor.h"

namespace kvtier {

struct CacheParts : CacheCore {
  CacheParts(const HierarchicalCacheConfig& cfg, int64_t page_size);
  // Close()s.
  ~CacheParts();
  CacheParts(const CacheParts&) = delete;
  CacheParts& operator=(const CacheParts&) = delete;

  // Opens the tiers over `device_region` with `engine` (REQUIRES: both checked against each other
  // and the config, as HierarchicalCache::Create does): the host tier, the device ledger, the
  // copy executor, the storage tier, the split hook.
  Status Open(const KvRegion& device_region, std::unique_ptr<TransferEngine> engine);
  // Ends running prefetches (cancelled), waits for every operation in flight, stops the executor
  // and closes a storage backend the cache opened. Idempotent.
  void Close() KVTIER_EXCLUDES(kCacheLock);

  // Applies the operations that have completed (the tracker hands them over one by one), and
  // ends the pins whose TTL has run out.
  void Reap(CacheWork* work) KVTIER_REQUIRES(kCacheLock);
  // Marks not stored (publishing their removal as KV events) the pages the store evicted by
  // itself since the last call (StorageBackend::TakeEvictions; with events and storage only),
  // from a node's first such page on, with the storage-only nodes below; drops the nodes then
  // resident nowhere.
  void ForgetStoreEvictions() KVTIER_REQUIRES(kCacheLock);
  // The tree split `lower` off `upper` (its new parent): operations that list `lower` (busy or
  // storing) list `upper` too — registered ones, completed ones being reaped, and handles'
  // prefetches.
  void OnSplit(RadixNode* upper, RadixNode* lower) KVTIER_REQUIRES(kCacheLock);
  // Waits for every operation in flight (outside the lock; backups_only: device -> host and
  // host -> storage copies and removals from storage only; never an unconcluded prefetch, which
  // its handle takes) until none is left, running `work` first. A store held back behind a removal
  // is waited for after the removal (whose reaping queues it).
  void Drain(CacheLock& lk, CacheWork* work, bool backups_only) KVTIER_REQUIRES(kCacheLock);

  CopyExecutor executor;
  // The planner before the evictor: the evictor holds it as its WriteBackPlanner (constructed).
  BackupPlanner planner;
  TierEvictor evictor;
  Prefetcher prefetcher;
  SharedHostAdopter adopter;
  PinTable pins;
  // Store evictions of nodes that were in use when ForgetStoreEvictions met them: again at the
  // next one.
  std::vector<PageKey> deferred_evictions KVTIER_GUARDED_BY(kCacheLock);

 private:
  bool open_ = false;
};

// The invariants of cache/cache_core.h and of the parts' own state (the prefetcher's filling
// pages, the planner's removals in flight), checked; Internal naming the first that does not hold.
Status CheckCacheConsistency(const CacheParts& parts) KVTIER_REQUIRES(kCacheLock);

}  // namespace kvtier
