// Internal: the pages a store must not evict (StorageBackend::PinPages) — pins of page keys, each
// with a TTL, counted per key (a key stays pinned while any live pin names it). A key may be
// pinned before it is stored: the store checks Pinned when it chooses a victim, so a page stored
// later is protected too. Expired pins are dropped lazily, by the next call (no thread, no timer).
//
// Thread safety: every method may be called from any thread (one mutex, a leaf: nothing is
// called while it is held), e.g. from a store's eviction under the store's own lock.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <set>
#include <span>
#include <unordered_map>
#include <utility>
#include <vector>

#include "kvtier/page_key.h"
#include "util/mutex.h"
#include "util/thread_annotations.h"

namespace kvtier::storage {

class PagePins {
 public:
  using Clock = std::chrono::steady_clock;
  // `now`: the clock TTLs run on (null: steady_clock::now; tests inject one).
  explicit PagePins(std::function<Clock::time_point()> now = nullptr) : now_(std::move(now)) {}

  // Pins `keys` for `ttl` (nanoseconds::max(): until Remove); returns the pin's id (never 0).
  // REQUIRES: ttl > 0.
  uint64_t Add(std::span<const PageKey> keys, std::chrono::nanoseconds ttl) KVTIER_EXCLUDES(mu_);
  // Ends a pin; false when `id` is unknown or expired already.
  bool Remove(uint64_t id) KVTIER_EXCLUDES(mu_);
  // Whether a live pin names `key` (expired pins are dropped first).
  bool Pinned(const PageKey& key) KVTIER_EXCLUDES(mu_);
  // Distinct keys pinned by live pins.
  int64_t pinned_keys() KVTIER_EXCLUDES(mu_);

 private:
  struct Pin {
    std::vector<PageKey> keys;
    Clock::time_point deadline;
    bool forever;
  };
  Clock::time_point Now() const { return now_ ? now_() : Clock::now(); }
  void ExpireLocked() KVTIER_REQUIRES(mu_);
  void DropLocked(std::unordered_map<uint64_t, Pin>::iterator it) KVTIER_REQUIRES(mu_);

  const std::function<Clock::time_point()> now_;
  util::Mutex mu_;
  uint64_t next_id_ KVTIER_GUARDED_BY(mu_) = 1;
  std::unordered_map<uint64_t, Pin> pins_ KVTIER_GUARDED_BY(mu_);
  // Pins with a TTL.
  std::set<std::pair<Clock::time_point, uint64_t>> deadlines_ KVTIER_GUARDED_BY(mu_);
  // Live pins naming each key.
  std::unordered_map<PageKey, int64_t, PageKeyHash> counts_ KVTIER_GUARDED_BY(mu_);
};

}  // namespace kvtier::storage
