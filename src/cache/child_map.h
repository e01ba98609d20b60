// Internal: the children of a radix node (cache/radix_tree.h), keyed by the hash of their first
// page: open addressing with linear probing in a power-of-two table (none allocated for a leaf).
// Several children may share a key (a hash collision); lookups tell them apart with a predicate
// on the node. Does not own the nodes.
//
// Thread safety: none; the tree's owner serialises every call.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace kvtier {

class RadixNode;

namespace detail {

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
}  // namespace kvtier
