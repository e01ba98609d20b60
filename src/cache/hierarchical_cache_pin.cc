// HierarchicalCache::Pin and Unpin (kvtier/hierarchical_cache.h): retention of cached prefixes
// in named tiers, recorded in the cache's PinTable (cache/pin_table.h) and, for storage, in the
// store's own pins (StorageBackend::PinPages).
#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <optional>
#include <vector>

#include "cache/hierarchical_cache_impl.h"
#include "kvtier/hierarchical_cache.h"

namespace kvtier {

Result<PinResult> HierarchicalCache::Pin(std::span<const Token> tokens,
                                         std::span<const CacheTier> tiers, double ttl_seconds,
                                         std::string_view ns) {
  Impl& s = *impl_;
  uint8_t mask = 0;
  for (CacheTier t : tiers) {
    if (static_cast<uint8_t>(t) > 2 ||
        (mask & RadixTree::TierBit(static_cast<RadixTree::Tier>(t))) != 0) {
      return Status::InvalidArgument("Pin: tiers must name device, host or storage, each once");
    }
    const uint8_t bit = RadixTree::TierBit(static_cast<RadixTree::Tier>(t));
    if ((t == CacheTier::kHost && !s.host) || (t == CacheTier::kStorage && !s.storage)) {
      return Status::InvalidArgument(
          fmt::format("Pin: the cache has no {} tier to pin in", CacheTierName(t)));
    }
    mask |= bit;
  }
  if (mask == 0) return Status::InvalidArgument("Pin: tiers is empty (name the tiers to pin in)");
  if (!(ttl_seconds > 0)) {
    return Status::InvalidArgument(fmt::format(
        "Pin: ttl_seconds = {} must be positive (kPinForever: until Unpin)", ttl_seconds));
  }
  CacheWork work(&s.executor);
  PinResult out;
  std::vector<PageKey> keys;  // for the store's pin
  {
    CacheLock lk(s);
    KVTIER_RETURN_IF_ERROR(s.CheckHealth());
    s.Reap(&work);
    RadixTree::MatchResult r = s.tree.Match(ns, tokens);
    if (r.last->is_root()) return out;  // nothing cached
    KVTIER_ASSIGN_OR_RETURN(out.pin, s.pins.Add(r.last, mask, ttl_seconds));
    out.pinned_tokens = r.matched_tokens;
    if ((mask & RadixTree::TierBit(RadixTree::Tier::kStorage)) != 0) {
      for (RadixNode* n : CacheCore::Path(r.last)) {
        keys.insert(keys.end(), n->keys().begin(), n->keys().end());
      }
    }
  }
  s.executor.Run(work);
  if (keys.empty()) return out;
  // The store's pin, outside the lock; with the same TTL (its own clock ends it).
  const auto ttl = std::isfinite(ttl_seconds) && ttl_seconds < 1e9
                       ? std::chrono::duration_cast<std::chrono::nanoseconds>(
                             std::chrono::duration<double>(ttl_seconds))
                       : std::chrono::nanoseconds::max();
  Result<uint64_t> store_pin = s.storage->PinPages(keys, ttl);
  if (!store_pin.ok()) return out;  // the backend cannot (Redis): store_pinned stays false
  bool recorded;
  {
    CacheLock lk(s);
    recorded = s.pins.SetStorePin(out.pin, *store_pin);
  }
  if (!recorded) (void)s.storage->UnpinPages(*store_pin);  // unpinned meanwhile
  out.store_pinned = recorded;
  return out;
}

Status HierarchicalCache::Unpin(PinHandle pin) {
  Impl& s = *impl_;
  CacheWork work(&s.executor);
  std::optional<uint64_t> store_pin;
  {
    CacheLock lk(s);
    s.Reap(&work);
    KVTIER_ASSIGN_OR_RETURN(store_pin, s.pins.Remove(pin));
    s.evictor.TrimStorage(&work);  // storage-only pages it kept may be beyond the bound now
  }
  s.executor.Run(work);
  if (store_pin) (void)s.storage->UnpinPages(*store_pin);  // or expired in the store already
  return Status::OK();
}

}  // namespace kvtier
