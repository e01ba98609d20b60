// kvtier/eviction_policy.h — which cached node a tier gives up first (CacheLib-style policy).
//
// The cache keeps, per tier, the set of nodes it may evict (unreferenced leaves of that tier)
// ordered by a key the policy computes from a node's statistics; the node with the smallest key
// goes first. A policy is a pure function of those statistics, so the mechanism (the ordered set,
// the radix tree, the copies) is the same under every policy:
//   lru       least recently used first           key (last_access, created)
//   lfu       least frequently hit first          key (hit_count, last_access)
//   fifo      oldest insertion first              key (created, 0)
//   priority  lowest priority first, then LRU     key (priority, last_access)
// Times are the cache's logical clock (one tick per access), not wall-clock time.
//
// Thread safety: policies are immutable; Key may be called from any thread.
#pragma once

#include <compare>
#include <cstdint>
#include <memory>
#include <string_view>

#include "kvtier/status.h"

namespace kvtier {

// What a policy may look at.
struct EvictionStats {
  int64_t last_access = 0;  // logical time of the last match or insert that touched the node
  int64_t created = 0;      // logical time the node's tokens were first inserted
  int64_t hit_count = 0;    // inserts and matches that touched the node
  int32_t priority = 0;     // the highest priority any insert gave the node
};

// Smaller keys are evicted first; ties are broken by node age (older first).
struct EvictionKey {
  int64_t primary = 0;
  int64_t secondary = 0;
  friend auto operator<=>(const EvictionKey&, const EvictionKey&) = default;
};

class EvictionPolicy {
 public:
  virtual ~EvictionPolicy() = default;
  virtual std::string_view name() const = 0;
  // REQUIRES: a pure function of `stats` (the cache recomputes it whenever the stats change).
  virtual EvictionKey Key(const EvictionStats& stats) const = 0;
};

enum class EvictionPolicyKind : uint8_t { kLru = 0, kLfu = 1, kFifo = 2, kPriority = 3 };
inline constexpr int kNumEvictionPolicies = static_cast<int>(EvictionPolicyKind::kPriority) + 1;

// "lru", "lfu", "fifo", "priority".
const char* EvictionPolicyName(EvictionPolicyKind kind);
// Inverse of EvictionPolicyName; InvalidArgument naming the accepted spellings otherwise.
Result<EvictionPolicyKind> ParseEvictionPolicy(std::string_view name);
// The built-in policy of that kind (shared, immutable). Unknown kinds give LRU.
std::shared_ptr<const EvictionPolicy> MakeEvictionPolicy(EvictionPolicyKind kind);

}  // namespace kvtier
