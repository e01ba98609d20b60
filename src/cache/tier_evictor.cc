// The tier evictor (see cache/tier_evictor.h).
#include "cache/tier_evictor.h"

#include <fmt/format.h>

#include <algorithm>

namespace kvtier {

void TierEvictor::DropIfNowhere(RadixNode* node) {
  if (node->resident() || node->ref_count() > 0 || node->busy() > 0 || node->retained_anywhere()) {
    return;
  }
  int64_t forgotten = 0;
  core_.tree.RemoveSubtree(node, &forgotten);
  core_.counters.storage_forgotten_tokens += forgotten;
}

int64_t TierEvictor::EvictDevice(int64_t need, CacheWork* work) {
  const auto start = CacheClock::now();
  int64_t freed = 0;
  std::vector<int64_t> frees;  // one ledger call per eviction; no regrowth while it fills
  frees.reserve(static_cast<size_t>(std::clamp<int64_t>(need, 0, core_.ledger->num_pages())));
  while (freed < need && core_.health.ok()) {
    RadixNode* v = core_.tree.DeviceVictim();
    if (v == nullptr) break;
    core_.tree.PrefetchDeviceVictims();
    const int64_t pages = v->num_tokens() / core_.P;
    const int64_t take = std::min(pages, need - freed);
    if (!v->on_host() && planner_.policy().back_up_on_eviction()) {
      // The whole unbacked path goes to host memory first (host copies form a prefix).
      if (planner_.Backup(v, work, /*write_back=*/true)) continue;  // v is busy now
    }
    v = core_.tree.SplitAfter(v, pages - take);
    const int64_t n = v->num_tokens();
    const bool kept_in_host = v->on_host();
    core_.Event(work, CacheTier::kDevice, v, kept_in_host, false);
    if (!kept_in_host) {
      core_.counters.dropped_tokens += n;
      // Never copied because the write policy did not ask for it: a policy skip on the way to
      // storage (write_through_selective below its threshold). Other drops follow a backup that
      // was skipped or failed, counted as such when it was.
      if (core_.storage && !planner_.policy().back_up_on_eviction() &&
          !planner_.policy().BackUpOnUse(*v)) {
        core_.counters.storage_backup_policy_tokens += n;
      }
      if (!core_.tree.DropDeviceLeaf(v, &frees)) {  // the common case in one step
        core_.tree.TakeDevicePages(v, &frees);
        DropIfNowhere(v);
      }
    } else {
      core_.tree.TakeDevicePages(v, &frees);
    }
    freed += take;
    core_.counters.device_evicted_tokens += n;
    ++core_.counters.device_evictions;
  }
  core_.FreeDevice(frees);
  CountEviction(start, freed);
  return freed;
}

int64_t TierEvictor::EvictHost(int64_t need, CacheWork* work) {
  if (!core_.host) return 0;
  const auto start = CacheClock::now();
  int64_t freed = 0;
  while (freed < need && core_.health.ok()) {
    RadixNode* v = core_.tree.HostVictim();
    if (v == nullptr) break;
    const int64_t pages = v->num_tokens() / core_.P;
    const int64_t take = std::min(pages, need - freed);
    int64_t refused_pages = 0;  // of the unstored path ending at v, by admission
    if (!v->stored() && core_.storage && !planner_.policy().store_on_backup() && !v->storing()) {
      // write_back: host memory holds the victim's only copy below the device. With the store
      // queue full it stays there, and eviction stops until stores in flight land and make room
      // (a Store refused here would count it queue_full and this loop would then drop it: pages
      // lost whenever the queue filled mid-eviction).
      if (planner_.StoreQueueRoom() <= 0) break;
      bool deferred = false;
      // v is busy now; evictable once stored.
      if (planner_.Store(v, work, &deferred, &refused_pages)) continue;
      // Its path waits for a store or a copy in flight: evicting it now would lose it.
      if (deferred) break;
    }
    v = core_.tree.SplitAfter(v, pages - take);
    const int64_t n = v->num_tokens();
    const bool kept = v->stored();
    // Refused: the path's last pages, which end at v's; counted as they leave (the rest of the
    // path stays, and is counted when it goes).
    core_.counters.storage_backup_refused_tokens += std::min(n, refused_pages * core_.P);
    core_.Event(work, CacheTier::kHost, v, false, kept);
    core_.FreeHost(core_.tree.TakeHostPages(v));
    DropIfNowhere(v);
    freed += take;
    core_.counters.host_evicted_tokens += n;
    ++core_.counters.host_evictions;
  }
  CountEviction(start, freed);
  return freed;
}

void TierEvictor::CountEviction(CacheClock::time_point start, int64_t freed_pages) {
  const double seconds = SecondsSince(start);
  core_.counters.eviction_seconds += seconds;
  if (freed_pages > 0) core_.counters.eviction_duration.Observe(seconds);
}

void TierEvictor::TrimStorage(CacheWork* work) {
  const int64_t limit = core_.config.storage.max_storage_only_pages * core_.P;
  for (;;) {
    RadixNode* v = core_.tree.StorageVictim();
    if (v == nullptr) return;
    if (v->stored() && core_.tree.storage_only_tokens() <= limit) return;
    if (v->stored()) core_.Event(work, CacheTier::kStorage, v, false, false);
    int64_t forgotten = 0;
    core_.tree.RemoveSubtree(v, &forgotten);
    core_.counters.storage_forgotten_tokens += forgotten;
  }
}

int64_t TierEvictor::HostReclaimable() const {
  return core_.host->free_pages() +
         (core_.tree.host_tokens() - core_.tree.locked_host_tokens()) / core_.P;
}

int64_t TierEvictor::DeviceReclaimable() const {
  return core_.ledger->free_pages() +
         (core_.tree.device_tokens() - core_.tree.held_device_tokens()) / core_.P;
}

bool TierEvictor::EnsureHostPages(int64_t pages, CacheWork* work) {
  const int64_t free = core_.host->free_pages();
  if (free >= pages) return true;
  if (HostReclaimable() < pages) return false;
  EvictHost(pages - free, work);
  return core_.host->free_pages() >= pages;
}

Result<std::vector<int64_t>> TierEvictor::TryAllocateDevice(
    int64_t pages, bool allow_fewer, DevicePageLedger::Owner owner, std::string_view what,
    CacheWork* work, std::vector<std::shared_ptr<CopyOp>>* waits) {
  const int64_t free = core_.ledger->free_pages();
  if (free < pages) {
    if (!allow_fewer && DeviceReclaimable() < pages) {
      return Status::OutOfMemory(fmt::format(
          "{}: the device cannot make room ({} pages free, {} held by the engine, {} pinned by "
          "live handles, {} by Pin, {} needed)",
          what, free, core_.ledger->pages_of(DevicePageLedger::kEngine),
          core_.tree.pinned_device_tokens() / core_.P,
          (core_.tree.held_device_tokens() - core_.tree.pinned_device_tokens()) / core_.P, pages));
    }
    EvictDevice(pages - free, work);
  }
  KVTIER_RETURN_IF_ERROR(core_.CheckHealth());
  if (core_.ledger->free_pages() >= pages) return core_.ledger->Allocate(pages, owner);
  for (const auto& op : core_.tracker.ops()) {
    if (op->kind == CopyOp::Kind::kBackup || op->kind == CopyOp::Kind::kLoad) {
      waits->push_back(op);
    }
  }
  if (allow_fewer && waits->empty())
    return core_.ledger->Allocate(core_.ledger->free_pages(), owner);
  return Status::OutOfMemory(
      fmt::format("{}: the device cannot make room ({} pages free after eviction, {} needed)", what,
                  core_.ledger->free_pages(), pages));
}

}  // namespace kvtier
