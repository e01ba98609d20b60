// The pages a store evicted by itself, kept for whoever tracks them (StorageBackend::
// TrackEvictions in kvtier/storage_backend.h: the cache, for its KV events).
//
// Thread safety: the log has its own mutex; the pointer to it is set once (the first
// TrackEvictions(true)) and read through std::atomic_load, so a backend's I/O threads may note
// evictions while the cache starts tracking.
#include <deque>
#include <memory>

#include "kvtier/storage_backend.h"
#include "util/mutex.h"

namespace kvtier {

struct StorageBackend::Evictions {
  util::Mutex mu;
  bool on KVTIER_GUARDED_BY(mu) = false;
  std::deque<PageKey> keys KVTIER_GUARDED_BY(mu);  // oldest first, at most kMaxTrackedEvictions
  int64_t dropped KVTIER_GUARDED_BY(mu) = 0;       // since the last TakeEvictions
};

void StorageBackend::TrackEvictions(bool on) {
  static util::Mutex make_mu;  // one log per backend, however many threads start tracking
  std::shared_ptr<Evictions> log = std::atomic_load(&evictions_);
  if (log == nullptr) {
    if (!on) return;
    util::MutexLock lock(make_mu);
    log = std::atomic_load(&evictions_);
    if (log == nullptr) {
      log = std::make_shared<Evictions>();
      std::atomic_store(&evictions_, log);
    }
  }
  util::MutexLock lock(log->mu);
  log->on = on;
  if (!on) {
    log->keys.clear();
    log->dropped = 0;
  }
}

std::vector<PageKey> StorageBackend::TakeEvictions(int64_t* dropped) {
  if (dropped != nullptr) *dropped = 0;
  const std::shared_ptr<Evictions> log = std::atomic_load(&evictions_);
  if (log == nullptr) return {};
  util::MutexLock lock(log->mu);
  std::vector<PageKey> out(log->keys.begin(), log->keys.end());
  log->keys.clear();
  if (dropped != nullptr) *dropped = log->dropped;
  log->dropped = 0;
  return out;
}

void StorageBackend::NoteEvicted(std::span<const PageKey> keys) {
  if (keys.empty()) return;
  const std::shared_ptr<Evictions> log = std::atomic_load(&evictions_);
  if (log == nullptr) return;
  util::MutexLock lock(log->mu);
  if (!log->on) return;
  for (const PageKey& key : keys) {
    if (log->keys.size() >= kMaxTrackedEvictions) {
      log->keys.pop_front();
      ++log->dropped;
    }
    log->keys.push_back(key);
  }
}

}  // namespace kvtier
