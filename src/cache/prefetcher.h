// Internal: the part of a HierarchicalCache that reads a match's storage part into host memory —
// the prefetch state machine. Start: the storage-only nodes after the handle's host part get host
// pages (as many as the prefetch share of host memory and eviction allow) and are marked
// prefetching and busy; the pages are read in batches by the CopyExecutor. Progress: how much
// arrived. Conclude (FinishPrefetch, Release, the destructor): the arrived prefix becomes host
// pages of its nodes; pages storage reported absent or corrupt make their nodes (and storage-only
// descendants) lose their storage mark, and corrupt ones are removed from storage (so the next
// store writes them again); the rest is cancelled (pages of batches still running are
// freed when they complete, by ReapPrefetch). HandOverArrived (a streamed LoadBack, before
// Conclude): the prefix that arrived so far becomes host pages of its nodes early, so the load can
// copy it while the rest is read; Conclude then hands over the pages after it.
//
// Thread safety: every method REQUIRES the cache's mutex (cache/cache_core.h); nothing here waits
// or reads storage.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "cache/cache_core.h"

namespace kvtier {

class BackupPlanner;
class TierEvictor;

class Prefetcher {
 public:
  // `planner` queues the removal of the corrupt pages a prefetch found.
  Prefetcher(CacheCore& core, TierEvictor& evictor, BackupPlanner& planner)
      : core_(core), evictor_(evictor), planner_(planner) {}
  Prefetcher(const Prefetcher&) = delete;
  Prefetcher& operator=(const Prefetcher&) = delete;

  // Starts the prefetch of `h`'s storage part under `policy` (the storage reads go to `work`).
  // kRunning when started; otherwise nothing was started (no storage part, below the threshold,
  // no room: counted). Errors only from the host tier. REQUIRES: no prefetch running on `h`.
  Result<PrefetchResult> Start(HandleState& h, PrefetchPolicy policy, CacheWork* work)
      KVTIER_REQUIRES(kCacheLock);
  // The running prefetch's progress (arrived pages over completed batches), or the host part.
  PrefetchResult Progress(HandleState& h) KVTIER_REQUIRES(kCacheLock);
  // Ends `h`'s prefetch (see above). REQUIRES: h.prefetch.
  PrefetchResult Conclude(HandleState& h, bool cancelled, CacheWork* work)
      KVTIER_REQUIRES(kCacheLock);
  // A streamed LoadBack: hands the first `arrived` pages of `h`'s running prefetch (REQUIRES:
  // they arrived, CopyTracker::ArrivedPages), less those handed over before, to the tree — host
  // pages of its nodes (split where the prefix ends inside one), which
  // are no longer busy or prefetching, so the load can take them while the rest is still read.
  // Stops before a node that cannot take host pages now (Conclude deals with it). Returns the
  // pages handed over. REQUIRES: h.prefetch.
  int64_t HandOverArrived(HandleState& h, int64_t arrived) KVTIER_REQUIRES(kCacheLock);
  // A completed prefetch: an unconcluded one goes back to the tracker for its handle; a concluded
  // one frees the pages it still held.
  void ReapPrefetch(const std::shared_ptr<CopyOp>& op) KVTIER_REQUIRES(kCacheLock);

  // Host pages of prefetches not yet handed to the tree (the host tier's "filling" pages).
  int64_t filling_pages() const KVTIER_REQUIRES(kCacheLock) { return filling_pages_; }
  // Tokens of `h`'s match in host memory after its device part.
  int64_t HostTokensOf(const HandleState& h) const KVTIER_REQUIRES(kCacheLock);
  // The node and its storage-only descendants lose their storage copy (storage reported it
  // gone): orphans, removed once unpinned.
  void MarkGone(RadixNode* node) KVTIER_REQUIRES(kCacheLock);

 private:
  // A prefetch's page outcomes at one moment.
  struct Snapshot {
    std::vector<PageStatus> statuses;
    std::vector<uint8_t> batches;
    Status status;
    int64_t batch_pages = 1;
    int64_t total = 0;
    int64_t arrived = 0;     // leading pages that arrived (kOk, in completed batches)
    int64_t gone_from = -1;  // the first page storage reported absent or corrupt; -1: none
    bool BatchDone(int64_t page) const {
      return batches[static_cast<size_t>(page / batch_pages)] != 0;
    }
  };

  // The storage-only nodes after the host part that storage holds and nobody fills yet.
  int64_t StoragePart(const HandleState& h, std::vector<RadixNode*>* part) const
      KVTIER_REQUIRES(kCacheLock);
  // Host pages for a prefetch of `tokens` (the prefetch share of host memory, evicting for room).
  int64_t HostPagesFor(int64_t tokens, CacheWork* work) KVTIER_REQUIRES(kCacheLock);
  // `streamed`: a LoadBack will stream it (StorageTierConfig::stream_load_back), so it is read
  // in smaller batches.
  std::shared_ptr<CopyOp> MakePrefetch(const std::vector<RadixNode*>& part,
                                       std::vector<int64_t> host_pages, bool streamed)
      KVTIER_REQUIRES(kCacheLock);
  Snapshot TakeSnapshot(CopyOp& op) KVTIER_REQUIRES(kCacheLock);
  // Hands the arrived pages after those handed over already (HandOverArrived) to their nodes
  // (clearing the busy and prefetching marks); returns the pages used. Pages that found no node go
  // to `to_free`.
  int64_t HandOver(CopyOp& op, Snapshot& s, std::vector<int64_t>* to_free)
      KVTIER_REQUIRES(kCacheLock);
  // Pages not handed over (after op.handed_pages + used): freed now when their batch completed,
  // else on completion.
  void ReleaseUnused(CopyOp& op, const Snapshot& s, int64_t used, std::vector<int64_t> to_free)
      KVTIER_REQUIRES(kCacheLock);
  // Pages read corrupt (not absent, not another deployment's) are removed from storage, so that
  // the next store of the prefix writes them again instead of finding them present (the tree
  // forgot them already: MarkGone).
  void RemoveCorrupt(const CopyOp& op, const Snapshot& s, CacheWork* work)
      KVTIER_REQUIRES(kCacheLock);
  PrefetchState CountConclusion(const CopyOp& op, const Snapshot& s, int64_t used,
                                PrefetchPolicy policy, bool cancelled) KVTIER_REQUIRES(kCacheLock);

  CacheCore& core_;
  TierEvictor& evictor_;
  BackupPlanner& planner_;
  // Host pages of prefetches not yet handed to the tree (HostTier: held by a prefetch, "filling").
  int64_t filling_pages_ KVTIER_GUARDED_BY(kCacheLock) = 0;
};

}  // namespace kvtier
