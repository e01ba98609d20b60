// The built-in eviction policies (see kvtier/eviction_policy.h).
#include "kvtier/eviction_policy.h"

#include <fmt/format.h>

namespace kvtier {
namespace {

class LruPolicy final : public EvictionPolicy {
 public:
  std::string_view name() const override { return "lru"; }
  EvictionKey Key(const EvictionStats& s) const override { return {s.last_access, s.created}; }
};

class LfuPolicy final : public EvictionPolicy {
 public:
  std::string_view name() const override { return "lfu"; }
  EvictionKey Key(const EvictionStats& s) const override { return {s.hit_count, s.last_access}; }
};

class FifoPolicy final : public EvictionPolicy {
 public:
  std::string_view name() const override { return "fifo"; }
  EvictionKey Key(const EvictionStats& s) const override { return {s.created, 0}; }
};

class PriorityPolicy final : public EvictionPolicy {
 public:
  std::string_view name() const override { return "priority"; }
  EvictionKey Key(const EvictionStats& s) const override { return {s.priority, s.last_access}; }
};

}  // namespace

const char* EvictionPolicyName(EvictionPolicyKind kind) {
  switch (kind) {
    case EvictionPolicyKind::kLru:
      return "lru";
    case EvictionPolicyKind::kLfu:
      return "lfu";
    case EvictionPolicyKind::kFifo:
      return "fifo";
    case EvictionPolicyKind::kPriority:
      return "priority";
  }
  return "unknown_eviction_policy";
}

Result<EvictionPolicyKind> ParseEvictionPolicy(std::string_view name) {
  for (auto k : {EvictionPolicyKind::kLru, EvictionPolicyKind::kLfu, EvictionPolicyKind::kFifo,
                 EvictionPolicyKind::kPriority}) {
    if (name == EvictionPolicyName(k)) return k;
  }
  return Status::InvalidArgument(
      fmt::format("eviction policy '{}' is not one of lru, lfu, fifo, priority", name));
}

std::shared_ptr<const EvictionPolicy> MakeEvictionPolicy(EvictionPolicyKind kind) {
  static const auto lru = std::make_shared<const LruPolicy>();
  static const auto lfu = std::make_shared<const LfuPolicy>();
  static const auto fifo = std::make_shared<const FifoPolicy>();
  static const auto priority = std::make_shared<const PriorityPolicy>();
  switch (kind) {
    case EvictionPolicyKind::kLfu:
      return lfu;
    case EvictionPolicyKind::kFifo:
      return fifo;
    case EvictionPolicyKind::kPriority:
      return priority;
    case EvictionPolicyKind::kLru:
    default:
      return lru;
  }
}

}  // namespace kvtier
