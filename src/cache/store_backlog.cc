// The write backlog (see cache/store_backlog.h).
#include "cache/store_backlog.h"

#include <algorithm>

namespace kvtier {

bool StoreBacklog::MakeRoom(int64_t bytes, int64_t estimate,
                            std::vector<std::shared_ptr<CopyOp>>* victims) {
  if (bytes > capacity_bytes_) return false;
  if (bytes <= free_bytes()) return true;
  // The candidates, lowest estimate first (equal: newest first), below the newcomer's.
  std::vector<size_t> order;
  for (size_t i = 0; i < entries_.size(); ++i) {
    if (entries_[i].estimate < estimate) order.push_back(i);
  }
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const Entry& x = entries_[a];
    const Entry& y = entries_[b];
    return x.estimate != y.estimate ? x.estimate < y.estimate : x.seq > y.seq;
  });
  int64_t freed = 0;
  size_t take = 0;
  while (take < order.size() && free_bytes() + freed < bytes)
    freed += entries_[order[take++]].bytes;
  if (free_bytes() + freed < bytes) return false;
  order.resize(take);
  std::sort(order.rbegin(), order.rend());  // remove from the back: indices stay valid
  for (size_t i : order) {
    victims->push_back(entries_[i].op);
    Remove(i);
  }
  return true;
}

void StoreBacklog::Add(std::shared_ptr<CopyOp> op, int64_t estimate, int64_t bytes, int64_t pages,
                       int64_t tokens) {
  bytes_ += bytes;
  tokens_ += tokens;
  entries_.push_back(Entry{std::move(op), estimate, bytes, pages, tokens, next_seq_++});
}

std::shared_ptr<CopyOp> StoreBacklog::Next(int64_t room_pages) {
  if (entries_.empty()) return nullptr;
  size_t best = 0;
  for (size_t i = 1; i < entries_.size(); ++i) {
    const Entry& x = entries_[i];
    const Entry& b = entries_[best];
    if (x.estimate > b.estimate || (x.estimate == b.estimate && x.seq < b.seq)) best = i;
  }
  if (entries_[best].pages > room_pages) return nullptr;
  std::shared_ptr<CopyOp> op = entries_[best].op;
  Remove(best);
  return op;
}

void StoreBacklog::Remove(size_t i) {
  bytes_ -= entries_[i].bytes;
  tokens_ -= entries_[i].tokens;
  entries_.erase(entries_.begin() + static_cast<std::ptrdiff_t>(i));
}

}  // namespace kvtier
