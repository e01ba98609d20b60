// tools/replay/replay_pin.h — `kvtier replay --pin-system-prompt TIERS`: the hierarchy run pins
// the workload's system prompt (the prefix every request shares: 8 blocks in the system-prompt
// workload, 1 in chat; doc-qa has none) in the named tiers with HierarchicalCache::Pin, its pin
// budgets set to the prompt's pages. The first request inserts the prompt; the pin is renewed
// after each request until it covers all of it (a pin covers what is cached when it is made).
//
// Thread safety: used by the one thread that drives a run.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "kvtier/hierarchical_cache.h"
#include "kvtier/status.h"
#include "kvtier/token.h"

namespace kvtier::tools {

struct Workload;  // workload.h

// "device,host,storage" (any of them, each once) or "all"; InvalidArgument naming
// --pin-system-prompt otherwise.
Result<std::vector<CacheTier>> ParsePinTiers(std::string_view text);

// The whole pages of the prefix every request of `workloads` shares (block ids in common, cut to
// the shortest prompt). InvalidArgument naming --pin-system-prompt when they share no page.
Result<std::vector<Token>> SharedPrompt(const std::vector<const Workload*>& workloads,
                                        int64_t page_size);

class SystemPromptPin {
 public:
  // `ttl_s` 0: until the run ends.
  SystemPromptPin(std::vector<Token> prompt, std::vector<CacheTier> tiers, double ttl_s)
      : prompt_(std::move(prompt)), tiers_(std::move(tiers)), ttl_s_(ttl_s) {}

  // The budgets that let the pin cover the prompt in its tiers.
  void SetBudgets(HierarchicalCacheConfig* config) const;
  // Pins the prompt again when the pin does not cover all of it yet (and ends the older pin);
  // does nothing once it does. Errors are the cache's (a budget refusal cannot happen: the
  // budgets are the prompt's).
  Status Renew(HierarchicalCache& cache);
  // Ends the pin (before the cache goes).
  Status End(HierarchicalCache& cache);

  int64_t prompt_tokens() const { return static_cast<int64_t>(prompt_.size()); }
  int64_t covered_tokens() const { return covered_; }
  bool store_pinned() const { return store_pinned_; }
  const std::vector<CacheTier>& tiers() const { return tiers_; }
  double ttl_s() const { return ttl_s_; }

 private:
  std::vector<Token> prompt_;
  std::vector<CacheTier> tiers_;
  double ttl_s_;
  PinHandle pin_;
  int64_t covered_ = 0;
  bool store_pinned_ = false;
};

}  // namespace kvtier::tools
