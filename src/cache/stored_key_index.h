// Internal: which tree node holds each page the storage tier is marked as holding, kept while KV
// events are on, so that a page the store evicted by itself (StorageBackend::TakeEvictions: the
// file store's capacity and free-space floor, memory://'s capacity) is found by its key and
// published as removed (CacheParts::ForgetStoreEvictions): the events' view of the storage
// medium then matches the store. Memory: about 80 bytes per stored page.
//
// Kept in step by the tree's hooks: a node entering the storage tier adds its keys, one leaving
// it (SetStored(false), removed from the tree) erases them, a split points the keys of the new
// upper node at it.
//
// Thread safety: none; the cache calls it under its lock.
#pragma once

#include <cstdint>
#include <unordered_map>

#include "cache/radix_tree.h"
#include "kvtier/page_key.h"

namespace kvtier {

class StoredKeyIndex {
 public:
  // The tree's tier hook for RadixTree::Tier::kStorage.
  void OnStorage(const RadixNode& node, bool entered);
  // The split hook: `upper` took the first pages of a stored node.
  void OnSplit(RadixNode* upper);
  // The node holding `key` and the page's index in it (`page`); nullptr when no stored node does.
  RadixNode* Find(const PageKey& key, int64_t* page) const;
  int64_t size() const { return static_cast<int64_t>(nodes_.size()); }

 private:
  std::unordered_map<PageKey, RadixNode*, PageKeyHash> nodes_;
};

}  // namespace kvtier
