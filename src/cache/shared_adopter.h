// Internal: the part of a HierarchicalCache over a shared host tier that takes into the tree the
// pages other processes published under the keys of a prompt (Match), so that a page any process
// backed up is a host hit for all.
//
// Thread safety: every method REQUIRES the cache's mutex (cache/cache_core.h); page keys are
// hashed by the caller outside it.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string_view>

#include "cache/cache_core.h"

namespace kvtier {

class TierEvictor;

class SharedHostAdopter {
 public:
  SharedHostAdopter(CacheCore& core, TierEvictor& evictor) : core_(core), evictor_(evictor) {}
  SharedHostAdopter(const SharedHostAdopter&) = delete;
  SharedHostAdopter& operator=(const SharedHostAdopter&) = delete;

  // Where the tree's match of `tokens` ends (in whole pages) and the key of the page before that
  // point (the namespace's chain seed at the start): what Match hashes the rest of the prompt
  // from. At the start when a node on the way lacks its keys.
  void MatchedChain(std::string_view ns, std::span<const Token> tokens, int64_t* pages,
                    std::optional<PageKey>* previous) const KVTIER_REQUIRES(kCacheLock);
  // The pages after the host part of the tree's match `r` that the shared tier holds under their
  // keys, pinned (at most what host eviction could make room for): device-only nodes at the end
  // of the match take theirs as host copies (a backup with nothing to copy), the pages after the
  // match become a host-only leaf, and `r` then ends at the leaf. `tail`: the keys of the pages
  // of `tokens` from page `tail_from` on (the match's end when Match peeked). Returns the tokens
  // the match gained.
  int64_t AdoptShared(RadixTree::MatchResult* r, std::string_view ns, std::span<const Token> tokens,
                      std::span<const PageKey> tail, int64_t tail_from) KVTIER_REQUIRES(kCacheLock);

 private:
  CacheCore& core_;
  TierEvictor& evictor_;
};

}  // namespace kvtier
