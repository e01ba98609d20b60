// The storage oracle of a replay run (replay_oracle.h).
#include "replay_oracle.h"

#include <algorithm>
#include <list>
#include <unordered_map>
#include <utility>
#include <vector>

namespace kvtier::tools {
namespace {

// Page keys, least recently used first out, at most `capacity` (-1: unbounded).
class OracleLru {
 public:
  explicit OracleLru(int64_t capacity) : capacity_(capacity) {}

  bool Contains(const PageKey& key) const { return where_.count(key) > 0; }

  // Most recently used now; stored when new, evicting the least recently used beyond capacity.
  void Use(const PageKey& key) {
    if (capacity_ == 0) return;
    if (auto it = where_.find(key); it != where_.end()) {
      order_.splice(order_.end(), order_, it->second);
      return;
    }
    where_.emplace(key, order_.insert(order_.end(), key));
    while (capacity_ > 0 && static_cast<int64_t>(order_.size()) > capacity_) {
      where_.erase(order_.front());
      order_.pop_front();
    }
  }

 private:
  const int64_t capacity_;
  std::list<PageKey> order_;  // least recent first
  std::unordered_map<PageKey, std::list<PageKey>::iterator, PageKeyHash> where_;
};

// A request's pages touched tail first: its first page ends the most recent.
void UseChain(OracleLru& lru, const std::vector<PageKey>& chain, size_t pages) {
  for (size_t i = std::min(pages, chain.size()); i-- > 0;) lru.Use(chain[i]);
}

// Request `index`'s pages stored, tail first: those admitted by then (every one without
// `admitted`); an admission while the next request was served counts (replay_oracle.h).
void StoreChain(OracleLru& lru, const std::vector<PageKey>& chain, int64_t index,
                const AdmittedAt* admitted) {
  for (size_t i = chain.size(); i-- > 0;) {
    if (admitted != nullptr) {
      const auto it = admitted->find(chain[i]);
      if (it == admitted->end() || it->second > index + 1) continue;
    }
    lru.Use(chain[i]);
  }
}

// The run's admitted pages in the order they were admitted, each stored once at the end of the
// service it was admitted in, whichever request that was. A write planned after its own request's
// service (an open loop's queueing, a backup that lands later) is in the run's store from then
// on, so the oracle holds it from then on too, not only from the next request that has the page.
// (Not "by the next request's service" as StoreChain's rule for a request's own pages: pages
// admitted while request i + 1 is served include its own, which would then count as its hits.)
class DueAdmissions {
 public:
  explicit DueAdmissions(const AdmittedAt* admitted) {
    if (admitted == nullptr) return;
    due_.reserve(admitted->size());
    for (const auto& [key, index] : *admitted) due_.emplace_back(index, key);
    std::sort(due_.begin(), due_.end(),
              [](const auto& a, const auto& b) { return a.first < b.first; });
  }

  // Stores every page admitted by the end of request `index`'s service that the oracle does not
  // hold.
  void StoreDue(OracleLru& lru, int64_t index) {
    for (; next_ < due_.size() && due_[next_].first <= index; ++next_) {
      if (!lru.Contains(due_[next_].second)) lru.Use(due_[next_].second);
    }
  }

 private:
  std::vector<std::pair<int64_t, PageKey>> due_;  // (index admitted at, page), by index
  size_t next_ = 0;
};

size_t LeadingStored(const OracleLru& lru, const std::vector<PageKey>& chain, size_t pages) {
  size_t n = 0;
  while (n < std::min(pages, chain.size()) && lru.Contains(chain[n])) ++n;
  return n;
}

}  // namespace

void AdmissionLog::Admitted(std::span<const PageKey> keys) {
  const int64_t index = serving_.load(std::memory_order_relaxed);
  std::lock_guard<std::mutex> lock(mu_);
  for (const PageKey& k : keys) at_.emplace(k, index);  // the first admission stays
}

AdmittedAt AdmissionLog::Take() {
  std::lock_guard<std::mutex> lock(mu_);
  return std::exchange(at_, {});
}

StorageOracleResult RunStorageOracle(const std::vector<std::vector<PageKey>>& warmup,
                                     const std::vector<std::vector<PageKey>>& chains,
                                     const std::vector<int64_t>& prompt_pages,
                                     const std::vector<RequestRecord>& records, int64_t page_size,
                                     int64_t capacity_pages, const AdmittedAt* admitted) {
  StorageOracleResult r;
  r.capacity_pages = capacity_pages;
  OracleLru lru(capacity_pages);
  const int64_t warmups = static_cast<int64_t>(warmup.size());
  DueAdmissions due(admitted);
  for (int64_t w = 0; w < warmups; ++w) {
    StoreChain(lru, warmup[static_cast<size_t>(w)], w - warmups, admitted);
    due.StoreDue(lru, w - warmups);
  }
  for (size_t i = 0; i < chains.size(); ++i) {
    const size_t prompt = static_cast<size_t>(std::max<int64_t>(0, prompt_pages[i]));
    const size_t leading = LeadingStored(lru, chains[i], prompt);
    UseChain(lru, chains[i], leading);
    const RequestRecord& rec = records[i];
    const int64_t oracle = std::max<int64_t>(
        0, static_cast<int64_t>(leading) * page_size - rec.device_hit - rec.host_hit);
    const int64_t lost = std::max<int64_t>(0, oracle - rec.storage_hit);
    r.oracle_storage_hit.push_back(oracle);
    r.lost_hit.push_back(lost);
    r.storage_tokens += oracle;
    r.lost_tokens += lost;
    r.lost_requests += lost > 0;
    StoreChain(lru, chains[i], static_cast<int64_t>(i), admitted);
    due.StoreDue(lru, static_cast<int64_t>(i));
  }
  return r;
}

}  // namespace kvtier::tools
