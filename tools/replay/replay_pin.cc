// `kvtier replay --pin-system-prompt` (see replay_pin.h).
#include "replay_pin.h"

#include <fmt/format.h>

#include <algorithm>
#include <string>

#include "workload.h"

namespace kvtier::tools {

Result<std::vector<CacheTier>> ParsePinTiers(std::string_view text) {
  if (text == "all")
    return std::vector<CacheTier>{CacheTier::kDevice, CacheTier::kHost, CacheTier::kStorage};
  std::vector<CacheTier> tiers;
  size_t start = 0;
  while (start <= text.size()) {
    const size_t comma = std::min(text.find(',', start), text.size());
    const std::string_view name = text.substr(start, comma - start);
    CacheTier tier;
    if (name == "device") {
      tier = CacheTier::kDevice;
    } else if (name == "host") {
      tier = CacheTier::kHost;
    } else if (name == "storage") {
      tier = CacheTier::kStorage;
    } else {
      return Status::InvalidArgument(fmt::format(
          "--pin-system-prompt = '{}': '{}' is not a tier (device, host, storage, or all)", text,
          name));
    }
    if (std::find(tiers.begin(), tiers.end(), tier) != tiers.end()) {
      return Status::InvalidArgument(
          fmt::format("--pin-system-prompt = '{}' names {} twice", text, name));
    }
    tiers.push_back(tier);
    start = comma + 1;
  }
  return tiers;
}

Result<std::vector<Token>> SharedPrompt(const std::vector<const Workload*>& workloads,
                                        int64_t page_size) {
  const WorkloadRequest* first = nullptr;
  int64_t blocks = 0, shortest = 0;
  for (const Workload* w : workloads) {
    for (const WorkloadRequest& r : w->requests) {
      if (first == nullptr) {
        first = &r;
        blocks = static_cast<int64_t>(r.hash_ids.size());
        shortest = r.input_length;
        continue;
      }
      int64_t k = 0;
      while (k < blocks && k < static_cast<int64_t>(r.hash_ids.size()) &&
             r.hash_ids[static_cast<size_t>(k)] == first->hash_ids[static_cast<size_t>(k)]) {
        ++k;
      }
      blocks = k;
      shortest = std::min(shortest, r.input_length);
    }
  }
  const int64_t tokens =
      first == nullptr ? 0 : std::min(blocks * kBlockTokens, shortest) / page_size * page_size;
  if (tokens == 0) {
    return Status::InvalidArgument(
        "--pin-system-prompt: the workload's requests share no prefix of a whole page to pin "
        "(doc-qa has no system prompt; system-prompt and chat do)");
  }
  std::vector<Token> prompt = PromptTokens(*first);
  prompt.resize(static_cast<size_t>(tokens));
  return prompt;
}

void SystemPromptPin::SetBudgets(HierarchicalCacheConfig* config) const {
  for (CacheTier t : tiers_) {
    switch (t) {
      case CacheTier::kDevice:
        config->pin_device_budget_tokens = prompt_tokens();
        break;
      case CacheTier::kHost:
        config->pin_host_budget_tokens = prompt_tokens();
        break;
      case CacheTier::kStorage:
        config->pin_storage_budget_tokens = prompt_tokens();
        break;
    }
  }
}

Status SystemPromptPin::Renew(HierarchicalCache& cache) {
  if (covered_ == prompt_tokens()) return Status::OK();
  // Overlapping tokens count once, so the new pin fits the budget beside the old one.
  KVTIER_ASSIGN_OR_RETURN(PinResult r,
                          cache.Pin(prompt_, tiers_, ttl_s_ > 0 ? ttl_s_ : kPinForever));
  if (r.pinned_tokens <= covered_) {
    return r.pin.id == 0 ? Status::OK() : cache.Unpin(r.pin);
  }
  if (pin_.id != 0) {
    const Status st = cache.Unpin(pin_);
    // The old pin may have ended by its TTL: then there is nothing to end.
    if (!st.ok() && !st.IsInvalidArgument()) return st;
  }
  pin_ = r.pin;
  covered_ = r.pinned_tokens;
  store_pinned_ = r.store_pinned;
  return Status::OK();
}

Status SystemPromptPin::End(HierarchicalCache& cache) {
  if (pin_.id == 0) return Status::OK();
  const PinHandle pin = pin_;
  pin_ = PinHandle{};
  const Status st = cache.Unpin(pin);
  return st.IsInvalidArgument() ? Status::OK() : st;  // ended by its TTL already
}

}  // namespace kvtier::tools
