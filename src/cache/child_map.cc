// The child map of a radix node (see cache/child_map.h).
#include "cache/child_map.h"

#include <bit>

namespace kvtier {

namespace detail {

void ChildMap::Insert(uint64_t key, RadixNode* node) {
  if ((used_ + 1) * 4 > slots_.size() * 3) {
    size_t capacity = 4;
    while (capacity * 3 < (size_ + 1) * 4 * 2) capacity *= 2;  // at most 3/8 full after
    Rehash(capacity);
  }
  for (size_t i = Home(key);; i = (i + 1) & mask_) {
    Entry& e = slots_[i];
    if (!Live(e)) {
      if (e.node == nullptr) ++used_;
      e = {key, node};
      ++size_;
      return;
    }
  }
}

size_t ChildMap::Locate(uint64_t key, const RadixNode* node) const {
  for (size_t i = Home(key);; i = (i + 1) & mask_) {
    if (slots_[i].node == node) return i;
  }
}

void ChildMap::Erase(uint64_t key, RadixNode* node) {
  slots_[Locate(key, node)].node = Tombstone();
  --size_;
  if (size_ == 0) Clear();
}

void ChildMap::Replace(uint64_t key, RadixNode* from, RadixNode* to) {
  slots_[Locate(key, from)].node = to;
}

void ChildMap::Clear() {
  slots_.clear();
  slots_.shrink_to_fit();
  mask_ = 0;
  shift_ = 64;
  size_ = used_ = 0;
}

void ChildMap::Rehash(size_t capacity) {
  std::vector<Entry> old = std::move(slots_);
  slots_.assign(capacity, Entry{});
  mask_ = capacity - 1;
  shift_ = 64 - std::countr_zero(capacity);
  size_ = used_ = 0;
  for (const Entry& e : old) {
    if (!Live(e)) continue;
    size_t i = Home(e.key);
    while (slots_[i].node != nullptr) i = (i + 1) & mask_;
    slots_[i] = e;
    ++size_;
    ++used_;
  }
}

}  // namespace detail

}  // namespace kvtier
