// The radix tree's invariant checks (see cache/radix_tree.h): CheckInvariants recomputes every
// count, total and evictable set from the nodes and compares them with what the tree keeps
// incrementally (radix_tree.cc). Used by tests and by HierarchicalCache::CheckConsistency.
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <utility>

#include "cache/radix_tree.h"

namespace kvtier {

namespace {

Status PagesAligned(const RadixNode* n, std::span<const int64_t> pages, const char* tier,
                    int64_t page_size) {
  for (size_t k = 0; k < pages.size(); ++k) {
    if (pages[k] < 0 || pages[k] % page_size != 0) {
      return Status::Internal(
          fmt::format("node {}: {} page {} starts at slot {}, not a multiple "
                      "of page_size {}",
                      n->id(), tier, k, pages[k], page_size));
    }
  }
  return Status::OK();
}

}  // namespace

Status RadixTree::CheckChild(const RadixNode* n, const RadixNode* c, uint64_t key,
                             const std::vector<std::pair<uint64_t, const RadixNode*>>& kids) const {
  if (n->children_.Find(key, [&](const RadixNode* x) { return x == c; }) != c) {
    return Status::Internal(fmt::format("node {}: not reachable under its key", c->id_));
  }
  if (c->parent_ != n) {
    return Status::Internal(fmt::format("node {}: parent pointer is not node {}", c->id_, n->id_));
  }
  if (c->tokens_.empty() || c->num_tokens() % page_size_ != 0) {
    return Status::Internal(
        fmt::format("node {}: {} tokens is not a positive multiple of page "
                    "size {}",
                    c->id_, c->num_tokens(), page_size_));
  }
  if (key != PageHash(std::span<const Token>(c->tokens_).first(page_size_)) ||
      key != c->child_key_) {
    return Status::Internal(fmt::format("node {}: filed under the wrong first-page key", c->id_));
  }
  if (c->prefix_tokens_ != n->prefix_tokens_ + c->num_tokens()) {
    return Status::Internal(fmt::format("node {}: prefix_tokens {} != parent's {} + {}", c->id_,
                                        c->prefix_tokens_, n->prefix_tokens_, c->num_tokens()));
  }
  if (c->namespace_ != n->namespace_) {
    return Status::Internal(fmt::format("node {}: namespace differs from its parent", c->id_));
  }
  if (!c->resident() && c->ref_count_ == 0 && c->busy_ == 0 && !c->retained_anywhere() &&
      !c->in_storage_set_ && c->children_.empty()) {
    return Status::Internal(fmt::format(
        "node {}: resident in no tier, unreferenced and not waiting for removal", c->id_));
  }
  const int64_t pages = c->num_tokens() / page_size_;
  if (c->on_device() && pages != static_cast<int64_t>(c->device_pages_.size())) {
    return Status::Internal(fmt::format("node {}: {} device pages for {} tokens", c->id_,
                                        c->device_pages_.size(), c->num_tokens()));
  }
  if (c->on_host() && pages != static_cast<int64_t>(c->host_pages_.size())) {
    return Status::Internal(fmt::format("node {}: {} host pages for {} tokens", c->id_,
                                        c->host_pages_.size(), c->num_tokens()));
  }
  if (!c->keys_.empty() && static_cast<int64_t>(c->keys_.size()) != pages) {
    return Status::Internal(
        fmt::format("node {}: {} storage keys for {} pages", c->id_, c->keys_.size(), pages));
  }
  if (c->stored_ && c->keys_.empty()) {
    return Status::Internal(fmt::format("node {}: stored without page keys", c->id_));
  }
  if (c->on_device() && !n->is_root() && !n->on_device()) {
    return Status::Internal(
        fmt::format("node {}: on the device but its parent {} is not", c->id_, n->id_));
  }
  if (c->on_host() && !n->is_root() && !n->on_host()) {
    return Status::Internal(
        fmt::format("node {}: in host memory but its parent {} is not (backups must form a prefix)",
                    c->id_, n->id_));
  }
  if (c->busy_ < 0) return Status::Internal(fmt::format("node {}: busy {}", c->id_, c->busy_));
  KVTIER_RETURN_IF_ERROR(PagesAligned(c, c->device_pages_, "device", page_size_));
  KVTIER_RETURN_IF_ERROR(PagesAligned(c, c->host_pages_, "host", page_size_));
  // Distinct first pages among siblings.
  for (const auto& [key2, other] : kids) {
    if (other != c && key2 == key &&
        std::equal(other->tokens_.begin(), other->tokens_.begin() + page_size_,
                   c->tokens_.begin())) {
      return Status::Internal(
          fmt::format("nodes {} and {} share a first page", c->id_, other->id_));
    }
  }
  return Status::OK();
}

Status RadixTree::CheckEvictableSets(const RadixNode* n) const {
  const auto [dev, host, storage] = WantedSets(n);
  auto* mut = const_cast<RadixNode*>(n);
  if (dev != n->in_device_set_ || (dev && (!device_set_.count({n->device_key_, n->id_, mut}) ||
                                           n->device_key_ != device_policy_->Key(StatsOf(n))))) {
    return Status::Internal(
        fmt::format("node {}: device-evictable set membership is wrong "
                    "(should be {})",
                    n->id_, dev));
  }
  if (host != n->in_host_set_ || (host && (!host_set_.count({n->host_key_, n->id_, mut}) ||
                                           n->host_key_ != host_policy_->Key(StatsOf(n))))) {
    return Status::Internal(
        fmt::format("node {}: host-evictable set membership is wrong "
                    "(should be {})",
                    n->id_, host));
  }
  if (storage != n->in_storage_set_ ||
      (storage && !storage_set_.count({n->storage_key_, n->id_, mut}))) {
    return Status::Internal(
        fmt::format("node {}: storage set membership is wrong "
                    "(should be {})",
                    n->id_, storage));
  }
  return Status::OK();
}

Status RadixTree::CheckNode(const RadixNode* n, int64_t* device_tokens, int64_t* host_tokens,
                            int64_t* stored_tokens, int64_t* nodes) const {
  int64_t dev_children = 0, host_children = 0, child_refs = 0;
  std::array<int64_t, 3> child_retained{};
  std::vector<std::pair<uint64_t, const RadixNode*>> kids;
  n->children_.ForEach([&](uint64_t key, const RadixNode* c) { kids.emplace_back(key, c); });
  if (kids.size() != n->children_.size()) {
    return Status::Internal(fmt::format("node {}: child map size {} but {} live entries", n->id_,
                                        n->children_.size(), kids.size()));
  }
  for (const auto& [key, c] : kids) {
    KVTIER_RETURN_IF_ERROR(CheckChild(n, c, key, kids));
    dev_children += c->on_device();
    host_children += c->on_host();
    child_refs += c->ref_count_;
    for (size_t t = 0; t < child_retained.size(); ++t) child_retained[t] += c->retained_[t];
    *device_tokens += static_cast<int64_t>(c->device_pages_.size()) * page_size_;
    *host_tokens += static_cast<int64_t>(c->host_pages_.size()) * page_size_;
    if (c->stored_) *stored_tokens += c->num_tokens();
    ++*nodes;
    KVTIER_RETURN_IF_ERROR(CheckNode(c, device_tokens, host_tokens, stored_tokens, nodes));
  }
  if (dev_children != n->device_children_ || host_children != n->host_children_) {
    return Status::Internal(
        fmt::format("node {}: children counts device {} host {} but recorded {} and {}", n->id_,
                    dev_children, host_children, n->device_children_, n->host_children_));
  }
  if (!n->is_root()) {
    if (n->ref_count_ < child_refs) {
      return Status::Internal(fmt::format("node {}: ref_count {} below its children's sum {}",
                                          n->id_, n->ref_count_, child_refs));
    }
    for (size_t t = 0; t < child_retained.size(); ++t) {
      if (n->retained_[t] < child_retained[t] || n->retained_[t] < 0) {
        return Status::Internal(
            fmt::format("node {}: retained {} in tier {}, below its children's sum {}", n->id_,
                        n->retained_[t], t, child_retained[t]));
      }
    }
    KVTIER_RETURN_IF_ERROR(CheckEvictableSets(n));
  }
  return Status::OK();
}

Status RadixTree::CheckInvariants() const {
  int64_t device_tokens = 0, host_tokens = 0, stored_tokens = 0, nodes = 0;
  for (const auto& [name, root] : roots_) {
    if (!root->tokens_.empty() || root->on_device() || root->on_host() || root->ref_count_ != 0) {
      return Status::Internal(
          fmt::format("root of namespace '{}' holds tokens, slots or refs", name));
    }
    if (root->children_.empty()) {
      return Status::Internal(fmt::format("namespace '{}' has no nodes but was kept", name));
    }
    KVTIER_RETURN_IF_ERROR(
        CheckNode(root.get(), &device_tokens, &host_tokens, &stored_tokens, &nodes));
  }
  if (device_tokens != device_tokens_ || host_tokens != host_tokens_ || nodes != num_nodes_ ||
      stored_tokens != stored_tokens_) {
    return Status::Internal(
        fmt::format("totals: device {} host {} stored {} nodes {}, recorded {} {} {} {}",
                    device_tokens, host_tokens, stored_tokens, nodes, device_tokens_, host_tokens_,
                    stored_tokens_, num_nodes_));
  }
  int64_t dev_members = 0, host_members = 0, storage_members = 0;
  int64_t locked_dev = 0, locked_host = 0, storage_only = 0, pinned_dev = 0, pinned_host = 0;
  int64_t held_dev = 0;
  std::array<int64_t, 3> retained{};
  ForEachNode([&](const RadixNode& n) {
    dev_members += n.in_device_set_;
    host_members += n.in_host_set_;
    storage_members += n.in_storage_set_;
    if (n.storage_only()) storage_only += n.num_tokens();
    if (n.ref_count_ > 0 || n.busy_ > 0 || n.retained_[0] > 0) {
      locked_dev += static_cast<int64_t>(n.device_pages_.size()) * page_size_;
    }
    if (n.ref_count_ > 0 || n.retained_[0] > 0) {
      held_dev += static_cast<int64_t>(n.device_pages_.size()) * page_size_;
    }
    for (size_t t = 0; t < retained.size(); ++t) {
      if (n.retained_[t] > 0) retained[t] += n.num_tokens();
    }
    if (n.ref_count_ > 0 || n.busy_ > 0 || n.storing_ || n.retained_[1] > 0) {
      locked_host += static_cast<int64_t>(n.host_pages_.size()) * page_size_;
    }
    if (n.ref_count_ > 0) {
      pinned_dev += static_cast<int64_t>(n.device_pages_.size()) * page_size_;
      pinned_host += static_cast<int64_t>(n.host_pages_.size()) * page_size_;
    }
  });
  if (dev_members != static_cast<int64_t>(device_set_.size()) ||
      host_members != static_cast<int64_t>(host_set_.size()) ||
      storage_members != static_cast<int64_t>(storage_set_.size())) {
    return Status::Internal(
        fmt::format("evictable sets hold {}, {} and {} entries for {}, {} and "
                    "{} members",
                    device_set_.size(), host_set_.size(), storage_set_.size(), dev_members,
                    host_members, storage_members));
  }
  if (locked_dev != locked_device_tokens_ || locked_host != locked_host_tokens_ ||
      storage_only != storage_only_tokens_ || pinned_dev != pinned_device_tokens_ ||
      pinned_host != pinned_host_tokens_) {
    return Status::Internal(fmt::format(
        "locked device {} host {} storage-only {}, recorded {} {} {}", locked_dev, locked_host,
        storage_only, locked_device_tokens_, locked_host_tokens_, storage_only_tokens_));
  }
  if (held_dev != held_device_tokens_ || retained != retained_tokens_) {
    return Status::Internal(fmt::format("held device {} retained {}/{}/{}, recorded {} {}/{}/{}",
                                        held_dev, retained[0], retained[1], retained[2],
                                        held_device_tokens_, retained_tokens_[0],
                                        retained_tokens_[1], retained_tokens_[2]));
  }
  return Status::OK();
}

}  // namespace kvtier
