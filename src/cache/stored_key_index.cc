// The stored pages' nodes by key (cache/stored_key_index.h).
#include "cache/stored_key_index.h"

#include <algorithm>

namespace kvtier {

void StoredKeyIndex::OnStorage(const RadixNode& node, bool entered) {
  // The tree hands its nodes as const to its hooks; the cache, which owns the tree, changes
  // them through the pointers kept here (under its lock).
  RadixNode* n = const_cast<RadixNode*>(&node);
  for (const PageKey& key : node.keys()) {
    if (entered) {
      nodes_[key] = n;
    } else if (auto it = nodes_.find(key); it != nodes_.end() && it->second == n) {
      nodes_.erase(it);
    }
  }
}

void StoredKeyIndex::OnSplit(RadixNode* upper) {
  if (!upper->stored()) return;
  for (const PageKey& key : upper->keys()) nodes_[key] = upper;
}

RadixNode* StoredKeyIndex::Find(const PageKey& key, int64_t* page) const {
  auto it = nodes_.find(key);
  if (it == nodes_.end()) return nullptr;
  const auto keys = it->second->keys();
  const auto at = std::find(keys.begin(), keys.end(), key);
  if (at == keys.end()) return nullptr;  // not expected: the hooks keep the keys in step
  *page = at - keys.begin();
  return it->second;
}

}  // namespace kvtier
