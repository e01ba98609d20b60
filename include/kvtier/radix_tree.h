// kvtier/radix_tree.h — the paged radix tree over token ids that indexes cached KV.
//
// Each namespace (a tenant salt) has its own root, so prefixes never match across namespaces.
// A node holds a span of tokens (a non-empty multiple of page_size) and, per tier, where their KV
// lives, one entry per page: the page's first device slot and/or first host slot (a page is
// page_size consecutive slots starting at a multiple of page_size), and a storage key
// (placeholder for the storage tier). Children are keyed by a hash of their first page and
// verified token by token. Matching and inserting walk page by page and split a node where a
// match ends inside it.
//
// Invariants (checked by CheckInvariants, written once in radix_tree.cc):
//   - every non-root node is resident somewhere (device or host);
//   - device residency is prefix-closed (a node on the device has its parent on the device), and
//     so is host residency (backups form a contiguous prefix);
//   - a node's reference count is at least the sum of its children's (IncRef pins a node and all
//     its ancestors), and only unreferenced nodes are evictable;
//   - the device-evictable set holds exactly the unreferenced, idle nodes on the device with no
//     child on the device; the host-evictable set exactly the unreferenced, idle nodes in host
//     memory only, with no children. Both are ordered by the tier's EvictionPolicy key.
//
// Thread safety: none; the owner (HierarchicalCache) serialises every call.
#pragma once

#include <cstdint>
#include <cstddef>
#include <algorithm>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kvtier/eviction_policy.h"
#include "kvtier/status.h"

namespace kvtier {

using Token = int32_t;

// An in-flight copy touching a node (defined by the cache). A node that has one is "busy": it is
// neither device- nor host-evictable until the owner clears it.
struct PendingCopy;

class RadixNode;

namespace detail {

// The children of a radix node, keyed by the hash of their first page: open addressing with
// linear probing in a power-of-two table (none allocated for a leaf). Several children may share
// a key (a hash collision); lookups tell them apart with a predicate on the node. Does not own
// the nodes.
class ChildMap {
 public:
  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  // fn(key, node) for every child, in table order.
  template <typename Fn>
  void ForEach(Fn&& fn) const {
    for (const Entry& e : slots_) {
      if (Live(e)) fn(e.key, e.node);
    }
  }
  // The first child with `key` for which match(node) is true, or null.
  template <typename Fn>
  RadixNode* Find(uint64_t key, Fn&& match) const {
    if (slots_.empty()) return nullptr;
    for (size_t i = Home(key);; i = (i + 1) & mask_) {
      const Entry& e = slots_[i];
      if (e.node == nullptr) return nullptr;
      if (e.key == key && e.node != Tombstone() && match(e.node)) return e.node;
    }
  }
  void Insert(uint64_t key, RadixNode* node);
  // REQUIRES: `node` is present under `key`.
  void Erase(uint64_t key, RadixNode* node);
  // Puts `to` where `from` is (same key). REQUIRES: `from` is present under `key`.
  void Replace(uint64_t key, RadixNode* from, RadixNode* to);
  void Clear();

 private:
  struct Entry {
    uint64_t key = 0;
    RadixNode* node = nullptr;  // null: empty; Tombstone(): erased
  };
  static RadixNode* Tombstone() { return reinterpret_cast<RadixNode*>(uintptr_t{1}); }
  static bool Live(const Entry& e) { return e.node != nullptr && e.node != Tombstone(); }
  size_t Home(uint64_t key) const {
    return static_cast<size_t>((key * 0x9E3779B97F4A7C15ull) >> shift_);
  }
  size_t Locate(uint64_t key, const RadixNode* node) const;
  void Rehash(size_t capacity);

  std::vector<Entry> slots_;
  size_t mask_ = 0;
  int shift_ = 64;
  size_t size_ = 0;  // live entries
  size_t used_ = 0;  // live entries + tombstones
};

}  // namespace detail

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
  // First slot of each page of the node, in the device pool / the host pool (empty when absent).
  std::span<const int64_t> device_pages() const { return device_pages_; }
  std::span<const int64_t> host_pages() const { return host_pages_; }
  std::span<const std::string> storage_keys() const { return storage_keys_; }

  int64_t ref_count() const { return ref_count_; }
  int64_t hit_count() const { return hit_count_; }
  int64_t last_access() const { return last_access_; }
  int64_t created() const { return created_; }
  int32_t priority() const { return priority_; }
  bool busy() const { return pending_ != nullptr; }
  const std::shared_ptr<PendingCopy>& pending() const { return pending_; }
  size_t num_children() const { return children_.size(); }
  int64_t device_children() const { return device_children_; }

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
  std::vector<std::string> storage_keys_;  // empty, or one per page
  // Keyed by the hash of the child's first page. The tree owns the nodes.
  detail::ChildMap children_;
  int64_t device_children_ = 0;  // children on the device
  int64_t host_children_ = 0;    // children in host memory
  int64_t ref_count_ = 0;
  int64_t hit_count_ = 0;
  int64_t last_access_ = 0;
  int64_t created_ = 0;
  int32_t priority_ = 0;
  std::shared_ptr<PendingCopy> pending_;
  // Membership in the tree's evictable sets and the key it is filed under.
  bool in_device_set_ = false;
  bool in_host_set_ = false;
  EvictionKey device_key_;
  EvictionKey host_key_;
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
  // Namespaces that hold or held nodes (Insert creates them).
  int64_t num_namespaces() const { return static_cast<int64_t>(roots_.size()); }

  struct MatchResult {
    RadixNode* last = nullptr;   // deepest matched node; a root when nothing matched
    int64_t matched_tokens = 0;  // page-aligned; == last->prefix_tokens() after Match
    int64_t device_tokens = 0;   // leading matched tokens whose KV is on the device
    int64_t host_tokens = 0;     // the rest of the match: in host memory only
  };

  // The longest cached page-aligned prefix of `tokens` in namespace `ns`. Splits the node in which
  // the match ends, so the match ends exactly at `last`'s end. Touches nothing else (no access
  // times, no hit counts). A namespace nothing was inserted into matches nothing, with `last` a
  // shared empty root of no namespace: matching never creates a namespace, so probing arbitrary
  // names does not grow the tree.
  MatchResult Match(std::string_view ns, std::span<const Token> tokens);
  // Like Match but changes nothing: `last` may extend past matched_tokens; null when the
  // namespace does not exist.
  MatchResult Peek(std::string_view ns, std::span<const Token> tokens) const;

  enum class SegmentKind : uint8_t {
    kOnDevice,  // already on the device: the node keeps its slots
    kRevived,   // was in host memory only: the node took the given device slots
    kNew,       // a new leaf holding the given device slots
  };
  struct InsertSegment {
    RadixNode* node;
    int64_t begin;  // token range of `tokens` this node covers
    int64_t end;
    SegmentKind kind;
  };
  // Inserts `tokens` with their device pages (first slot of each page); see SegmentKind for what
  // happens to each part. Segments are appended to `segments` top-down. New nodes get
  // hit_count 1. REQUIRES: tokens.size() == device_pages.size() * page_size.
  void Insert(std::string_view ns, std::span<const Token> tokens,
              std::span<const int64_t> device_pages, std::vector<InsertSegment>* segments);

  // ---- residency (each keeps the counts and the evictable sets right) --------------------
  // REQUIRES: pages.size() == node's pages; the parent is on the device (or the root).
  void SetDevicePages(RadixNode* node, std::vector<int64_t> pages);
  // Moves the device pages out. REQUIRES: no child on the device.
  std::vector<int64_t> TakeDevicePages(RadixNode* node);
  // Same, appending them to `out` (no allocation or free on the eviction path).
  void TakeDevicePages(RadixNode* node, std::vector<int64_t>* out);
  // REQUIRES: pages.size() == node's pages; the parent is in host memory (or the root).
  void SetHostPages(RadixNode* node, std::vector<int64_t> pages);
  // REQUIRES: no child in host memory.
  std::vector<int64_t> TakeHostPages(RadixNode* node);
  // REQUIRES: keys.size() == pages of node (or empty).
  void SetStorageKeys(RadixNode* node, std::vector<std::string> keys);
  // Deletes a node. REQUIRES: not a root, no children, no slots in any tier, unreferenced.
  void Remove(RadixNode* node);

  // ---- references, statistics, in-flight copies ------------------------------------------
  // Pins `node` and all its ancestors (the namespace root excluded).
  void IncRef(RadixNode* node);
  // REQUIRES: a matching IncRef.
  void DecRef(RadixNode* node);
  // Access: last_access = a new tick of the logical clock. Adds `hits` to hit_count.
  void Touch(RadixNode* node, int64_t hits);
  void RaisePriority(RadixNode* node, int32_t priority);
  void SetPending(RadixNode* node, std::shared_ptr<PendingCopy> pending);
  // Called as hook(upper, lower) after a split: `upper` is the new node holding the first part of
  // `lower`'s old tokens; `lower` keeps its identity (handles pointing at it stay valid). Both
  // carry the old node's pending copy, references and statistics.
  void SetSplitHook(std::function<void(RadixNode* upper, RadixNode* lower)> hook) {
    split_hook_ = std::move(hook);
  }

  // ---- eviction ---------------------------------------------------------------------------
  // The evictable node with the smallest key, or null.
  RadixNode* DeviceVictim() const;
  RadixNode* HostVictim() const;
  // A hint for eviction loops: prefetches the node after the best device victim and the page
  // list of the one after that (evicting is bound by cache misses on nodes that were last
  // touched long ago). Changes nothing.
  void PrefetchDeviceVictims() const;
  int64_t device_evictable_nodes() const { return static_cast<int64_t>(device_set_.size()); }
  int64_t host_evictable_nodes() const { return static_cast<int64_t>(host_set_.size()); }

  // ---- inspection -------------------------------------------------------------------------
  int64_t num_nodes() const { return num_nodes_; }  // roots excluded
  int64_t device_tokens() const { return device_tokens_; }
  int64_t host_tokens() const { return host_tokens_; }
  // Tokens from the namespace root through the end of `node`.
  std::vector<Token> PrefixTokens(const RadixNode* node) const;
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

  // Replaces one tier's page list of `node` (`pages` and `children` name that tier's members,
  // `tokens` its total) and keeps the totals, the parent's child count and the evictable sets
  // right. Returns the old list.
  std::vector<int64_t> ReplacePages(RadixNode* node, std::vector<int64_t> RadixNode::*pages,
                                    int64_t RadixNode::*children, int64_t* tokens,
                                    std::vector<int64_t> replacement);
  RadixNode* Root(std::string_view ns, bool create);
  const RadixNode* FindRoot(std::string_view ns) const;
  RadixNode* FindChild(const RadixNode* node, std::span<const Token> page) const;
  // Common prefix of node's tokens and `tokens`, rounded down to whole pages.
  int64_t CommonPages(const RadixNode* node, std::span<const Token> tokens) const;
  // Splits `node` after `k` tokens (0 < k < size, page aligned); returns the new upper node.
  RadixNode* Split(RadixNode* node, int64_t k);
  RadixNode* NewNode(RadixNode* parent);
  // Keeps a removed node for reuse (its token buffer stays allocated) or deletes it.
  void Recycle(std::unique_ptr<RadixNode> node);
  static void FitTokens(RadixNode* node);
  void Refresh(RadixNode* node);
  EvictionStats StatsOf(const RadixNode* node) const;
  Status CheckNode(const RadixNode* node, int64_t* device_tokens, int64_t* host_tokens,
                   int64_t* nodes) const;

  const int64_t page_size_;
  std::shared_ptr<const EvictionPolicy> device_policy_;
  std::shared_ptr<const EvictionPolicy> host_policy_;
  std::map<std::string, std::unique_ptr<RadixNode>, std::less<>> roots_;
  // What Match returns as `last` for a namespace that does not exist: a root with no children.
  const std::string no_namespace_;
  std::unique_ptr<RadixNode> empty_root_;
  std::set<SetEntry> device_set_;
  std::set<SetEntry> host_set_;
  std::function<void(RadixNode*, RadixNode*)> split_hook_;
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
};

}  // namespace kvtier
