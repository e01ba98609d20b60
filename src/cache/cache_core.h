// Internal: the bookkeeping that the parts of a HierarchicalCache share, all guarded by one mutex
// (CacheCore::mu), and the two things every public call carries: the lock (CacheLock) and the
// work it collects to run after the lock is released (CacheWork).
//
// The parts (each a class of its own, holding a reference to the core):
//   CopyExecutor   (copy_executor.h)   submits copies and storage calls after the lock; completes
//                                      load-backs
//   TierEvictor    (tier_evictor.h)    evicts from device, host and the storage-only tree
//   BackupPlanner  (backup_planner.h)  device -> host backups and host -> storage stores, under a
//                                      BackupPolicy (the write policy)
//   Prefetcher     (prefetcher.h)      the storage -> host read state machine
// and HierarchicalCache (hierarchical_cache.cc), the orchestrator: the public calls, the handle
// table's users, reaping and waiting.
//
// State (CacheCore):
//   tree          the radix tree over the three tiers (cache/radix_tree.h);
//   ledger        per device page: free, engine, tree or a copy in flight;
//   host          the host tier (cache/host_tier.h: the cache's own pool, or a shared segment
//                 whose pages it pins): a held page is a node's (tree) or an in-flight prefetch's
//                 (filling) — nothing else; null without a host tier (nothing is ever backed up,
//                 device evictions forget);
//   handles       live MatchHandles: the node each pins (ancestors included), the tokens after
//                 the match (for QueryStorage), a running prefetch and, on a GPU, its load-back;
//   tracker       operations in flight. Each marked its nodes busy once (a split hands the mark to
//                 both halves: the split hook); a busy node is evictable in no tier.
// The parts own the rest (each part's header says what): the prefetcher its filling host pages,
// the backup planner its store queue and the removals from storage in flight (a store naming a
// key being removed is held), the pins their table. A part reaches another only through the
// references CacheParts wires, one way: planner -> evictor, prefetcher -> evictor and planner,
// adopter -> evictor; the evictor asks for write-backs through WriteBackPlanner (no cycle).
// Invariants (HierarchicalCache::CheckConsistency): the tree's device pages are exactly the
// ledger's kTree pages; the ledger's kCopy pages are exactly the load-backs' unpublished pages; the
// host allocator's used pages are the tree's host pages plus the prefetches' filling pages; every
// node's ref_count equals the number of live handles pinning it or a descendant, and its busy count
// the number of operations that list it; the planner's `removing` holds the keys of the removals
// in flight, and a store is held exactly while one of its keys is in it.
//
// Locking discipline: every public call takes `mu`, does bookkeeping only, and collects into a
// CacheWork what must happen outside it — submitting copies (cpu pool, inline, or a CUDA stream)
// and storage calls, and the eviction listener's events — which the CopyExecutor runs after `mu`
// is released. Completions are applied (reaped) by the next call under `mu`. Calls that wait
// (FinishPrefetch, WaitForBackups, allocations that need a write-back to finish) release `mu` while
// they wait. Every method of the core and the parts that reads or writes the state REQUIRES `mu`
// unless its comment says otherwise.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <vector>

#include "cache/cache_lock_role.h"
#include "cache/copy_tracker.h"
#include "cache/device_page_ledger.h"
#include "cache/host_tier.h"
#include "cache/kv_event_emitter.h"
#include "cache/radix_tree.h"
#include "cache/stored_key_index.h"
#include "kvtier/hierarchical_cache.h"
#include "pool/page_staging.h"

namespace kvtier {

using CacheClock = std::chrono::steady_clock;

inline double SecondsSince(CacheClock::time_point start,
                           CacheClock::time_point end = CacheClock::now()) {
  return std::chrono::duration<double>(end - start).count();
}

// Pages covering `num_tokens` (no overflow near INT64_MAX).
inline int64_t PagesFor(int64_t num_tokens, int64_t page_size) {
  return num_tokens / page_size + (num_tokens % page_size != 0 ? 1 : 0);
}

// Sorts nodes top-down (shallowest first).
void SortTopDown(std::vector<RadixNode*>* nodes);

// An eviction event whose strings the cache owns until the listener has run.
struct OwnedEvent {
  CacheTier tier;
  std::string name_space;
  std::vector<Token> prefix;
  int64_t num_tokens;
  bool kept_in_host;
  bool kept_in_storage;
};

class CopyExecutor;

// What a call does after releasing the mutex. Operations in it are registered already, so it must
// run: a public call declares its CacheWork before its CacheLock, and the destructor runs what is
// left after the lock is gone (early returns included).
struct CacheWork {
  explicit CacheWork(CopyExecutor* runner = nullptr) : executor(runner) {}
  ~CacheWork() KVTIER_EXCLUDES(kCacheLock);
  CacheWork(const CacheWork&) = delete;
  CacheWork& operator=(const CacheWork&) = delete;
  CopyExecutor* executor;
  std::vector<std::shared_ptr<CopyOp>> copies;   // device <-> host backups to submit
  std::vector<std::shared_ptr<CopyOp>> storage;  // prefetches and stores to submit
  std::vector<OwnedEvent> events;
  bool empty() const { return copies.empty() && storage.empty() && events.empty(); }
};

// A live MatchHandle.
struct HandleState {
  RadixNode* last = nullptr;  // pinned with its ancestors; null: nothing matched
  std::string ns;
  std::vector<Token> rest;  // whole pages after the match (storage tier only)
  // GPU: the copies of its last LoadBack (one per piece of a streamed load), for WaitLayer.
  std::vector<std::shared_ptr<CopyOp>> loads;
  std::shared_ptr<CopyOp> prefetch;  // running (not concluded) prefetch
  PrefetchPolicy prefetch_policy = PrefetchPolicy::kBestEffort;
};

// Which way a storage operation moved pages (CountStorageFaults counts their time-outs apart).
enum class StorageIo : uint8_t { kRead, kWrite };

// The storage read bandwidth a cache measured (bytes/s): an exponential moving average over its
// completed prefetches. Thread-safe (its own mutex): observed from the storage completion threads.
class ReadBandwidth {
 public:
  // One completed prefetch: `bytes` arrived in `seconds` (from submission to the last batch).
  void Observe(double bytes, double seconds);
  double bytes_per_second() const;  // 0: nothing measured yet

 private:
  mutable std::mutex mu_;
  double bps_ = 0;
};

struct CacheCore {
  CacheCore(const HierarchicalCacheConfig& cfg, int64_t page_size);

  // Every member says how it is kept safe: immutable (set by the constructor, or by Open before
  // any other thread sees the core, and never changed after: no guard needed), synchronized by
  // itself, or guarded by `mu` (kCacheLock in the analysis: KVTIER_GUARDED_BY /
  // KVTIER_PT_GUARDED_BY). Declaration order is destruction order (reversed): keep it.
  const HierarchicalCacheConfig config;  // immutable
  const int64_t P;                       // immutable: tokens per page
  const uint64_t tag;  // immutable: handle ids carry this instance's tag in the high bits
  KvRegion device;     // immutable: the engine's device region
  // null: no host tier (config.has_host_tier()). The pointer is immutable; the tier has no lock of
  // its own (cache/host_tier.h), so every use of it is under `mu`.
  std::unique_ptr<HostTier> host KVTIER_PT_GUARDED_BY(kCacheLock);
  // Immutable: the host tier's region (HierarchicalCache::host_region(); without a host tier:
  // empty, of the host pages' geometry) and whether it is a shared segment — what `host` says,
  // for the calls that read them without `mu`.
  KvRegion host_region;
  bool shared_host_tier = false;
  // Immutable pointer; the engine may be used from several threads (kvtier/transfer.h).
  std::unique_ptr<TransferEngine> engine;
  bool gpu = false;  // immutable: `engine` is not the cpu engine
  // Immutable pointer; every method of a backend may be called from any thread (kvtier/storage.h).
  std::shared_ptr<StorageBackend> storage;
  bool owns_storage = false;  // immutable: opened from a URL, closed with the cache
  // Immutable pointer; host pages <-> storage calls from any thread (pool/page_staging.h).
  std::unique_ptr<storage::PageStaging> staging;
  ReadBandwidth read_bandwidth;  // synchronized by itself (its own mutex): for the recompute rule

  mutable std::mutex mu;  // the cache's mutex: kCacheLock in the analysis; CacheLock takes it
  mutable std::atomic<std::thread::id>
      owner{};  // atomic: who holds `mu` (MutexHeldByCurrentThread)
  RadixTree tree KVTIER_GUARDED_BY(kCacheLock);
  // KV events (config.kv_event_sink): the tree's tier changes, handed to the sink as CacheLock
  // releases `mu` (null without a sink). The pointer is immutable (set by Open).
  std::unique_ptr<KvEventEmitter> events KVTIER_PT_GUARDED_BY(kCacheLock);
  // With events and a storage tier: the stored pages' nodes by key, so that pages the store
  // evicted by itself are published as removed (CacheParts::ForgetStoreEvictions; set by Open).
  std::unique_ptr<StoredKeyIndex> stored_keys KVTIER_PT_GUARDED_BY(kCacheLock);
  std::unique_ptr<DevicePageLedger> ledger KVTIER_PT_GUARDED_BY(kCacheLock);
  // Operations in flight: synchronized by itself — its list under kCacheLock (annotated in
  // cache/copy_tracker.h), their progress under its own mutex.
  CopyTracker tracker;
  std::unordered_map<uint64_t, HandleState> handles KVTIER_GUARDED_BY(kCacheLock);
  uint64_t next_seq KVTIER_GUARDED_BY(kCacheLock) = 1;
  // An internal failure makes the cache unusable.
  Status health KVTIER_GUARDED_BY(kCacheLock);
  // The first failed backup since WaitForBackups last said so.
  Status backup_failure KVTIER_GUARDED_BY(kCacheLock);
  CacheStats counters KVTIER_GUARDED_BY(kCacheLock);

  // ---- setup (Create; no lock needed: nothing else sees the core yet, so the analysis, which
  // cannot know that, is off for them) ----------------------------------------------------------
  // The host tier the config asks for (none, the cache's own pool or a shared segment).
  Status OpenHostTier(const KvRegion& device_region) KVTIER_NO_THREAD_SAFETY_ANALYSIS;
  // The storage tier the config asks for (a backend given, or opened from its URL) and its
  // staging; InvalidArgument when a given backend's namespace does not describe the host pages.
  Status OpenStorageTier(const KvRegion& device_region) KVTIER_NO_THREAD_SAFETY_ANALYSIS;

  // The counters with the tree's, the ledger's and the host tier's occupancy; the parts add
  // theirs (HierarchicalCache::stats: the prefetcher's filling pages, the pins, the backlog).
  CacheStats Stats() const KVTIER_REQUIRES(kCacheLock);

  // ---- handles -------------------------------------------------------------------------------
  Result<HandleState*> FindHandle(MatchHandle handle) KVTIER_REQUIRES(kCacheLock);
  MatchHandle NewHandle(HandleState h) KVTIER_REQUIRES(kCacheLock);

  // ---- health --------------------------------------------------------------------------------
  Status CheckHealth() const KVTIER_REQUIRES(kCacheLock);
  // Makes the cache unusable with `st` (the first failure wins); nothing when `st` is OK.
  void Fail(Status st, std::string_view what) KVTIER_REQUIRES(kCacheLock);

  // ---- never slower than recomputing (StorageTierConfig::prefill_tokens_per_second) --------
  // Where a storage part of `tokens` tokens is cut: nothing when the rule is off or no bandwidth
  // was measured yet, else the whole part when reading it is estimated slower than recomputing.
  StorageCut CutFor(int64_t tokens) const;

  // ---- pages -----------------------------------------------------------------------------------
  int64_t PageBytes() const {
    return device.num_buffers() * device.geometry.num_layers * device.geometry.slot_bytes * P;
  }
  // Appends the slots of `pages` (page starts) to `out`.
  void AppendSlots(std::span<const int64_t> pages, std::vector<int64_t>* out) const;
  // The device slots of the leading device part of `path`.
  std::vector<int64_t> DeviceSlotsOf(const std::vector<RadixNode*>& path) const
      KVTIER_REQUIRES(kCacheLock);
  // The nodes from the root's child down to `last` (empty for null or the root).
  static std::vector<RadixNode*> Path(RadixNode* last);

  void FreeHost(std::span<const int64_t> pages) KVTIER_REQUIRES(kCacheLock);
  // Pages a backup was given and did not use (or that its failed copy wrote): those it was to
  // write (`written`) are abandoned, those published already released.
  void ReturnBackupPages(std::span<const int64_t> pages, const std::vector<int64_t>& written)
      KVTIER_REQUIRES(kCacheLock);
  void FreeDevice(std::span<const int64_t> pages) KVTIER_REQUIRES(kCacheLock) {
    Fail(ledger->Free(pages), "device pages");
  }

  // ---- busy marks and events -------------------------------------------------------------------
  void MarkBusy(CopyOp& op, RadixNode* n) KVTIER_REQUIRES(kCacheLock) {
    tree.AddBusy(n);
    op.nodes.push_back(n);
  }
  void ClearBusy(CopyOp& op) KVTIER_REQUIRES(kCacheLock) {
    for (RadixNode* n : op.nodes) tree.RemoveBusy(n);
    op.nodes.clear();
  }
  // Queues the eviction listener's event for `node` (nothing without a listener).
  void Event(CacheWork* work, CacheTier tier, const RadixNode* node, bool kept_in_host,
             bool kept_in_storage) KVTIER_REQUIRES(kCacheLock);
  // Counts the storage faults of a completed storage operation (or a snapshot of one): a read
  // (prefetch) or a write (backup), whose time-outs are counted apart.
  void CountStorageFaults(StorageIo io, const std::vector<PageStatus>& statuses,
                          const Status& status) KVTIER_REQUIRES(kCacheLock);
};

// The core's mutex with an owner record, so tests can ask whether the calling thread holds it.
class KVTIER_SCOPED_CAPABILITY CacheLock {
 public:
  explicit CacheLock(const CacheCore& core) KVTIER_ACQUIRE(kCacheLock) : core_(core), lk_(core.mu) {
    Own();
  }
  ~CacheLock() KVTIER_RELEASE() {
    if (lk_.owns_lock()) {
      FlushEvents();
      core_.owner.store(std::thread::id(), std::memory_order_relaxed);
    }
  }
  CacheLock(const CacheLock&) = delete;
  CacheLock& operator=(const CacheLock&) = delete;
  void unlock() KVTIER_RELEASE() {
    FlushEvents();
    core_.owner.store(std::thread::id(), std::memory_order_relaxed);
    lk_.unlock();
  }
  void lock() KVTIER_ACQUIRE() {
    lk_.lock();
    Own();
  }
  // For a helper that KVTIER_REQUIRES(kCacheLock) and lets the mutex go while it waits: to the
  // analysis these release and take the role, which the helper's callers hold through this lock.
  void Release() KVTIER_RELEASE(kCacheLock) KVTIER_NO_THREAD_SAFETY_ANALYSIS { unlock(); }
  void Reacquire() KVTIER_ACQUIRE(kCacheLock) KVTIER_NO_THREAD_SAFETY_ANALYSIS { lock(); }

 private:
  void Own() { core_.owner.store(std::this_thread::get_id(), std::memory_order_relaxed); }
  // The events the tree's changes queued, in order, while `mu` is still held.
  void FlushEvents() KVTIER_REQUIRES(kCacheLock) {
    if (core_.events) core_.events->Flush();
  }
  const CacheCore& core_;
  std::unique_lock<std::mutex> lk_;
};

}  // namespace kvtier
