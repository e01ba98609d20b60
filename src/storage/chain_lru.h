// Internal: the eviction order of a store that knows each page's parent (the page before it in its
// prompt), so that eviction never leaves a stored page whose prefix page is gone.
//
// A lookup walks a prompt's pages from the first and stops at the first miss, so a stored page
// whose parent was evicted is bytes no request can reach (a stranded page). A plain LRU strands
// pages all the time: reading a prefix touches its head first, so the head is the older and goes
// first. ChainLru evicts only tails: the victim is the least recently used page that no stored
// page names as its parent (a leaf of the stored pages' forest), the order SGLang's radix tree
// evicts in. When a leaf goes, its parent becomes a leaf with its own recency, so a cold chain is
// taken tail first, page by page, and a hot tail keeps its whole prefix stored.
//
// Pages whose parent is unknown (written without one; in a file store, found at a restart or by
// a lookup in a page file of format version 1 or whose header does not check out) are roots:
// evicted in plain LRU order among the leaves. A parent link may name a page not stored (yet):
// the link counts from the moment that page is stored. Cycles of parent links cannot come from
// page keys (each key hashes its parent's), but a caller may pass any link: when no page is a
// leaf, the victim is the least recently used page, so the capacity always holds.
//
// Tail-first eviction keeps every stored child's parent, but a page can also be written after its
// parent went (the writer believed the parent stored; or the parent was the tail of a chain longer
// than the room and went at once): such a page is stranded from birth. DropOrphans, run after each
// Set with parents, drops those whose parent this store evicted (Evicted: the last
// max(4096, 2 x pages) victims, at most 2^20, are remembered) or that the same batch failed to
// write. A parent the store never saw is not taken for gone: it may be in a batch not yet run
// (the cache's store of a long prompt is several batches, which may complete out of order).
//
// Costs: O(log n) per Add, Touch, Erase and Victim.
//
// Thread safety: none; the owner (FileIndex, MemoryStore) holds its own mutex.
#pragma once

#include <algorithm>
#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <span>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "kvtier/storage.h"

namespace kvtier::storage {

template <typename Key, typename Hash>
class ChainLru {
 public:
  // Adds `key` as the most recently used page (`newest`) or the least recently used one. A known
  // key is refreshed: its bytes, its recency, and its parent when `parent` is given (nullopt
  // keeps the parent it had; a new key without one is a root). A key naming itself is a root.
  void Add(const Key& key, int64_t bytes, const std::optional<Key>& parent, bool newest) {
    auto it = entries_.find(key);
    if (it == entries_.end()) {
      it = entries_.emplace(key, Entry{}).first;
    } else {
      bytes_ -= it->second.bytes;
      order_.erase(it->second.seq);
      leaves_.erase(it->second.seq);
    }
    Entry& e = it->second;
    e.bytes = bytes;
    bytes_ += bytes;
    e.seq = newest ? ++newest_seq_ : --oldest_seq_;
    if (parent && !(*parent == key) && !(e.parent && *e.parent == *parent)) {
      if (e.parent) Unlink(*e.parent);
      e.parent = parent;
      Link(*parent);
    }
    order_.emplace(e.seq, key);
    if (children_.count(key) == 0) leaves_.emplace(e.seq, key);
  }

  // Makes a known key the most recently used; false for an unknown one.
  bool Touch(const Key& key) {
    auto it = entries_.find(key);
    if (it == entries_.end()) return false;
    Add(key, it->second.bytes, std::nullopt, /*newest=*/true);
    return true;
  }

  // Forgets `key`: its bytes, or -1 when unknown. Pages naming it as parent keep the link (they
  // are stranded if it was not evicted through Victim: a removal the caller asked for).
  int64_t Erase(const Key& key) {
    auto it = entries_.find(key);
    if (it == entries_.end()) return -1;
    const int64_t bytes = it->second.bytes;
    bytes_ -= bytes;
    order_.erase(it->second.seq);
    leaves_.erase(it->second.seq);
    const std::optional<Key> parent = it->second.parent;
    entries_.erase(it);
    if (parent) Unlink(*parent);
    return bytes;
  }

  // Why Victim chose what it chose.
  enum class VictimReason : uint8_t {
    kNone,  // nothing to evict: nothing but `keep` (or nothing) stored, or every page skipped
    kLeaf,  // the least recently used leaf other than `keep`
    // `keep`, the only leaf: the page just written is the tail of a chain longer than the room
    // (the tail goes, the head stays); it would be chosen without `skip` too.
    kKeepTail,
    // `keep`, because pages `skip` names leave nothing else: without `skip` another page would go
    // (a store refuses the new page rather than evict it for pins).
    kKeepSkipped,
    // A page other than `keep` that is no leaf: no leaf could go (a cycle of links, or every
    // leaf skipped).
    kNotALeaf,
  };
  struct VictimChoice {
    std::optional<Key> key;  // nullopt exactly when kNone
    VictimReason reason = VictimReason::kNone;
  };

  // The page to evict next: the least recently used leaf other than `keep`; `keep` itself when it
  // is the only leaf and not the only page (the page just written is the tail of a chain longer
  // than the room: the tail goes, the head stays); with no leaf at all (a cycle of links), the
  // least recently used page other than `keep`. None when nothing but `keep` (or nothing) is
  // stored. Pages `skip` names (pinned ones) are never chosen; when they leave nothing else,
  // `keep` is (the new page goes rather than a pinned one; kKeepSkipped), and none when `keep` is
  // skipped too. The reason tells these cases apart.
  template <typename Skip>
  VictimChoice Victim(const Key* keep, const Skip& skip) const {
    if (entries_.empty() || (entries_.size() == 1 && keep != nullptr && entries_.count(*keep))) {
      return {};
    }
    const auto is_keep = [keep](const Key& key) { return keep != nullptr && key == *keep; };
    bool keep_is_leaf = false, skipped_a_leaf = false;
    for (const auto& [seq, key] : leaves_) {
      if (is_keep(key)) {
        keep_is_leaf = true;
      } else if (!skip(key)) {
        return {key, VictimReason::kLeaf};
      } else {
        skipped_a_leaf = true;
      }
    }
    if (keep_is_leaf && !skip(*keep)) {
      return {*keep, skipped_a_leaf ? VictimReason::kKeepSkipped : VictimReason::kKeepTail};
    }
    for (const auto& [seq, key] : order_) {
      if (!is_keep(key) && !skip(key)) return {key, VictimReason::kNotALeaf};
    }
    // Here every page but `keep` (there is one: see the first check) is skipped, and `keep` is no
    // leaf: without `skip` one of them would go.
    if (keep != nullptr && entries_.count(*keep) != 0 && !skip(*keep)) {
      return {*keep, VictimReason::kKeepSkipped};
    }
    return {};
  }
  VictimChoice Victim(const Key* keep) const {
    return Victim(keep, [](const Key&) { return false; });
  }

  // Erase for a page the store evicts: remembered as evicted (Evicted) until newer victims push it
  // out. Its bytes, or -1 when unknown.
  int64_t Evict(const Key& key) {
    const int64_t bytes = Erase(key);
    if (bytes < 0) return bytes;
    const size_t bound =
        static_cast<size_t>(std::clamp<int64_t>(2 * pages(), int64_t{4096}, int64_t{1} << 20));
    if (evicted_.insert(key).second) evicted_order_.push_back(key);
    while (evicted_order_.size() > bound) {
      evicted_.erase(evicted_order_.front());
      evicted_order_.pop_front();
    }
    return bytes;
  }
  // Whether `key` is among the pages recently evicted (it may have been stored again since).
  bool Evicted(const Key& key) const { return evicted_.count(key) != 0; }

  bool Contains(const Key& key) const { return entries_.count(key) != 0; }
  int64_t pages() const { return static_cast<int64_t>(entries_.size()); }
  int64_t bytes() const { return bytes_; }
  // The parent recorded for `key` (nullopt: unknown key or a root).
  std::optional<Key> ParentOf(const Key& key) const {
    auto it = entries_.find(key);
    return it == entries_.end() ? std::nullopt : it->second.parent;
  }
  // Keys from most to least recently used.
  std::vector<Key> Order() const {
    std::vector<Key> keys;
    keys.reserve(order_.size());
    for (auto it = order_.rbegin(); it != order_.rend(); ++it) keys.push_back(it->second);
    return keys;
  }

 private:
  struct Entry {
    int64_t bytes = 0;
    int64_t seq = 0;
    std::optional<Key> parent;
  };

  void Link(const Key& parent) {
    if (++children_[parent] != 1) return;
    auto it = entries_.find(parent);
    if (it != entries_.end()) leaves_.erase(it->second.seq);
  }
  void Unlink(const Key& parent) {
    auto c = children_.find(parent);
    if (c == children_.end() || --c->second > 0) return;
    children_.erase(c);
    auto it = entries_.find(parent);
    if (it != entries_.end()) leaves_.emplace(it->second.seq, parent);
  }

  std::unordered_map<Key, Entry, Hash> entries_;
  std::map<int64_t, Key> order_;   // recency -> key, every page, least recently used first
  std::map<int64_t, Key> leaves_;  // the same for the pages no stored page names as parent
  std::unordered_map<Key, int64_t, Hash> children_;  // parent -> stored pages naming it
  std::unordered_set<Key, Hash> evicted_;            // the recent victims (Evict), oldest first in:
  std::deque<Key> evicted_order_;
  int64_t newest_seq_ = 0, oldest_seq_ = 0;
  int64_t bytes_ = 0;
};

// Before a Set of `keys` with `parents`: the pages not to write because their prefix is gone — a
// parent outside the batch that `gone(parent)` says this store evicted (and is not stored nor
// being written again), or a parent in the batch that is itself skipped. Such a page would be
// bytes no lookup reaches, and its room would evict a page one can: it is kSkipped (not attempted:
// an earlier page cut it), and the writer, which counts only leading kOk pages as stored, stores
// it again after its prefix.
template <typename Gone>
std::vector<uint8_t> OrphansToSkip(std::span<const PageKey> keys,
                                   std::span<const std::optional<PageKey>> parents,
                                   const Gone& gone) {
  std::unordered_map<PageKey, size_t, PageKeyHash> pos;
  for (size_t i = 0; i < keys.size(); ++i) pos.emplace(keys[i], i);
  std::vector<uint8_t> skip(keys.size(), 0);
  for (size_t i = 0; i < keys.size() && i < parents.size(); ++i) {
    if (parents[i] && pos.count(*parents[i]) == 0 && gone(*parents[i])) skip[i] = 1;
  }
  for (bool more = true; more;) {  // a skipped page's children in the batch
    more = false;
    for (size_t i = 0; i < keys.size() && i < parents.size(); ++i) {
      if (skip[i] || !parents[i]) continue;
      auto it = pos.find(*parents[i]);
      if (it != pos.end() && skip[it->second]) skip[i] = 1, more = true;
    }
  }
  return skip;
}

// After a Set of `keys` with `parents` (`out`: each page's outcome): drops each page written whose
// parent is gone. `drop(key, parent, in_batch)` removes `key` when `parent` is not stored and
// either is one of this batch's keys (its write failed, or it was dropped) or was evicted by the
// store, and says whether it did; a parent outside the batch that a queued or running write names
// (`pending(parent)`) is not gone. Repeated until nothing more goes, so a cut inside the batch
// takes the rest of its chain. The pages dropped stay kOk: written, then evicted at once (they
// count as evicted).
template <typename Pending, typename Drop>
void DropOrphans(std::span<const PageKey> keys, std::span<const std::optional<PageKey>> parents,
                 std::span<const PageStatus> out, const Pending& pending, const Drop& drop) {
  std::unordered_set<PageKey, PageKeyHash> batch(keys.begin(), keys.end());
  std::vector<uint8_t> gone(keys.size(), 0);
  for (bool more = true; more;) {
    more = false;
    for (size_t i = 0; i < keys.size() && i < parents.size(); ++i) {
      if (gone[i] || out[i] != PageStatus::kOk || !parents[i]) continue;
      const bool in_batch = batch.count(*parents[i]) != 0;
      if (!in_batch && pending(*parents[i])) continue;
      if (drop(keys[i], *parents[i], in_batch)) gone[i] = 1, more = true;
    }
  }
}

}  // namespace kvtier::storage
