// The cache's parts wired together (see cache/cache_parts.h).
#include "cache/cache_parts.h"

#include <algorithm>

namespace kvtier {

CacheParts::CacheParts(const HierarchicalCacheConfig& cfg, int64_t page_size)
    : CacheCore(cfg, page_size),
      executor(*this, [this](CacheWork* work) KVTIER_REQUIRES(kCacheLock) { Reap(work); }),
      evictor(*this, planner),
      planner(*this, evictor),
      prefetcher(*this, evictor),
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
  // The tree calls its hooks from its own calls, which are made under the lock.
  tree.SetSplitHook([this](RadixNode* upper, RadixNode* lower)
                        KVTIER_REQUIRES(kCacheLock) { OnSplit(upper, lower); });
  if (config.kv_event_sink) {
    std::string medium = config.kv_event_storage_medium;
    if (medium.empty() && storage) medium = StorageMediumOf(storage->url());
    events = std::make_unique<KvEventEmitter>(config.kv_event_sink, P, std::move(medium));
    tree.SetTierHook(
        [emitter = events.get()](const RadixNode& node, RadixTree::Tier tier, bool entered) {
          emitter->OnTierChange(node, tier, entered);
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
        ReapRemove(*op, work);
        break;
    }
  });
}

void CacheParts::OnSplit(RadixNode* upper, RadixNode* lower) {
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
