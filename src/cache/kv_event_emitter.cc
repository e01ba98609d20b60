// KvEventEmitter: the radix tree's tier changes as KV events (see kv_event_emitter.h).
#include "cache/kv_event_emitter.h"

#include <algorithm>

namespace kvtier {

KvEventEmitter::KvEventEmitter(std::shared_ptr<KvEventSink> sink, int64_t page_size,
                               std::string storage_medium)
    : sink_(std::move(sink)),
      page_size_(page_size),
      media_{std::string(kMediumGpu), std::string(kMediumCpuPinned), std::move(storage_medium)} {}

const std::string& KvEventEmitter::MediumOf(RadixTree::Tier tier) const {
  return media_[static_cast<size_t>(tier)];
}

void KvEventEmitter::OnTierChange(const RadixNode& node, RadixTree::Tier tier, bool entered) {
  const std::span<const PageKey> keys = node.keys();
  if (static_cast<int64_t>(keys.size()) * page_size_ != node.num_tokens()) {
    ++nodes_without_keys_;
    return;
  }
  const std::string& medium = MediumOf(tier);
  if (!entered) {
    BlockRemoved* last = pending_.empty() ? nullptr : std::get_if<BlockRemoved>(&pending_.back());
    if (last == nullptr || last->medium != medium) {
      pending_.push_back(BlockRemoved{{}, medium});
      last = &std::get<BlockRemoved>(pending_.back());
    }
    for (const PageKey& key : keys) last->block_hashes.push_back(BlockHashOf(key));
    return;
  }
  std::optional<uint64_t> parent;
  const RadixNode* p = node.parent();
  if (p != nullptr && !p->is_root()) {
    if (p->keys().empty()) {
      ++nodes_without_keys_;
      return;
    }
    parent = BlockHashOf(p->keys().back());
  }
  BlockStored* last = pending_.empty() ? nullptr : std::get_if<BlockStored>(&pending_.back());
  if (last == nullptr || last->medium != medium || !parent || last->block_hashes.empty() ||
      last->block_hashes.back() != *parent) {
    pending_.push_back(BlockStored{{}, parent, {}, page_size_, std::nullopt, medium});
    last = &std::get<BlockStored>(pending_.back());
  }
  for (const PageKey& key : keys) last->block_hashes.push_back(BlockHashOf(key));
  last->token_ids.insert(last->token_ids.end(), node.tokens().begin(), node.tokens().end());
}

void KvEventEmitter::Flush() {
  if (pending_.empty()) return;
  sink_->Publish(std::move(pending_));
  pending_.clear();
}

Result<TierBlockHashes> CachedBlocksOf(const RadixTree& tree) {
  TierBlockHashes out;
  Status status;
  tree.ForEachNode([&](const RadixNode& node) {
    if (!status.ok() || !node.resident()) return;
    std::vector<PageKey> computed;
    std::span<const PageKey> keys = node.keys();
    if (static_cast<int64_t>(keys.size()) * tree.page_size() != node.num_tokens()) {
      const std::vector<Token> prefix = tree.PrefixTokens(&node);
      Result<std::vector<PageKey>> all =
          ComputePromptPageKeys(prefix, tree.page_size(), node.name_space());
      if (!all.ok()) {
        status = all.status();
        return;
      }
      computed.assign(all->end() - node.num_tokens() / tree.page_size(), all->end());
      keys = computed;
    }
    for (const PageKey& key : keys) {
      const uint64_t hash = BlockHashOf(key);
      if (node.on_device()) out.device.push_back(hash);
      if (node.on_host()) out.host.push_back(hash);
      if (node.stored()) out.storage.push_back(hash);
    }
  });
  if (!status.ok()) return status;
  for (auto* v : {&out.device, &out.host, &out.storage}) std::sort(v->begin(), v->end());
  return out;
}

}  // namespace kvtier
