// Internal: the part of a HierarchicalCache that copies pages down the tiers — device -> host
// backups and host -> storage stores — as its BackupPolicy (the write policy) says, and applies
// their completions to the tree.
//
// A backup covers the unbacked path ending at a node: host pages are assigned at once (so nothing
// else takes them) and the nodes stay busy until the copy has completed. A store covers the
// unstored host path ending at a node, as far as the storage admission policy admits its pages
// (cache/store_admission.h): its nodes are marked storing (their host pages stay put) until the
// storage calls complete. A store goes to the store's queue while it has room
// (max_backup_queue_pages), else it waits in the write backlog (cache/store_backlog.h, at most
// admission.backlog_bytes), which gives up the stores least likely to be reused when full; each
// store that lands makes room for the backlog's likeliest.
//
// Thread safety: every method REQUIRES the cache's mutex (cache/cache_core.h). Copies and storage
// calls are only collected into a CacheWork here; the CopyExecutor runs them after the lock.
#pragma once

#include <chrono>
#include <memory>
#include <span>
#include <unordered_map>
#include <vector>

#include "cache/backup_policy.h"
#include "cache/cache_core.h"
#include "cache/store_admission.h"
#include "cache/store_backlog.h"
#include "cache/tier_evictor.h"

namespace kvtier {

// The write backlog holds at most this share of the host tier: its stores keep their host pages
// (storing), which host eviction cannot take, so a backlog as large as the host tier would leave
// no room for host hits (the CPU replay of the conversation trace, tiny pages, a 1 GiB backlog:
// 11 % hits instead of 16-24 %).
inline constexpr int64_t kMaxBacklogHostShareDivisor = 8;

// The slowest write rate a store batch is sized for, in bytes per second.
inline constexpr double kSlowestStoreBytesPerSecond = 128e6;

// Pages per Set batch of a store: at most `max_backup_batch_pages` and the backend's
// `max_batch_pages`, and at most what a store writing at kSlowestStoreBytesPerSecond finishes
// within the backend's per-call `timeout` (a Set runs against that deadline from when an I/O
// thread takes it, and while reads run it has only a quarter of the threads: a batch of 256 pages
// of 8 MiB could not make 2 s, its late pages timed out, failed and were written again by a
// later store). At least 1.
int64_t StoreBatchPages(int64_t page_bytes, std::chrono::milliseconds timeout,
                        int64_t max_backup_batch_pages, int64_t backend_max_batch_pages);

// The write-back half (Backup, Store, StoreQueueRoom) is what the TierEvictor calls, through
// WriteBackPlanner; the planner calls the evictor, never the other way round.
class BackupPlanner final : public WriteBackPlanner {
 public:
  // `evictor` may be constructed after this (it is used only by calls).
  BackupPlanner(CacheCore& core, TierEvictor& evictor)
      : core_(core),
        evictor_(evictor),
        policy_(MakeBackupPolicy(core.config.write_policy, core.config.write_through_threshold)),
        admission_(MakeStoreAdmission(core.config.storage.admission)),
        backlog_(0) {}
  BackupPlanner(const BackupPlanner&) = delete;
  BackupPlanner& operator=(const BackupPlanner&) = delete;

  const BackupPolicy& policy() const override { return *policy_; }
  const StoreAdmission& admission() const KVTIER_REQUIRES(kCacheLock) { return *admission_; }
  const StoreBacklog& backlog() const KVTIER_REQUIRES(kCacheLock) { return backlog_; }
  // Once the tiers are open: the backlog's capacity, admission.backlog_bytes but at most
  // 1 / kMaxBacklogHostShareDivisor of the host tier (0 without a storage queue: a backlog that
  // never drains).
  void SizeBacklog() KVTIER_REQUIRES(kCacheLock);

  // Accesses of pages, for the admission policy (Match: the matched prefix's; Insert: the pages
  // it added).
  void RecordAccess(std::span<const PageKey> keys) KVTIER_REQUIRES(kCacheLock) {
    if (core_.storage) admission_->Record(keys);
  }
  // Under a policy that stores on backup: offers storage the unstored host path of `path` (just
  // matched) again, so a store refused, dropped or failed earlier is reconsidered on reuse.
  void MaybeStore(const std::vector<RadixNode*>& path, CacheWork* work) KVTIER_REQUIRES(kCacheLock);

  // Device -> host for the unbacked path ending at `node`. False (nothing changed, no host node
  // evicted) when host memory cannot be found, a node on the path is busy or not on the device.
  // Shared host tier: pages are reserved by key; pages published already are taken without a copy;
  // the backup covers the leading pages the tier gave (the node where they end is split), the rest
  // is skipped (counted). `write_back`: made by a device eviction (counted as such).
  bool Backup(RadixNode* node, CacheWork* work, bool write_back) override
      KVTIER_REQUIRES(kCacheLock);
  // The policy's backup on use: the deepest device-only node of `path` that qualifies.
  void MaybeBackup(const std::vector<RadixNode*>& path, CacheWork* work)
      KVTIER_REQUIRES(kCacheLock);
  // Host -> storage for the unstored host path ending at `node` (only pages storage does not hold:
  // the tree's `stored` marks, then the backend's Exists per batch), in batches of
  // max_backup_batch_pages (at most the backend's max_batch_pages), as far as admission admits
  // its pages (the rest counted as refused). With an empty backlog, at most the room left in the
  // bounded queue (max_backup_queue_pages) is queued: the rest of the path follows when those
  // pages are stored. Otherwise the store (at most max_backup_queue_pages pages) waits in the
  // backlog, if MakeRoom takes it (counted as backlog drops: it, or the stores it displaced).
  // False when nothing was queued or backlogged: nothing to store, nothing admitted, the queue is
  // full without a backlog (counted as queue_full), the backlog kept better stores, a node on the
  // path is busy, or an ancestor is being stored (the path is stored when that store completes,
  // under a policy that stores on backup).
  // `deferred` (optional): set when nothing was queued because the path waits for a store or a
  // copy in flight.
  // `refused_pages` (optional; host eviction): the pages admission refused (the path's last ones)
  // are reported there instead of counted, for a caller that counts only those it drops: the
  // path's other pages stay in host memory and are offered again, so counting the whole path at
  // each eviction pass would count a page once per pass.
  bool Store(RadixNode* node, CacheWork* work, bool* deferred = nullptr,
             int64_t* refused_pages = nullptr) override KVTIER_REQUIRES(kCacheLock);
  // Pages the bounded store queue (max_backup_queue_pages) takes now; <= 0: it is full.
  int64_t StoreQueueRoom() const override KVTIER_REQUIRES(kCacheLock) {
    return core_.config.storage.max_backup_queue_pages - store_queue_pages_;
  }

  // Completions. A backup publishes its host pages (and, under a policy that stores on backup,
  // starts the store), or a failed one takes them back, deepest first. A store marks stored the
  // nodes (or the leading part of a node) whose pages all made it.
  void ReapBackup(CopyOp& op, CacheWork* work) KVTIER_REQUIRES(kCacheLock);
  void ReapStore(CopyOp& op, CacheWork* work) KVTIER_REQUIRES(kCacheLock);
  // Stores the host-resident, unstored descendants of `node` (what waited for its store).
  void StoreBelow(RadixNode* node, CacheWork* work) KVTIER_REQUIRES(kCacheLock);

  // ---- ordering of storage writes (the removals in flight) -----------------------------------
  // Queues the removal of `keys` from storage (batches of the backend's max_batch_pages), run
  // with `work`: pages no lookup can use (corrupt ones, and pages stored past a page whose write
  // failed, which a lookup never reaches). The callers remove keys of nodes neither stored nor
  // storing, so no registered store names one of them (the tree gives a key one node, and a node
  // one store at a time); CheckCacheConsistency checks it.
  void RemoveFromStorage(std::span<const PageKey> keys, CacheWork* work)
      KVTIER_REQUIRES(kCacheLock);
  // Whether one of `keys` has a removal in flight.
  bool RemovalPending(std::span<const PageKey> keys) const KVTIER_REQUIRES(kCacheLock);
  // A registered store (REQUIRES: tracker.Add'ed): queued with `work`, or held back (`held`)
  // while one of its keys has a removal in flight; ReapRemove queues it when none has.
  void SubmitStore(std::shared_ptr<CopyOp> op, CacheWork* work) KVTIER_REQUIRES(kCacheLock);
  // A completed removal: its keys are no longer pending, and the held stores none of whose keys
  // is pending now are queued with `work`, in the order they were registered.
  void ReapRemove(const CopyOp& op, CacheWork* work) KVTIER_REQUIRES(kCacheLock);
  // The keys with a removal in flight, each with the number of removals naming it.
  const std::unordered_map<PageKey, int64_t, PageKeyHash>& removing() const
      KVTIER_REQUIRES(kCacheLock) {
    return removing_;
  }
  // Removals reaped so far (QueryStorage trusts no Exists answer across a change of it).
  int64_t removals_reaped() const KVTIER_REQUIRES(kCacheLock) { return removals_reaped_; }

 private:
  // The unbacked path ending at `node`, top-down, and its tokens (0: empty, or a node on it is
  // busy or off the device).
  int64_t UnbackedPath(RadixNode* node, std::vector<RadixNode*>* path) const
      KVTIER_REQUIRES(kCacheLock);
  // The keys of `path`'s first `pages` pages to config.storage.admitted_listener.
  void ReportAdmitted(const std::vector<RadixNode*>& path, int64_t pages) const
      KVTIER_REQUIRES(kCacheLock);
  // The store op of `path` (`pages` pages), registered; its nodes marked storing.
  std::shared_ptr<CopyOp> MakeStore(const std::vector<RadixNode*>& path, int64_t pages)
      KVTIER_REQUIRES(kCacheLock);
  // Queues the backlog's likeliest stores while the store's queue has room for them.
  void SubmitFromBacklog(CacheWork* work) KVTIER_REQUIRES(kCacheLock);
  // Cuts `path` after its first `keep` pages (splitting the node where they end).
  void EndPathAt(std::vector<RadixNode*>* path, int64_t keep) KVTIER_REQUIRES(kCacheLock);
  // The copy of `path` into `host_pages` (the kWrite pages of `got` only: `written`); the nodes
  // take their host pages now.
  std::shared_ptr<CopyOp> MakeBackup(const std::vector<RadixNode*>& path,
                                     const std::vector<HostTier::Page>& got,
                                     const std::vector<int64_t>& host_pages,
                                     const std::vector<int64_t>& written, bool write_back)
      KVTIER_REQUIRES(kCacheLock);

  CacheCore& core_;
  TierEvictor& evictor_;
  std::unique_ptr<BackupPolicy> policy_;
  std::unique_ptr<StoreAdmission> admission_ KVTIER_PT_GUARDED_BY(kCacheLock);
  StoreBacklog backlog_ KVTIER_GUARDED_BY(kCacheLock);
  // Host -> storage pages queued or running (the bounded queue: StoreQueueRoom).
  int64_t store_queue_pages_ KVTIER_GUARDED_BY(kCacheLock) = 0;
  // Keys with a removal from storage in flight (RemoveFromStorage until ReapRemove), each with the
  // number of removals naming it. A store naming one is held back until none does: the removal
  // and the store are submitted after the lock by whichever calls queued them (in any order across
  // threads), and storage orders no two writes of one key, so a Remove landing after the store's
  // Set (or after its Exists found the page present) would leave the tree marking stored a page
  // the store no longer holds.
  std::unordered_map<PageKey, int64_t, PageKeyHash> removing_ KVTIER_GUARDED_BY(kCacheLock);
  // Removals reaped so far: an Exists that ran while one was in flight may have seen its pages
  // before they went.
  int64_t removals_reaped_ KVTIER_GUARDED_BY(kCacheLock) = 0;
};

}  // namespace kvtier
