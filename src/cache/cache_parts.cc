// The cache's parts wired together (see cache/cache_parts.h).
#include "cache/cache_parts.h"

#include <algorithm>
#include <unordered_map>
#include <vector>

#include "util/log.h"

namespace kvtier {

CacheParts::CacheParts(const HierarchicalCacheConfig& cfg, int64_t page_size)
    : CacheCore(cfg, page_size),
      executor(*this, [this](CacheWork* work) KVTIER_REQUIRES(kCacheLock) { Reap(work); }),
      planner(*this, evictor),
      evictor(*this, planner),
      prefetcher(*this, evictor, planner),
      adopter(*this, evictor),
      pins(*this) {}

CacheParts::~CacheParts() { Close(); }

Status CacheParts::Open(const KvRegion& device_region, std::unique_ptr<TransferEngine> transfer) {
  device = device_region;
  engine = std::move(transfer);
  gpu = engine->backend() != TransferBackend::kCpu;
  KVTIER_RETURN_IF_ERROR(OpenHostTier(device_region));
  const KvGeometry& g = device_region.geometry;
  KVTIER_ASSIGN_OR_RETURN(ledger, DevicePageLedger::Create(g.num_slots, g.page_size));
  open_ = true;  // from here on, Close has something to stop
  KVTIER_RETURN_IF_ERROR(executor.Start());
  KVTIER_RETURN_IF_ERROR(OpenStorageTier(device_region));
  CacheLock lk(*this);
  planner.SizeBacklog();  // against the host tier just opened
  // The tree calls its hooks from its own calls, which are made under the lock.
  tree.SetSplitHook([this](RadixNode* upper, RadixNode* lower)
                        KVTIER_REQUIRES(kCacheLock) { OnSplit(upper, lower); });
  if (config.kv_event_sink) {
    std::string medium = config.kv_event_storage_medium;
    if (medium.empty() && storage) medium = StorageMediumOf(storage->url());
    events = std::make_unique<KvEventEmitter>(config.kv_event_sink, P, std::move(medium));
    if (storage) {
      // Pages the store evicts by itself are published as removed too (ForgetStoreEvictions).
      stored_keys = std::make_unique<StoredKeyIndex>();
      storage->TrackEvictions(true);
    }
    tree.SetTierHook([emitter = events.get(), index = stored_keys.get()](
                         const RadixNode& node, RadixTree::Tier tier, bool entered) {
      emitter->OnTierChange(node, tier, entered);
      if (index != nullptr && tier == RadixTree::Tier::kStorage) index->OnStorage(node, entered);
    });
  }
  return Status::OK();
}

void CacheParts::Close() {
  if (!open_) return;
  open_ = false;
  std::vector<uint64_t> store_pins;
  {
    CacheWork work(&executor);
    CacheLock lk(*this);
    store_pins = pins.Clear();  // a shared backend outlives the cache: its pins go now
    for (auto& [id, h] : handles) {
      if (h.prefetch) prefetcher.Conclude(h, /*cancelled=*/true, &work);
    }
    // Prefetches still receiving pages must finish before their buffers go.
    for (;;) {
      Drain(lk, &work, /*backups_only=*/false);
      if (tracker.ops().empty()) break;
    }
  }
  executor.Stop();
  for (uint64_t pin : store_pins) (void)storage->UnpinPages(pin);  // or expired already
  if (stored_keys) storage->TrackEvictions(false);  // a shared backend outlives the cache
  if (owns_storage && storage) storage->Close();
}

void CacheParts::Reap(CacheWork* work) {
  pins.Expire();
  if (gpu) ledger->PruneWriteFences();
  tracker.Reap([&](const std::shared_ptr<CopyOp>& op) KVTIER_REQUIRES(kCacheLock) {
    switch (op->kind) {
      case CopyOp::Kind::kBackup:
        planner.ReapBackup(*op, work);
        break;
      case CopyOp::Kind::kLoad:
        executor.ReapLoad(*op);
        break;
      case CopyOp::Kind::kPrefetch:
        prefetcher.ReapPrefetch(op);
        break;
      case CopyOp::Kind::kStore:
        planner.ReapStore(*op, work);
        break;
      case CopyOp::Kind::kRemove:  // the tree forgot the pages already; held stores may go
        planner.ReapRemove(*op, work);
        break;
    }
  });
  ForgetStoreEvictions();  // after the stores just reaped: their nodes are no longer storing
}

void CacheParts::ForgetStoreEvictions() {
  if (!stored_keys) return;
  int64_t dropped = 0;
  std::vector<PageKey> evicted = storage->TakeEvictions(&dropped);
  if (!deferred_evictions.empty()) {
    evicted.insert(evicted.begin(), deferred_evictions.begin(), deferred_evictions.end());
    deferred_evictions.clear();
  }
  if (dropped > 0) {
    util::Log(util::LogLevel::kWarning,
              "cache: the store evicted {} more pages than it keeps track of between two looks; "
              "their removal is published when a lookup or a read misses them",
              dropped);
  }
  if (evicted.empty()) return;
  // Per stored node, its first page the store evicted: from there on the node's pages are no
  // longer reachable in storage (eviction takes a chain's tail first), nor its storage-only
  // descendants' (their prefix is gone).
  std::unordered_map<RadixNode*, int64_t> first;
  std::unordered_map<RadixNode*, std::vector<PageKey>> keys_of;  // to defer a busy node's
  for (const PageKey& key : evicted) {
    int64_t page = 0;
    if (RadixNode* n = stored_keys->Find(key, &page)) {
      auto [it, added] = first.try_emplace(n, page);
      if (!added) it->second = std::min(it->second, page);
      keys_of[n].push_back(key);
    }
  }
  std::vector<RadixNode*> order;
  for (const auto& [n, page] : first) order.push_back(n);
  SortTopDown(&order);           // a node marked gone with its parent is skipped below (not stored)
  std::vector<RadixNode*> gone;  // top-down, each subtree's nodes after its root
  for (RadixNode* n : order) {
    if (!n->stored()) continue;  // marked gone with its parent
    if (n->prefetching() || n->storing() || n->busy() > 0) {
      // In use by an operation (its pages being read, written or copied): looked at again at
      // the next reaping, when it may be done.
      if (deferred_evictions.size() < StorageBackend::kMaxTrackedEvictions) {
        const auto& keys = keys_of[n];
        deferred_evictions.insert(deferred_evictions.end(), keys.begin(), keys.end());
      }
      continue;
    }
    const int64_t page = first[n];
    if (page > 0) tree.SplitAfter(n, page);  // n keeps its identity as the lower part
    std::vector<RadixNode*> stack = {n};
    while (!stack.empty()) {
      RadixNode* g = stack.back();
      stack.pop_back();
      gone.push_back(g);
      tree.SetStored(g, false);  // the tier hook publishes the removal
      counters.storage_evicted_by_store_tokens += g->num_tokens();
      g->ForEachChild([&](RadixNode* c) {
        if (c->storage_only() && !c->prefetching() && !c->storing() && c->busy() == 0) {
          stack.push_back(c);
        }
      });
    }
  }
  // Children before parents: a node now resident nowhere, unused and without children goes.
  for (auto it = gone.rbegin(); it != gone.rend(); ++it) {
    bool leaf = true;
    (*it)->ForEachChild([&](RadixNode*) { leaf = false; });
    if (leaf) evictor.DropIfNowhere(*it);
  }
}

void CacheParts::OnSplit(RadixNode* upper, RadixNode* lower) {
  if (stored_keys) stored_keys->OnSplit(upper);
  if (lower->busy() == 0 && !lower->storing()) return;
  tracker.ForEachOp([&](const std::shared_ptr<CopyOp>& op) {
    if (std::find(op->nodes.begin(), op->nodes.end(), lower) != op->nodes.end()) {
      op->nodes.push_back(upper);
    }
  });
  for (auto& [id, h] : handles) {
    const auto& op = h.prefetch;
    if (op && std::find(op->nodes.begin(), op->nodes.end(), lower) != op->nodes.end() &&
        std::find(op->nodes.begin(), op->nodes.end(), upper) == op->nodes.end()) {
      op->nodes.push_back(upper);
    }
  }
}

void CacheParts::Drain(CacheLock& lk, CacheWork* work, bool backups_only) {
  for (;;) {
    Reap(work);
    std::vector<std::shared_ptr<CopyOp>> waits;
    for (const auto& op : tracker.ops()) {
      if (op->kind == CopyOp::Kind::kPrefetch && !op->concluded) continue;  // its handle's
      if (op->held) continue;  // submitted when the removal it waits for (waited here) is reaped
      if (op->backlogged) continue;  // submitted as the stores in the queue (waited here) land
      if (backups_only && op->kind != CopyOp::Kind::kBackup && op->kind != CopyOp::Kind::kStore &&
          op->kind != CopyOp::Kind::kRemove) {
        continue;
      }
      waits.push_back(op);
    }
    if (waits.empty() && work->empty()) return;
    lk.Release();
    executor.Run(*work);
    for (auto& op : waits) tracker.Wait(*op);
    lk.Reacquire();
  }
}

}  // namespace kvtier
