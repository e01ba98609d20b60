// Pinned page keys of a store (storage/page_pins.h).
//
// Invariants (under `mu_`): counts_[k] is the number of live pins whose keys include k (no zero
// entries); deadlines_ holds exactly (deadline, id) of the live pins that are not forever.
#include "storage/page_pins.h"

namespace kvtier::storage {

uint64_t PagePins::Add(std::span<const PageKey> keys, std::chrono::nanoseconds ttl) {
  util::MutexLock lock(mu_);
  ExpireLocked();
  const Clock::time_point now = Now();
  // A TTL past the clock's range lasts until Remove.
  const bool forever = ttl >= Clock::time_point::max() - now;
  const uint64_t id = next_id_++;
  Pin pin{
      std::vector<PageKey>(keys.begin(), keys.end()),
      forever ? Clock::time_point::max() : now + std::chrono::duration_cast<Clock::duration>(ttl),
      forever};
  for (const PageKey& k : pin.keys) ++counts_[k];
  if (!forever) deadlines_.emplace(pin.deadline, id);
  pins_.emplace(id, std::move(pin));
  return id;
}

bool PagePins::Remove(uint64_t id) {
  util::MutexLock lock(mu_);
  ExpireLocked();
  auto it = pins_.find(id);
  if (it == pins_.end()) return false;
  DropLocked(it);
  return true;
}

bool PagePins::Pinned(const PageKey& key) {
  util::MutexLock lock(mu_);
  if (counts_.empty()) return false;
  ExpireLocked();
  return counts_.count(key) != 0;
}

int64_t PagePins::pinned_keys() {
  util::MutexLock lock(mu_);
  ExpireLocked();
  return static_cast<int64_t>(counts_.size());
}

void PagePins::ExpireLocked() {
  if (deadlines_.empty()) return;
  const Clock::time_point now = Now();
  while (!deadlines_.empty() && deadlines_.begin()->first <= now) {
    DropLocked(pins_.find(deadlines_.begin()->second));
  }
}

void PagePins::DropLocked(std::unordered_map<uint64_t, Pin>::iterator it) {
  for (const PageKey& k : it->second.keys) {
    auto c = counts_.find(k);
    if (--c->second == 0) counts_.erase(c);
  }
  if (!it->second.forever) deadlines_.erase({it->second.deadline, it->first});
  pins_.erase(it);
}

}  // namespace kvtier::storage
