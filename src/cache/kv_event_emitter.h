// Internal: the cache's KV events (kvtier/kv_events.h). The radix tree tells the emitter of every
// node that enters or leaves a tier (RadixTree::SetTierHook); the emitter turns each change into
// BlockStored / BlockRemoved events for the pages of that node — block hashes from the node's page
// keys, the parent hash from the page before the node, the medium from the tier — and hands them
// to the KvEventSink in one batch per Flush. Consecutive changes coalesce: a BlockStored that
// continues the previous one's chain in the same medium, or a BlockRemoved after one of the same
// medium, joins it.
//
// So the events describe exactly the tree's tiers: replaying them from the start gives, per
// medium, the block hashes of CachedBlocksOf(tree). Nodes carry keys whenever events are on (the
// cache computes them on Insert); a node without keys would be reported by nothing and is counted
// in nodes_without_keys().
//
// Thread safety: none; the cache calls it under its lock (which also orders the batches).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "cache/radix_tree.h"
#include "kvtier/hierarchical_cache.h"
#include "kvtier/kv_events.h"

namespace kvtier {

class KvEventEmitter {
 public:
  // `storage_medium`: the medium of the storage tier's events (StorageMediumOf its URL).
  KvEventEmitter(std::shared_ptr<KvEventSink> sink, int64_t page_size, std::string storage_medium);

  // The tree's tier hook.
  void OnTierChange(const RadixNode& node, RadixTree::Tier tier, bool entered);
  // Publishes what is pending as one batch (nothing when nothing is).
  void Flush();

  int64_t nodes_without_keys() const { return nodes_without_keys_; }

 private:
  const std::string& MediumOf(RadixTree::Tier tier) const;

  std::shared_ptr<KvEventSink> sink_;
  const int64_t page_size_;
  const std::string media_[3];
  std::vector<KvEvent> pending_;
  int64_t nodes_without_keys_ = 0;
};

// The block hashes of the pages each tier of `tree` holds, sorted
// (HierarchicalCache::CachedBlocks). Pages of nodes without keys are keyed from their prefix tokens
// (their namespace as the salt).
Result<TierBlockHashes> CachedBlocksOf(const RadixTree& tree);

}  // namespace kvtier
