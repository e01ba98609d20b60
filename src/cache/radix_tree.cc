// The paged radix tree (see cache/radix_tree.h).
//
// Bookkeeping kept incrementally, so no operation scans the tree:
//   device_children_ / host_children_  how many children are resident in each tier;
//   ref_count_                         pins through this node (IncRef walks to the root);
//   busy_                              operations in flight touching the node;
//   device_set_ / host_set_ /          the evictable nodes of each tier, ordered by policy key;
//   storage_set_                       Refresh(node) re-files one node after any change to it
//                                      or to its children counts;
//   the totals (tier tokens, stored,   Account(node, -1) before and Account(node, +1) after
//   storage-only, locked)              every change of a node's residency, pins or busy count.
#include "cache/radix_tree.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <limits>
#include <utility>

namespace kvtier {

namespace {
constexpr size_t kMaxPooledNodes = 4096;
constexpr int64_t kMaxPooledTokens = int64_t{1} << 22;  // 16 MiB of token buffers
}  // namespace

void RadixNode::Reset() {
  std::vector<Token> tokens = std::move(tokens_);
  tokens.clear();
  id_ = 0;
  parent_ = nullptr;
  child_key_ = 0;
  namespace_ = nullptr;
  tokens_ = std::move(tokens);
  prefix_tokens_ = 0;
  device_pages_.clear();
  host_pages_.clear();
  keys_.clear();
  stored_ = prefetching_ = storing_ = false;
  children_.Clear();
  device_children_ = host_children_ = 0;
  ref_count_ = hit_count_ = last_access_ = created_ = 0;
  priority_ = 0;
  busy_ = 0;
  retained_ = {};
  in_device_set_ = in_host_set_ = in_storage_set_ = false;
  device_key_ = host_key_ = storage_key_ = EvictionKey{};
}

RadixTree::RadixTree(int64_t page_size, std::shared_ptr<const EvictionPolicy> device_policy,
                     std::shared_ptr<const EvictionPolicy> host_policy)
    : page_size_(page_size < 1 ? 1 : page_size),
      device_policy_(device_policy ? std::move(device_policy)
                                   : MakeEvictionPolicy(EvictionPolicyKind::kLru)),
      host_policy_(host_policy ? std::move(host_policy)
                               : MakeEvictionPolicy(EvictionPolicyKind::kLru)),
      empty_root_(new RadixNode()) {
  empty_root_->id_ = next_id_++;
  empty_root_->namespace_ = &no_namespace_;
}

RadixTree::~RadixTree() {
  // The child maps do not own their nodes: delete every non-root node, children first.
  std::vector<RadixNode*> stack, order;
  for (auto& [name, root] : roots_) stack.push_back(root.get());
  while (!stack.empty()) {
    RadixNode* n = stack.back();
    stack.pop_back();
    n->children_.ForEach([&](uint64_t, RadixNode* c) { stack.push_back(c); });
    if (!n->is_root()) order.push_back(n);
  }
  for (RadixNode* n : order) delete n;
}

uint64_t RadixTree::PageHash(std::span<const Token> page) {
  uint64_t h = 0x9E3779B97F4A7C15ull ^ page.size();
  for (Token t : page) {
    h ^= static_cast<uint32_t>(t);
    h *= 0xBF58476D1CE4E5B9ull;
    h ^= h >> 31;
  }
  return h;
}

RadixNode* RadixTree::Root(std::string_view ns, bool create) {
  auto it = roots_.find(ns);
  if (it != roots_.end()) return it->second.get();
  if (!create) return nullptr;
  auto root = std::unique_ptr<RadixNode>(new RadixNode());
  root->id_ = next_id_++;
  auto [pos, inserted] = roots_.emplace(std::string(ns), std::move(root));
  pos->second->namespace_ = &pos->first;
  return pos->second.get();
}

const RadixNode* RadixTree::FindRoot(std::string_view ns) const {
  auto it = roots_.find(ns);
  return it == roots_.end() ? nullptr : it->second.get();
}

RadixNode* RadixTree::FindChild(const RadixNode* node, std::span<const Token> page) const {
  return node->children_.Find(PageHash(page), [&](const RadixNode* c) {
    return std::memcmp(c->tokens_.data(), page.data(), page.size() * sizeof(Token)) == 0;
  });
}

int64_t RadixTree::CommonPages(const RadixNode* node, std::span<const Token> tokens) const {
  const int64_t n =
      static_cast<int64_t>(std::min(node->tokens_.size(), tokens.size())) / page_size_ * page_size_;
  const Token* a = node->tokens_.data();
  const Token* b = tokens.data();
  // memcmp is vectorised; the common case (the whole overlap matches) is one call.
  if (std::memcmp(a, b, static_cast<size_t>(n) * sizeof(Token)) == 0) return n;
  int64_t k = 0;
  while (k < n && std::memcmp(a + k, b + k, static_cast<size_t>(page_size_) * sizeof(Token)) == 0) {
    k += page_size_;
  }
  return k;
}

// A reused node's buffer may be far larger than its tokens; give the excess back.
void RadixTree::FitTokens(RadixNode* node) {
  if (node->tokens_.capacity() > 2 * node->tokens_.size() + 256) node->tokens_.shrink_to_fit();
}

void RadixTree::Recycle(std::unique_ptr<RadixNode> node) {
  const int64_t capacity = static_cast<int64_t>(node->tokens_.capacity());
  if (pool_.size() >= kMaxPooledNodes || pooled_tokens_ + capacity > kMaxPooledTokens) return;
  node->Reset();
  pooled_tokens_ += capacity;
  pool_.push_back(std::move(node));
}

RadixNode* RadixTree::NewNode(RadixNode* parent) {
  RadixNode* node;
  if (!pool_.empty()) {
    node = pool_.back().release();
    pool_.pop_back();
    pooled_tokens_ -= static_cast<int64_t>(node->tokens_.capacity());
  } else {
    node = new RadixNode();
  }
  node->id_ = next_id_++;
  node->parent_ = parent;
  node->namespace_ = parent->namespace_;
  ++num_nodes_;
  return node;
}

RadixNode* RadixTree::AddLeaf(RadixNode* parent, std::span<const Token> tokens,
                              std::span<const PageKey> keys) {
  RadixNode* leaf = NewNode(parent);
  leaf->tokens_.assign(tokens.begin(), tokens.end());
  FitTokens(leaf);
  leaf->prefix_tokens_ = parent->prefix_tokens_ + static_cast<int64_t>(tokens.size());
  leaf->created_ = leaf->last_access_ = ++clock_;
  leaf->child_key_ = PageHash(tokens.first(static_cast<size_t>(page_size_)));
  leaf->keys_.assign(keys.begin(), keys.end());
  parent->children_.Insert(leaf->child_key_, leaf);
  return leaf;
}

RadixNode* RadixTree::Split(RadixNode* lower, int64_t k) {
  Account(lower, -1);
  RadixNode* parent = lower->parent_;
  const uint64_t key = lower->child_key_;
  RadixNode* upper = NewNode(parent);
  upper->tokens_.assign(lower->tokens_.begin(), lower->tokens_.begin() + k);
  FitTokens(upper);
  lower->tokens_.erase(lower->tokens_.begin(), lower->tokens_.begin() + k);
  upper->prefix_tokens_ = lower->prefix_tokens_ - static_cast<int64_t>(lower->tokens_.size());
  const int64_t pages = k / page_size_;
  auto split_vec = [pages](auto& from, auto& to) {
    if (from.empty()) return;
    to.assign(from.begin(), from.begin() + pages);
    from.erase(from.begin(), from.begin() + pages);
  };
  split_vec(lower->device_pages_, upper->device_pages_);
  split_vec(lower->host_pages_, upper->host_pages_);
  split_vec(lower->keys_, upper->keys_);
  upper->stored_ = lower->stored_;
  upper->prefetching_ = lower->prefetching_;
  upper->storing_ = lower->storing_;
  upper->ref_count_ = lower->ref_count_;
  upper->hit_count_ = lower->hit_count_;
  upper->last_access_ = lower->last_access_;
  upper->created_ = lower->created_;
  upper->priority_ = lower->priority_;
  upper->busy_ = lower->busy_;
  upper->retained_ = lower->retained_;
  upper->device_children_ = lower->on_device() ? 1 : 0;
  upper->host_children_ = lower->on_host() ? 1 : 0;
  // Re-link: parent -> upper -> lower. The parent's tier counts are unchanged (upper has the
  // residency lower had).
  lower->parent_ = upper;
  upper->child_key_ = key;
  lower->child_key_ = PageHash(std::span<const Token>(lower->tokens_).first(page_size_));
  upper->children_.Insert(lower->child_key_, lower);
  parent->children_.Replace(key, lower, upper);
  Account(lower, +1);
  Account(upper, +1);
  Refresh(lower);  // its key is unchanged, but its tier counts may differ from upper's
  Refresh(upper);
  if (split_hook_) split_hook_(upper, lower);
  return upper;
}

RadixNode* RadixTree::SplitAfter(RadixNode* node, int64_t keep_pages) {
  if (keep_pages <= 0) return node;
  Split(node, keep_pages * page_size_);
  return node;
}

RadixTree::MatchResult RadixTree::Match(std::string_view ns, std::span<const Token> tokens) {
  RadixNode* node = Root(ns, /*create=*/false);
  MatchResult r;
  if (node == nullptr) node = empty_root_.get();
  r.last = node;
  int64_t pos = 0;
  const int64_t n = static_cast<int64_t>(tokens.size());
  int tier = 0;  // 0 device, 1 host, 2 storage: the part of the match being walked
  while (pos + page_size_ <= n) {
    RadixNode* child = FindChild(node, tokens.subspan(pos, page_size_));
    if (child == nullptr) break;
    const int child_tier = child->on_device() ? 0 : child->on_host() ? 1 : child->stored_ ? 2 : 3;
    if (child_tier == 3 || child_tier < tier) break;  // an orphan (or out of order) ends it
    tier = child_tier;
    const int64_t k = CommonPages(child, tokens.subspan(pos));
    const bool partial = k < child->num_tokens();
    if (partial) child = Split(child, k);
    (tier == 0 ? r.device_tokens : tier == 1 ? r.host_tokens : r.storage_tokens) += k;
    pos += k;
    node = child;
    if (partial) break;
  }
  r.last = node;
  r.matched_tokens = pos;
  return r;
}

RadixTree::MatchResult RadixTree::Peek(std::string_view ns, std::span<const Token> tokens) const {
  MatchResult r;
  const RadixNode* node = FindRoot(ns);
  if (node == nullptr) return r;
  int64_t pos = 0;
  const int64_t n = static_cast<int64_t>(tokens.size());
  int tier = 0;
  while (pos + page_size_ <= n) {
    RadixNode* child = FindChild(node, tokens.subspan(pos, page_size_));
    if (child == nullptr) break;
    const int child_tier = child->on_device() ? 0 : child->on_host() ? 1 : child->stored_ ? 2 : 3;
    if (child_tier == 3 || child_tier < tier) break;
    tier = child_tier;
    const int64_t k = CommonPages(child, tokens.subspan(pos));
    (tier == 0 ? r.device_tokens : tier == 1 ? r.host_tokens : r.storage_tokens) += k;
    pos += k;
    node = child;
    if (k < child->num_tokens()) break;
  }
  r.last = const_cast<RadixNode*>(node);
  r.matched_tokens = pos;
  return r;
}

void RadixTree::Insert(std::string_view ns, std::span<const Token> tokens,
                       std::span<const int64_t> device_pages, std::span<const PageKey> keys,
                       std::vector<InsertSegment>* segments) {
  if (tokens.empty()) return;
  RadixNode* node = Root(ns, /*create=*/true);
  int64_t pos = 0;
  const int64_t n = static_cast<int64_t>(tokens.size());
  auto keys_of = [&](int64_t begin, int64_t end) {
    return std::vector<PageKey>(keys.begin() + begin / page_size_, keys.begin() + end / page_size_);
  };
  while (pos < n) {
    RadixNode* child = FindChild(node, tokens.subspan(pos, page_size_));
    if (child == nullptr) {
      RadixNode* leaf =
          AddLeaf(node, tokens.subspan(pos),
                  keys.empty() ? std::span<const PageKey>()
                               : keys.subspan(pos / page_size_, n / page_size_ - pos / page_size_));
      leaf->hit_count_ = 1;
      SetDevicePages(
          leaf, std::vector<int64_t>(device_pages.begin() + pos / page_size_, device_pages.end()));
      if (segments) segments->push_back({leaf, pos, n, SegmentKind::kNew});
      return;
    }
    const int64_t k = CommonPages(child, tokens.subspan(pos));
    if (k < child->num_tokens()) child = Split(child, k);
    if (!keys.empty() && child->keys_.empty()) child->keys_ = keys_of(pos, pos + k);
    if (child->on_device()) {
      if (segments) segments->push_back({child, pos, pos + k, SegmentKind::kOnDevice});
    } else {
      SetDevicePages(child, std::vector<int64_t>(device_pages.begin() + pos / page_size_,
                                                 device_pages.begin() + (pos + k) / page_size_));
      if (segments) segments->push_back({child, pos, pos + k, SegmentKind::kRevived});
    }
    pos += k;
    node = child;
  }
}

RadixNode* RadixTree::AddStored(RadixNode* from, std::string_view ns, std::span<const Token> tokens,
                                std::span<const PageKey> keys) {
  if (tokens.empty()) return from != nullptr ? from : Root(ns, /*create=*/false);
  RadixNode* node = from != nullptr ? from : Root(ns, /*create=*/true);
  int64_t pos = 0;
  const int64_t n = static_cast<int64_t>(tokens.size());
  while (pos < n) {
    RadixNode* child = FindChild(node, tokens.subspan(pos, page_size_));
    if (child == nullptr) {
      RadixNode* leaf = AddLeaf(node, tokens.subspan(pos), keys.subspan(pos / page_size_));
      SetStored(leaf, true);
      return leaf;
    }
    const int64_t k = CommonPages(child, tokens.subspan(pos));
    if (k < child->num_tokens()) child = Split(child, k);
    if (child->keys_.empty()) {
      child->keys_.assign(keys.begin() + pos / page_size_, keys.begin() + (pos + k) / page_size_);
    }
    SetStored(child, true);
    pos += k;
    node = child;
  }
  return node;
}

RadixNode* RadixTree::AddHostLeaf(RadixNode* from, std::string_view ns,
                                  std::span<const Token> tokens, std::span<const PageKey> keys,
                                  std::vector<int64_t> host_pages) {
  RadixNode* node = from != nullptr ? from : Root(ns, /*create=*/true);
  if (FindChild(node, tokens.first(static_cast<size_t>(page_size_))) != nullptr) return nullptr;
  RadixNode* leaf = AddLeaf(node, tokens, keys);
  SetHostPages(leaf, std::move(host_pages));
  return leaf;
}

void RadixTree::Account(const RadixNode* n, int sign) {
  const int64_t dev = static_cast<int64_t>(n->device_pages_.size()) * page_size_;
  const int64_t host = static_cast<int64_t>(n->host_pages_.size()) * page_size_;
  device_tokens_ += sign * dev;
  host_tokens_ += sign * host;
  if (n->stored_) stored_tokens_ += sign * n->num_tokens();
  if (n->storage_only()) storage_only_tokens_ += sign * n->num_tokens();
  if (n->ref_count_ > 0 || n->busy_ > 0 || n->retained_[0] > 0) locked_device_tokens_ += sign * dev;
  if (n->ref_count_ > 0 || n->busy_ > 0 || n->storing_ || n->retained_[1] > 0) {
    locked_host_tokens_ += sign * host;
  }
  if (n->ref_count_ > 0) {
    pinned_device_tokens_ += sign * dev;
    pinned_host_tokens_ += sign * host;
  }
  if (n->ref_count_ > 0 || n->retained_[0] > 0) held_device_tokens_ += sign * dev;
  for (size_t t = 0; t < n->retained_.size(); ++t) {
    if (n->retained_[t] > 0) retained_tokens_[t] += sign * n->num_tokens();
  }
}

std::vector<int64_t> RadixTree::ReplacePages(RadixNode* node,
                                             std::vector<int64_t> RadixNode::*pages,
                                             int64_t RadixNode::*children,
                                             std::vector<int64_t> replacement) {
  Account(node, -1);
  std::vector<int64_t> old = std::exchange(node->*pages, std::move(replacement));
  Account(node, +1);
  if (old.empty() != (node->*pages).empty()) {  // an empty list takes the node off the tier
    node->parent_->*children += old.empty() ? 1 : -1;
    Refresh(node->parent_);
  }
  Refresh(node);
  if (old.empty() != (node->*pages).empty()) {
    TierChanged(*node, pages == &RadixNode::device_pages_ ? Tier::kDevice : Tier::kHost,
                old.empty());
  }
  return old;
}

void RadixTree::SetDevicePages(RadixNode* node, std::vector<int64_t> pages) {
  ReplacePages(node, &RadixNode::device_pages_, &RadixNode::device_children_, std::move(pages));
}

void RadixTree::TakeDevicePages(RadixNode* node, std::vector<int64_t>* out) {
  if (node->device_pages_.empty()) return;
  Account(node, -1);
  out->insert(out->end(), node->device_pages_.begin(), node->device_pages_.end());
  node->device_pages_.clear();  // keeps the buffer for when the node comes back
  Account(node, +1);
  --node->parent_->device_children_;
  Refresh(node->parent_);
  Refresh(node);
  TierChanged(*node, Tier::kDevice, false);
}

void RadixTree::SetHostPages(RadixNode* node, std::vector<int64_t> pages) {
  ReplacePages(node, &RadixNode::host_pages_, &RadixNode::host_children_, std::move(pages));
}

std::vector<int64_t> RadixTree::TakeHostPages(RadixNode* node) {
  return ReplacePages(node, &RadixNode::host_pages_, &RadixNode::host_children_, {});
}

void RadixTree::SetStored(RadixNode* node, bool stored) {
  if (node->stored_ == stored) return;
  Account(node, -1);
  node->stored_ = stored;
  Account(node, +1);
  Refresh(node);
  TierChanged(*node, Tier::kStorage, stored);
}

void RadixTree::SetStoring(RadixNode* node, bool on) {
  if (node->storing_ == on) return;
  Account(node, -1);
  node->storing_ = on;
  Account(node, +1);
  Refresh(node);
}

void RadixTree::SetKeys(RadixNode* node, std::vector<PageKey> keys) {
  node->keys_ = std::move(keys);
}

void RadixTree::RemoveSubtree(RadixNode* node, int64_t* removed_stored_tokens) {
  std::vector<RadixNode*> stack = {node}, order;
  while (!stack.empty()) {
    RadixNode* n = stack.back();
    stack.pop_back();
    order.push_back(n);
    n->children_.ForEach([&](uint64_t, RadixNode* c) { stack.push_back(c); });
  }
  RadixNode* parent = node->parent_;
  parent->children_.Erase(node->child_key_, node);
  for (auto it = order.rbegin(); it != order.rend(); ++it) {  // children before parents
    RadixNode* n = *it;
    if (removed_stored_tokens != nullptr && n->stored_) *removed_stored_tokens += n->num_tokens();
    LeavingTree(*n);
    Account(n, -1);
    if (n->in_device_set_) device_set_.erase({n->device_key_, n->id_, n});
    if (n->in_host_set_) host_set_.erase({n->host_key_, n->id_, n});
    if (n->in_storage_set_) storage_set_.erase({n->storage_key_, n->id_, n});
    Recycle(std::unique_ptr<RadixNode>(n));  // or deletes it
    --num_nodes_;
  }
  if (parent->is_root()) {
    if (parent->children_.empty()) {
      auto root = roots_.find(*parent->namespace_);
      if (root != roots_.end() && root->second.get() == parent) roots_.erase(root);
    }
  } else {
    Refresh(parent);
  }
}

void RadixTree::LeavingTree(const RadixNode& node) {
  if (!tier_hook_) return;
  if (node.on_device()) tier_hook_(node, Tier::kDevice, false);
  if (node.on_host()) tier_hook_(node, Tier::kHost, false);
  if (node.stored_) tier_hook_(node, Tier::kStorage, false);
}

bool RadixTree::DropDeviceLeaf(RadixNode* node, std::vector<int64_t>* out) {
  if (!node->children_.empty() || !node->on_device() || node->on_host() || node->stored_ ||
      node->storing_ || node->prefetching_ || node->ref_count_ > 0 || node->busy_ > 0 ||
      node->retained_anywhere()) {
    return false;
  }
  LeavingTree(*node);
  Account(node, -1);
  if (node->in_device_set_) device_set_.erase({node->device_key_, node->id_, node});
  if (node->in_host_set_) host_set_.erase({node->host_key_, node->id_, node});
  if (node->in_storage_set_) storage_set_.erase({node->storage_key_, node->id_, node});
  out->insert(out->end(), node->device_pages_.begin(), node->device_pages_.end());
  RadixNode* parent = node->parent_;
  --parent->device_children_;
  parent->children_.Erase(node->child_key_, node);
  Recycle(std::unique_ptr<RadixNode>(node));  // or deletes it
  --num_nodes_;
  if (!parent->is_root()) {
    Refresh(parent);
  } else if (parent->children_.empty()) {
    auto root = roots_.find(*parent->namespace_);
    if (root != roots_.end() && root->second.get() == parent) roots_.erase(root);
  }
  return true;
}

void RadixTree::IncRef(RadixNode* node) { AddRef(node, +1); }

void RadixTree::DecRef(RadixNode* node) { AddRef(node, -1); }

// A node's accounting (Account) and eviction candidacy (Refresh) change only when its count
// crosses zero; other steps touch the count alone.
void RadixTree::AddRef(RadixNode* node, int delta) {
  for (RadixNode* n = node; n != nullptr && !n->is_root(); n = n->parent_) {
    if ((n->ref_count_ == 0) == (n->ref_count_ + delta == 0)) {
      n->ref_count_ += delta;
      continue;
    }
    Account(n, -1);
    n->ref_count_ += delta;
    Account(n, +1);
    Refresh(n);
  }
}

void RadixTree::Retain(RadixNode* node, uint8_t tiers, int delta) {
  for (RadixNode* n = node; n != nullptr && !n->is_root(); n = n->parent_) {
    Account(n, -1);
    for (size_t t = 0; t < n->retained_.size(); ++t) {
      if ((tiers & (1u << t)) != 0) n->retained_[t] += delta;
    }
    Account(n, +1);
    Refresh(n);
  }
}

int64_t RadixTree::RetainCost(const RadixNode* node, Tier tier) const {
  int64_t tokens = 0;
  for (const RadixNode* n = node; n != nullptr && !n->is_root(); n = n->parent_) {
    if (n->retained_[static_cast<size_t>(tier)] == 0) tokens += n->num_tokens();
  }
  return tokens;
}

void RadixTree::AddBusy(RadixNode* node) {
  Account(node, -1);
  ++node->busy_;
  Account(node, +1);
  if (node->busy_ == 1) Refresh(node);
}

void RadixTree::RemoveBusy(RadixNode* node) {
  Account(node, -1);
  --node->busy_;
  Account(node, +1);
  if (node->busy_ == 0) Refresh(node);
}

void RadixTree::Touch(RadixNode* node, int64_t hits) {
  if (node->is_root()) return;
  node->last_access_ = ++clock_;
  node->hit_count_ += hits;
  if (node->in_device_set_ || node->in_host_set_ || node->in_storage_set_) Refresh(node);
}

void RadixTree::RaisePriority(RadixNode* node, int32_t priority) {
  if (node->is_root() || priority <= node->priority_) return;
  node->priority_ = priority;
  if (node->in_device_set_ || node->in_host_set_) Refresh(node);
}

EvictionStats RadixTree::StatsOf(const RadixNode* n) const {
  return {n->last_access_, n->created_, n->hit_count_, n->priority_};
}

RadixTree::Wanted RadixTree::WantedSets(const RadixNode* n) {
  const bool idle = n->ref_count_ == 0 && n->busy_ == 0;
  Wanted w;
  w.device = idle && n->retained_[0] == 0 && n->on_device() && n->device_children_ == 0;
  w.host = idle && n->retained_[1] == 0 && !n->storing_ && n->on_host() && !n->on_device() &&
           n->host_children_ == 0;
  // Retained in any tier: kept in the tree (a pin's nodes outlive their pages).
  w.storage = idle && !n->retained_anywhere() && !n->storing_ && !n->on_host() && !n->on_device() &&
              n->children_.empty();
  return w;
}

void RadixTree::Refresh(RadixNode* n) {
  if (n->is_root()) return;
  const auto [dev, host, storage] = WantedSets(n);
  // Set nodes are moved between and within the sets as node handles, so re-filing a node
  // (a touch, or a device eviction that keeps the host copy) allocates and frees nothing.
  std::set<SetEntry>::node_type spare;
  auto take = [&](bool& member, std::set<SetEntry>& set, const EvictionKey& key) {
    if (!member) return;
    auto h = set.extract({key, n->id_, n});
    if (!spare) spare = std::move(h);
    member = false;
  };
  take(n->in_device_set_, device_set_, n->device_key_);
  take(n->in_host_set_, host_set_, n->host_key_);
  take(n->in_storage_set_, storage_set_, n->storage_key_);
  auto file = [&spare](std::set<SetEntry>& set, const SetEntry& entry) {
    if (spare) {
      spare.value() = entry;
      set.insert(std::move(spare));
    } else {
      set.insert(entry);
    }
  };
  if (dev) {
    n->device_key_ = device_policy_->Key(StatsOf(n));
    file(device_set_, {n->device_key_, n->id_, n});
    n->in_device_set_ = true;
  }
  if (host) {
    n->host_key_ = host_policy_->Key(StatsOf(n));
    file(host_set_, {n->host_key_, n->id_, n});
    n->in_host_set_ = true;
  }
  if (storage) {
    // Orphans first (their pages are gone), then the least recently used.
    n->storage_key_ = n->stored_ ? EvictionKey{n->last_access_, n->created_}
                                 : EvictionKey{std::numeric_limits<int64_t>::min(), 0};
    file(storage_set_, {n->storage_key_, n->id_, n});
    n->in_storage_set_ = true;
  }
}

RadixNode* RadixTree::DeviceVictim() const {
  return device_set_.empty() ? nullptr : device_set_.begin()->node;
}

void RadixTree::PrefetchDeviceVictims() const {
  auto it = device_set_.begin();
  if (it == device_set_.end() || ++it == device_set_.end()) return;
  // The next victim: its node was prefetched one round ago; fetch its page list now.
  const RadixNode* next = it->node;
  const char* pages = reinterpret_cast<const char*>(next->device_pages_.data());
  const size_t bytes = next->device_pages_.size() * sizeof(int64_t);
  for (size_t off = 0; off < bytes && off < 1024; off += 64) __builtin_prefetch(pages + off);
  if (++it == device_set_.end()) return;
  const char* node = reinterpret_cast<const char*>(it->node);
  for (size_t off = 0; off < sizeof(RadixNode); off += 64) __builtin_prefetch(node + off);
}

RadixNode* RadixTree::HostVictim() const {
  return host_set_.empty() ? nullptr : host_set_.begin()->node;
}

RadixNode* RadixTree::StorageVictim() const {
  return storage_set_.empty() ? nullptr : storage_set_.begin()->node;
}

std::vector<Token> RadixTree::PrefixTokens(const RadixNode* node) const {
  std::vector<Token> out(static_cast<size_t>(node->prefix_tokens_));
  size_t end = out.size();
  for (const RadixNode* n = node; !n->is_root(); n = n->parent_) {
    end -= n->tokens_.size();
    std::copy(n->tokens_.begin(), n->tokens_.end(), out.begin() + end);
  }
  return out;
}

const PageKey* RadixTree::KeyBefore(const RadixNode* node) const {
  const RadixNode* p = node->parent_;
  if (p == nullptr || p->is_root() || p->keys_.empty()) return nullptr;
  return &p->keys_.back();
}

void RadixTree::ForEachNode(const std::function<void(const RadixNode&)>& fn) const {
  std::vector<const RadixNode*> stack;
  for (const auto& [name, root] : roots_) stack.push_back(root.get());
  while (!stack.empty()) {
    const RadixNode* n = stack.back();
    stack.pop_back();
    if (!n->is_root()) fn(*n);
    n->children_.ForEach([&](uint64_t, RadixNode* c) { stack.push_back(c); });
  }
}

}  // namespace kvtier
