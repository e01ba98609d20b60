// Pages of a shared host tier that other processes published (see cache/shared_adopter.h).
#include "cache/shared_adopter.h"

#include <algorithm>

#include "cache/tier_evictor.h"
#include "util/log.h"

namespace kvtier {

void SharedHostAdopter::MatchedChain(std::string_view ns, std::span<const Token> tokens,
                                     int64_t* pages, std::optional<PageKey>* previous) const {
  const RadixTree::MatchResult peek = core_.tree.Peek(ns, tokens);
  *pages = peek.matched_tokens / core_.P;
  if (*pages > 0) {
    const RadixNode* last = peek.last;
    const int64_t index = *pages - 1 - (last->prefix_tokens() - last->num_tokens()) / core_.P;
    if (index >= 0 && index < static_cast<int64_t>(last->keys().size())) {
      *previous = last->keys()[static_cast<size_t>(index)];
      return;
    }
  }
  *pages = 0;
  *previous = ChainSeed(ns);
}

int64_t SharedHostAdopter::AdoptShared(RadixTree::MatchResult* r, std::string_view ns,
                                       std::span<const Token> tokens, std::span<const PageKey> tail,
                                       int64_t tail_from) {
  // The device-only nodes at the end of the match, top-down, and where host memory ends.
  std::vector<RadixNode*> bare;
  RadixNode* top = r->last;
  for (; !top->is_root() && !top->on_host(); top = top->parent()) {
    if (!top->on_device() || top->busy() > 0) return 0;
    bare.push_back(top);
  }
  std::reverse(bare.begin(), bare.end());
  const int64_t matched = r->matched_tokens / core_.P;
  // The match shrank since the peek (evictions meanwhile): no keys for the pages it lost.
  if (matched < tail_from) return 0;
  // Keys from where host memory ends: the bare nodes' own, then the tail's.
  std::vector<PageKey> keys;
  for (const RadixNode* d : bare) {
    if (static_cast<int64_t>(d->keys().size()) * core_.P != d->num_tokens()) return 0;
    keys.insert(keys.end(), d->keys().begin(), d->keys().end());
  }
  const size_t bare_pages = keys.size();
  keys.insert(keys.end(), tail.begin() + (matched - tail_from), tail.end());
  if (keys.empty()) return 0;
  Result<std::vector<int64_t>> found = core_.host->FindPrefix(keys, evictor_.HostReclaimable());
  if (!found.ok()) {
    util::Log(util::LogLevel::kWarning, "cache: shared host lookup: {}", found.status().ToString());
    return 0;
  }
  const std::vector<int64_t>& pages = *found;
  size_t used = 0;
  for (RadixNode* d : bare) {
    const size_t np = static_cast<size_t>(d->num_tokens() / core_.P);
    const size_t have = std::min(np, pages.size() - used);
    if (have == 0) break;
    RadixNode* target =
        have < np ? core_.tree.SplitAfter(d, static_cast<int64_t>(have))->parent() : d;
    core_.tree.SetHostPages(
        target, std::vector<int64_t>(pages.begin() + static_cast<ptrdiff_t>(used),
                                     pages.begin() + static_cast<ptrdiff_t>(used + have)));
    used += have;
    core_.counters.backup_present_tokens += static_cast<int64_t>(have) * core_.P;
    if (have < np) break;
  }
  int64_t adopted = 0;
  if (used == bare_pages && used < pages.size()) {
    const size_t n = pages.size() - used;
    RadixNode* leaf = core_.tree.AddHostLeaf(
        r->last->is_root() ? nullptr : r->last, ns,
        tokens.subspan(static_cast<size_t>(matched * core_.P), n * static_cast<size_t>(core_.P)),
        std::span<const PageKey>(keys).subspan(used, n),
        std::vector<int64_t>(pages.begin() + static_cast<ptrdiff_t>(used), pages.end()));
    if (leaf != nullptr) {
      adopted = static_cast<int64_t>(n) * core_.P;
      used = pages.size();
      r->last = leaf;
      r->matched_tokens += adopted;
      r->host_tokens += adopted;
    }
  }
  core_.FreeHost(std::span<const int64_t>(pages).subspan(used));  // found, but nowhere to go
  return adopted;
}

}  // namespace kvtier
