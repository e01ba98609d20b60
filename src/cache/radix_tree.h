// Internal: the paged radix tree over token ids that indexes cached KV in three tiers.
//
// Each namespace (a tenant) has its own root, so prefixes never match across namespaces; a root
// exists while it has children. A node holds a span of tokens (a non-empty multiple of
// page_size) and, per tier, where their KV lives, one entry per page: the page's first device
// slot and/or first host slot (a page is page_size consecutive slots starting at a multiple of
// page_size), whether storage holds the pages (`stored`), and the pages' storage keys (chained,
// kvtier/page_key.h; empty without a storage tier). Children are keyed by a hash of their first
// page and verified token by token. Matching and inserting walk page by page and split a node
// where a match ends inside it; eviction splits a node when only its tail goes.
//
// Invariants (checked by CheckInvariants in radix_tree_check.cc):
//   - a non-root node is resident somewhere (device, host or storage), or is an orphan (its
//     storage copy was reported gone) that is pinned, retained or waits in the storage set to be
//     removed;
//   - device residency is prefix-closed (a node on the device has its parent on the device), and
//     so is host residency (backups form a contiguous prefix);
//   - a node's reference count is at least the sum of its children's (IncRef pins a node and all
//     its ancestors), and only unreferenced, idle (busy == 0) nodes are evictable;
//   - so is each tier's retention count (Retain, HierarchicalCache::Pin): a node retained in a
//     tier is evictable from no tier it names, and a node retained in any tier stays in the tree
//     (in no removable set) until released;
//   - the device set holds exactly the evictable nodes on the device with no child on the device;
//     the host set the evictable nodes in host memory, not on the device, with no child in host
//     memory; the storage set the evictable nodes on neither (storage-only or orphans) with no
//     children. The first two are ordered by their tier's EvictionPolicy key, the storage set
//     orphans first, then least recently used;
//   - locked_device_tokens / locked_host_tokens are the tier tokens of referenced, busy or
//     retained (in that tier) nodes (host: or storing); retained_tokens(t) the tokens of nodes
//     retained in tier t, wherever they are.
//
// Thread safety: none; the owner (the cache) serialises every call.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "cache/child_map.h"
#include "kvtier/eviction_policy.h"
#include "kvtier/page_key.h"
#include "kvtier/status.h"
#include "kvtier/token.h"

namespace kvtier {

class RadixNode {
 public:
  RadixNode(const RadixNode&) = delete;
  RadixNode& operator=(const RadixNode&) = delete;

  uint64_t id() const { return id_; }
  bool is_root() const { return parent_ == nullptr; }
  const RadixNode* parent() const { return parent_; }
  RadixNode* parent() { return parent_; }
  std::span<const Token> tokens() const { return tokens_; }
  int64_t num_tokens() const { return static_cast<int64_t>(tokens_.size()); }
  // Tokens from the namespace root through the end of this node.
  int64_t prefix_tokens() const { return prefix_tokens_; }
  const std::string& name_space() const { return *namespace_; }

  bool on_device() const { return !device_pages_.empty(); }
  bool on_host() const { return !host_pages_.empty(); }
  bool stored() const { return stored_; }
  bool storage_only() const { return stored_ && !on_device() && !on_host(); }
  bool resident() const { return stored_ || on_device() || on_host(); }
  // First slot of each page of the node, in the device pool / the host pool (empty when absent).
  std::span<const int64_t> device_pages() const { return device_pages_; }
  std::span<const int64_t> host_pages() const { return host_pages_; }
  // One key per page, or empty (no storage tier).
  std::span<const PageKey> keys() const { return keys_; }

  int64_t ref_count() const { return ref_count_; }
  int64_t hit_count() const { return hit_count_; }
  int64_t last_access() const { return last_access_; }
  int64_t created() const { return created_; }
  int32_t priority() const { return priority_; }
  // Operations in flight touching the node (copies, prefetches, storage writes).
  int32_t busy() const { return busy_; }
  bool prefetching() const { return prefetching_; }
  bool storing() const { return storing_; }
  // Retentions of the node in tier `tier` (0 device, 1 host, 2 storage; RadixTree::Retain).
  int32_t retained(size_t tier) const { return retained_[tier]; }
  bool retained_anywhere() const {
    return retained_[0] > 0 || retained_[1] > 0 || retained_[2] > 0;
  }
  size_t num_children() const { return children_.size(); }
  int64_t device_children() const { return device_children_; }
  int64_t host_children() const { return host_children_; }
  // fn(child) for every child.
  template <typename Fn>
  void ForEachChild(Fn&& fn) const {
    children_.ForEach([&](uint64_t, RadixNode* c) { fn(c); });
  }

 private:
  friend class RadixTree;
  RadixNode() = default;
  // Back to a default node, keeping the token buffer's capacity (for the tree's node pool).
  void Reset();

  uint64_t id_ = 0;
  RadixNode* parent_ = nullptr;
  uint64_t child_key_ = 0;  // PageHash of the first page: the key in the parent's children_
  const std::string* namespace_ = nullptr;  // owned by the tree's root map
  std::vector<Token> tokens_;
  int64_t prefix_tokens_ = 0;
  std::vector<int64_t> device_pages_;  // empty, or one page start per page
  std::vector<int64_t> host_pages_;    // empty, or one page start per page
  std::vector<PageKey> keys_;          // empty, or one per page
  bool stored_ = false;
  bool prefetching_ = false;
  bool storing_ = false;
  // Keyed by the hash of the child's first page. The tree owns the nodes.
  detail::ChildMap children_;
  int64_t device_children_ = 0;  // children on the device
  int64_t host_children_ = 0;    // children in host memory
  int64_t ref_count_ = 0;
  int64_t hit_count_ = 0;
  int64_t last_access_ = 0;
  int64_t created_ = 0;
  int32_t priority_ = 0;
  int32_t busy_ = 0;
  std::array<int32_t, 3> retained_{};  // per tier (RadixTree::Tier)
  // Membership in the tree's evictable sets and the key it is filed under.
  bool in_device_set_ = false;
  bool in_host_set_ = false;
  bool in_storage_set_ = false;
  EvictionKey device_key_;
  EvictionKey host_key_;
  EvictionKey storage_key_;
};

class RadixTree {
 public:
  // REQUIRES: page_size >= 1. Null policies mean LRU.
  RadixTree(int64_t page_size, std::shared_ptr<const EvictionPolicy> device_policy = nullptr,
            std::shared_ptr<const EvictionPolicy> host_policy = nullptr);
  ~RadixTree();
  RadixTree(const RadixTree&) = delete;
  RadixTree& operator=(const RadixTree&) = delete;

  int64_t page_size() const { return page_size_; }
  // Namespaces that hold nodes.
  int64_t num_namespaces() const { return static_cast<int64_t>(roots_.size()); }

  struct MatchResult {
    RadixNode* last = nullptr;   // deepest matched node; a root when nothing matched
    int64_t matched_tokens = 0;  // page-aligned; == last->prefix_tokens() after Match
    int64_t device_tokens = 0;   // leading matched tokens whose KV is on the device
    int64_t host_tokens = 0;     // then: in host memory (not on the device)
    int64_t storage_tokens = 0;  // then: in storage only
  };

  // The longest resident page-aligned prefix of `tokens` in namespace `ns` (orphans end it).
  // Splits the node in which the match ends, so the match ends exactly at `last`'s end. Touches
  // nothing else (no access times, no hit counts). A namespace that does not exist matches
  // nothing, with `last` a shared empty root of no namespace: matching never creates a
  // namespace. A root `last` may be removed by a later change; do not keep it.
  MatchResult Match(std::string_view ns, std::span<const Token> tokens);
  // Like Match but changes nothing: `last` may extend past matched_tokens; null when the
  // namespace does not exist.
  MatchResult Peek(std::string_view ns, std::span<const Token> tokens) const;

  enum class SegmentKind : uint8_t {
    kOnDevice,  // already on the device: the node keeps its slots
    kRevived,   // was not on the device: the node took the given device slots
    kNew,       // a new leaf holding the given device slots
  };
  struct InsertSegment {
    RadixNode* node;
    int64_t begin;  // token range of `tokens` this node covers
    int64_t end;
    SegmentKind kind;
  };
  // Inserts `tokens` with their device pages (first slot of each page) and, when not empty, their
  // page keys (one per page; nodes that lack keys get them); see SegmentKind for what happens to
  // each part. Segments are appended to `segments` top-down. New nodes get hit_count 1. Creates
  // nothing for empty `tokens`. REQUIRES: tokens.size() == device_pages.size() * page_size.
  void Insert(std::string_view ns, std::span<const Token> tokens,
              std::span<const int64_t> device_pages, std::span<const PageKey> keys,
              std::vector<InsertSegment>* segments);
  // Walks from `from` (a node, or a root; null: the root of `ns`, created if needed) along
  // `tokens` (whole pages following `from`), marking every node on the way stored and creating
  // a storage-only leaf with `keys` for the rest. Returns the deepest node (`from` when `tokens`
  // is empty). REQUIRES: keys.size() == tokens.size() / page_size.
  RadixNode* AddStored(RadixNode* from, std::string_view ns, std::span<const Token> tokens,
                       std::span<const PageKey> keys);

  // A new leaf after `from` (a node, or null: the root of `ns`, created if needed) holding
  // `tokens` (whole pages) in host memory at `host_pages`, with `keys` (one per page). Returns
  // null (nothing changes) when a child of `from` starts with the same page already.
  // REQUIRES: `from` is in host memory or a root; sizes agree; tokens not empty.
  RadixNode* AddHostLeaf(RadixNode* from, std::string_view ns, std::span<const Token> tokens,
                         std::span<const PageKey> keys, std::vector<int64_t> host_pages);

  // ---- residency (each keeps the counts and the evictable sets right) --------------------
  // REQUIRES: pages.size() == node's pages; the parent is on the device (or the root).
  void SetDevicePages(RadixNode* node, std::vector<int64_t> pages);
  // Moves the device pages out, appending them to `out`. REQUIRES: no child on the device.
  void TakeDevicePages(RadixNode* node, std::vector<int64_t>* out);
  std::vector<int64_t> TakeDevicePages(RadixNode* node) {
    std::vector<int64_t> out;
    TakeDevicePages(node, &out);
    return out;
  }
  // REQUIRES: pages.size() == node's pages; the parent is in host memory (or the root).
  void SetHostPages(RadixNode* node, std::vector<int64_t> pages);
  // REQUIRES: no child in host memory.
  std::vector<int64_t> TakeHostPages(RadixNode* node);
  void SetStored(RadixNode* node, bool stored);
  // REQUIRES: keys.size() == pages of node.
  void SetKeys(RadixNode* node, std::vector<PageKey> keys);
  // Deletes `node` and its whole subtree. REQUIRES: not a root; no node of the subtree is on the
  // device, in host memory, referenced or busy. Removes the namespace when its root is left
  // without children. Appends the removed nodes' tokens count to *removed_tokens if given.
  void RemoveSubtree(RadixNode* node, int64_t* removed_stored_tokens = nullptr);
  // Device eviction of a leaf that goes nowhere else: when `node` has no children, no host copy,
  // is not known to storage, and nothing pins, fills or stores it, appends its device pages to
  // `out`, deletes it and returns true (TakeDevicePages + RemoveSubtree in one step, without
  // filing the node anywhere in between). Otherwise changes nothing and returns false.
  bool DropDeviceLeaf(RadixNode* node, std::vector<int64_t>* out);

  // ---- references, statistics, operations in flight --------------------------------------
  // Pins `node` and all its ancestors (the namespace root excluded).
  void IncRef(RadixNode* node);
  // REQUIRES: a matching IncRef.
  void DecRef(RadixNode* node);
  // Access: last_access = a new tick of the logical clock. Adds `hits` to hit_count.
  void Touch(RadixNode* node, int64_t hits);
  void RaisePriority(RadixNode* node, int32_t priority);
  void AddBusy(RadixNode* node);
  // REQUIRES: a matching AddBusy.
  void RemoveBusy(RadixNode* node);
  void SetPrefetching(RadixNode* node, bool on) { node->prefetching_ = on; }
  // A node being written to storage keeps its host pages (not host-evictable, not forgotten);
  // its device copy may still go.
  void SetStoring(RadixNode* node, bool on);
  // Called as hook(upper, lower) after a split: `upper` is the new node holding the first part of
  // `lower`'s old tokens; `lower` keeps its identity (handles pointing at it stay valid). Both
  // carry the old node's busy count, flags, references and statistics.
  void SetSplitHook(std::function<void(RadixNode* upper, RadixNode* lower)> hook) {
    split_hook_ = std::move(hook);
  }
  // Splits `node` after its first `keep_pages` pages; returns the lower part (which keeps the
  // node's identity), or `node` itself when keep_pages == 0. REQUIRES: 0 <= keep_pages < pages.
  RadixNode* SplitAfter(RadixNode* node, int64_t keep_pages);

  // ---- tier changes (KV events) -----------------------------------------------------------
  enum class Tier : uint8_t { kDevice = 0, kHost = 1, kStorage = 2 };
  // Called for every node that enters or leaves a tier, synchronously, after the change: device
  // or host pages set on a node that had none, or taken from it; `stored` turned on or off; a
  // node removed from the tree (once per tier it was in, before it is recycled). The node's
  // tokens and keys are those of the pages that moved. Splits call nothing: they move pages
  // between two nodes without changing any tier's set of pages.
  using TierHook = std::function<void(const RadixNode& node, Tier tier, bool entered)>;
  void SetTierHook(TierHook hook) { tier_hook_ = std::move(hook); }

  // ---- retention (HierarchicalCache::Pin) --------------------------------------------------
  // Bit (1 << tier) of a tier set.
  static constexpr uint8_t TierBit(Tier tier) {
    return static_cast<uint8_t>(1u << static_cast<unsigned>(tier));
  }
  // Adds (delta +1) or removes (-1) one retention of `node` and all its ancestors (the namespace
  // root excluded) in each tier of `tiers` (TierBit). A node retained in a tier is evictable from
  // no tier of those: it stays there while it is there (retention copies nothing into a tier).
  // A node retained in any tier stays in the tree until released, resident nowhere (an orphan)
  // if its pages leave every tier. Calls no hook: residency does not change.
  // REQUIRES: delta -1 only for a matching +1 on the same node and tiers.
  void Retain(RadixNode* node, uint8_t tiers, int delta);
  // Tokens of `node` and its ancestors not retained in `tier` yet: what retaining `node` there
  // would add to retained_tokens(tier).
  int64_t RetainCost(const RadixNode* node, Tier tier) const;
  int64_t retained_tokens(Tier tier) const { return retained_tokens_[static_cast<size_t>(tier)]; }

  // ---- eviction ---------------------------------------------------------------------------
  // The evictable node that goes first, or null.
  RadixNode* DeviceVictim() const;
  // A hint for eviction loops: prefetches the page list of the device victim after the first and
  // the node after that. Eviction is bound by cache misses on nodes last touched long ago.
  // Changes nothing.
  void PrefetchDeviceVictims() const;
  RadixNode* HostVictim() const;
  RadixNode* StorageVictim() const;
  int64_t device_evictable_nodes() const { return static_cast<int64_t>(device_set_.size()); }
  int64_t host_evictable_nodes() const { return static_cast<int64_t>(host_set_.size()); }

  // ---- inspection -------------------------------------------------------------------------
  int64_t num_nodes() const { return num_nodes_; }  // roots excluded
  int64_t device_tokens() const { return device_tokens_; }
  int64_t host_tokens() const { return host_tokens_; }
  int64_t stored_tokens() const { return stored_tokens_; }
  int64_t storage_only_tokens() const { return storage_only_tokens_; }
  // Tier tokens of referenced, busy or retained nodes (what eviction cannot take).
  int64_t locked_device_tokens() const { return locked_device_tokens_; }
  int64_t locked_host_tokens() const { return locked_host_tokens_; }
  // Tier tokens of referenced nodes (what eviction cannot take until a Release).
  int64_t pinned_device_tokens() const { return pinned_device_tokens_; }
  // Device tokens of referenced or device-retained nodes (what eviction cannot take until a
  // Release or an unpin, however long copies run).
  int64_t held_device_tokens() const { return held_device_tokens_; }
  int64_t pinned_host_tokens() const { return pinned_host_tokens_; }
  // Tokens from the namespace root through the end of `node`.
  std::vector<Token> PrefixTokens(const RadixNode* node) const;
  // The key of the page before `node`'s first page (null when it is the first page or unknown).
  const PageKey* KeyBefore(const RadixNode* node) const;
  // Calls fn on every non-root node, parents before children.
  void ForEachNode(const std::function<void(const RadixNode&)>& fn) const;
  // Every invariant above, plus page alignment of slots; Internal naming the node otherwise.
  Status CheckInvariants() const;

  // Hash of one page of tokens (the child key).
  static uint64_t PageHash(std::span<const Token> page);

 private:
  struct SetEntry {
    EvictionKey key;
    uint64_t id;
    RadixNode* node;
    bool operator<(const SetEntry& o) const {
      if (key != o.key) return key < o.key;
      return id < o.id;
    }
  };

  // Replaces one tier's page list of `node` (`pages` and `children` name that tier's members)
  // and keeps the totals, the parent's child count and the evictable sets
  // right. Returns the old list.
  std::vector<int64_t> ReplacePages(RadixNode* node, std::vector<int64_t> RadixNode::*pages,
                                    int64_t RadixNode::*children, std::vector<int64_t> replacement);
  RadixNode* Root(std::string_view ns, bool create);
  const RadixNode* FindRoot(std::string_view ns) const;
  RadixNode* FindChild(const RadixNode* node, std::span<const Token> page) const;
  // Common prefix of node's tokens and `tokens`, rounded down to whole pages.
  int64_t CommonPages(const RadixNode* node, std::span<const Token> tokens) const;
  // Splits `node` after `k` tokens (0 < k < size, page aligned); returns the new upper node.
  RadixNode* Split(RadixNode* node, int64_t k);
  RadixNode* NewNode(RadixNode* parent);
  // A new leaf under `parent` holding `tokens` (at least one page) and the page keys `keys` (or
  // none), linked as the child of its first page; the caller gives it its tier and counts.
  RadixNode* AddLeaf(RadixNode* parent, std::span<const Token> tokens,
                     std::span<const PageKey> keys);
  // Keeps a removed node for reuse (its token buffer stays allocated) or deletes it.
  void Recycle(std::unique_ptr<RadixNode> node);
  static void FitTokens(RadixNode* node);
  // IncRef / DecRef: adds `delta` to the counts of `node` and its ancestors.
  void AddRef(RadixNode* node, int delta);
  void Refresh(RadixNode* node);
  // Adds (sign +1) or removes (-1) the node's contribution to the locked and storage totals.
  void Account(const RadixNode* node, int sign);
  void TierChanged(const RadixNode& node, Tier tier, bool entered) {
    if (tier_hook_) tier_hook_(node, tier, entered);
  }
  // Tells the tier hook that `node`, about to leave the tree, left every tier it was in.
  void LeavingTree(const RadixNode& node);
  EvictionStats StatsOf(const RadixNode* node) const;
  // One child `c` of `n`, filed under `key` among `kids`: its own fields and its place.
  Status CheckChild(const RadixNode* n, const RadixNode* c, uint64_t key,
                    const std::vector<std::pair<uint64_t, const RadixNode*>>& kids) const;
  // The evictable sets `n` (not a root) belongs in, by its state.
  struct Wanted {
    bool device, host, storage;
  };
  static Wanted WantedSets(const RadixNode* n);
  // Whether `n` (not a root) is in exactly the evictable sets its state puts it in.
  Status CheckEvictableSets(const RadixNode* n) const;
  Status CheckNode(const RadixNode* node, int64_t* device_tokens, int64_t* host_tokens,
                   int64_t* stored_tokens, int64_t* nodes) const;

  const int64_t page_size_;
  std::shared_ptr<const EvictionPolicy> device_policy_;
  std::shared_ptr<const EvictionPolicy> host_policy_;
  std::map<std::string, std::unique_ptr<RadixNode>, std::less<>> roots_;
  // What Match returns as `last` for a namespace that does not exist: a root with no children.
  const std::string no_namespace_;
  std::unique_ptr<RadixNode> empty_root_;
  std::set<SetEntry> device_set_;
  std::set<SetEntry> host_set_;
  std::set<SetEntry> storage_set_;
  std::function<void(RadixNode*, RadixNode*)> split_hook_;
  TierHook tier_hook_;
  // Removed nodes kept for reuse, so evicting a node frees no memory on the hot path (freeing
  // large token buffers was a third of the eviction time). Bounded by kMaxPooledNodes and
  // kMaxPooledTokens of buffer capacity.
  std::vector<std::unique_ptr<RadixNode>> pool_;
  int64_t pooled_tokens_ = 0;
  uint64_t next_id_ = 1;
  int64_t clock_ = 0;
  int64_t num_nodes_ = 0;
  int64_t device_tokens_ = 0;
  int64_t host_tokens_ = 0;
  int64_t stored_tokens_ = 0;
  int64_t storage_only_tokens_ = 0;
  int64_t locked_device_tokens_ = 0;
  int64_t locked_host_tokens_ = 0;
  int64_t pinned_device_tokens_ = 0;
  int64_t pinned_host_tokens_ = 0;
  int64_t held_device_tokens_ = 0;
  std::array<int64_t, 3> retained_tokens_{};
};

}  // namespace kvtier
