// Internal: the cache's pins (HierarchicalCache::Pin / Unpin, "Retention" in
// kvtier/hierarchical_cache.h) — each live pin's node and tiers, its deadline, the budget of each
// tier, and the lazy release of expired pins.
//
// A pin retains its node and every ancestor in its tiers (RadixTree::Retain): while it lives,
// those nodes are evictable from none of its tiers and stay in the tree, so its node pointer stays
// valid (a split keeps the lower node's identity and gives the upper one the same counts).
// Invariants (CheckConsistency): every node's retention count in a tier is the number of live pins
// of that tier on it or a descendant; the tree's retained_tokens(t) is at most tier t's budget;
// `deadlines_` holds exactly (deadline, id) of the live pins with a TTL.
//
// Thread safety: every method REQUIRES the cache's mutex (cache/cache_core.h).
#pragma once

#include <cstdint>
#include <optional>
#include <set>
#include <unordered_map>
#include <utility>
#include <vector>

#include "cache/cache_core.h"

namespace kvtier {

class PinTable {
 public:
  explicit PinTable(CacheCore& core) : core_(core) {}
  PinTable(const PinTable&) = delete;
  PinTable& operator=(const PinTable&) = delete;

  // The clock TTLs run on (config.pin_clock, or steady_clock). No lock needed.
  CacheClock::time_point Now() const;

  // Pins `last` (not a root) and its ancestors in `tiers` (RadixTree::TierBit) for `ttl_seconds`
  // (> 0; infinite: until Unpin); returns the pin's id. InvalidArgument naming the tier when its
  // budget would be exceeded (nothing changes; counted in pins_refused).
  Result<PinHandle> Add(RadixNode* last, uint8_t tiers, double ttl_seconds)
      KVTIER_REQUIRES(kCacheLock);
  // Ends a live pin; returns the store's pin of its keys, if it has one (the caller unpins it
  // after releasing the lock). InvalidArgument for an unknown, ended or foreign pin.
  Result<std::optional<uint64_t>> Remove(PinHandle pin) KVTIER_REQUIRES(kCacheLock);
  // Records the store's pin of a live pin's keys; false when the pin has ended meanwhile (the
  // caller unpins the store's).
  bool SetStorePin(PinHandle pin, uint64_t store_pin) KVTIER_REQUIRES(kCacheLock);
  // Ends the pins whose deadline has passed: one comparison when none has. Their store pins
  // expire in the store by their own TTL.
  void Expire() KVTIER_REQUIRES(kCacheLock);
  // Ends every pin; returns the store pins to unpin (the cache is closing).
  std::vector<uint64_t> Clear() KVTIER_REQUIRES(kCacheLock);

  int64_t size() const KVTIER_REQUIRES(kCacheLock) { return static_cast<int64_t>(pins_.size()); }
  // The invariants above; Internal naming the first that does not hold.
  Status CheckConsistency() const KVTIER_REQUIRES(kCacheLock);

 private:
  struct Pin {
    RadixNode* last;
    uint8_t tiers;
    bool forever;
    CacheClock::time_point deadline;
    std::optional<uint64_t> store_pin;
  };
  void Drop(std::unordered_map<uint64_t, Pin>::iterator it) KVTIER_REQUIRES(kCacheLock);

  CacheCore& core_;
  uint64_t next_seq_ KVTIER_GUARDED_BY(kCacheLock) = 1;
  std::unordered_map<uint64_t, Pin> pins_ KVTIER_GUARDED_BY(kCacheLock);
  std::set<std::pair<CacheClock::time_point, uint64_t>> deadlines_ KVTIER_GUARDED_BY(kCacheLock);
};

}  // namespace kvtier
