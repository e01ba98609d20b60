// The cache's pins (see cache/pin_table.h).
#include "cache/pin_table.h"

#include <fmt/format.h>

#include <array>
#include <cmath>
#include <map>

namespace kvtier {

namespace {

constexpr int kPinSeqBits = 40;  // as handles: this cache's tag in the high bits
constexpr std::array<RadixTree::Tier, 3> kTiers = {RadixTree::Tier::kDevice, RadixTree::Tier::kHost,
                                                   RadixTree::Tier::kStorage};

int64_t BudgetOf(const HierarchicalCacheConfig& c, RadixTree::Tier tier) {
  switch (tier) {
    case RadixTree::Tier::kDevice:
      return c.pin_device_budget_tokens;
    case RadixTree::Tier::kHost:
      return c.pin_host_budget_tokens;
    case RadixTree::Tier::kStorage:
      return c.pin_storage_budget_tokens;
  }
  return 0;
}

const char* BudgetName(RadixTree::Tier tier) {
  switch (tier) {
    case RadixTree::Tier::kDevice:
      return "pin_device_budget_tokens";
    case RadixTree::Tier::kHost:
      return "pin_host_budget_tokens";
    case RadixTree::Tier::kStorage:
      return "pin_storage_budget_tokens";
  }
  return "";
}

}  // namespace

CacheClock::time_point PinTable::Now() const {
  return core_.config.pin_clock ? core_.config.pin_clock() : CacheClock::now();
}

Result<PinHandle> PinTable::Add(RadixNode* last, uint8_t tiers, double ttl_seconds) {
  for (RadixTree::Tier t : kTiers) {
    if ((tiers & RadixTree::TierBit(t)) == 0) continue;
    const int64_t budget = BudgetOf(core_.config, t);
    const int64_t held = core_.tree.retained_tokens(t);
    const int64_t more = core_.tree.RetainCost(last, t);
    if (held + more > budget) {
      ++core_.counters.pins_refused;
      return Status::InvalidArgument(fmt::format(
          "Pin of {} tokens refused: the {} tier's pins would cover {} tokens ({} pinned now, {} "
          "more), beyond its budget {} = {}",
          last->prefix_tokens(), CacheTierName(static_cast<CacheTier>(t)), held + more, held, more,
          BudgetName(t), budget));
    }
  }
  Pin pin{last, tiers, true, CacheClock::time_point::max(), std::nullopt};
  const CacheClock::time_point now = Now();
  // A TTL past the clock's range lasts until Unpin.
  const double max_seconds =
      std::chrono::duration<double>(CacheClock::time_point::max() - now).count();
  if (std::isfinite(ttl_seconds) && ttl_seconds < max_seconds / 2) {
    pin.forever = false;
    pin.deadline = now + std::chrono::duration_cast<CacheClock::duration>(
                             std::chrono::duration<double>(ttl_seconds));
  }
  const PinHandle handle{(core_.tag << kPinSeqBits) | next_seq_++};
  core_.tree.Retain(last, tiers, +1);
  if (!pin.forever) deadlines_.emplace(pin.deadline, handle.id);
  pins_.emplace(handle.id, pin);
  ++core_.counters.pins;
  return handle;
}

Result<std::optional<uint64_t>> PinTable::Remove(PinHandle pin) {
  auto it = pins_.find(pin.id);
  if (it == pins_.end()) {
    return Status::InvalidArgument(fmt::format(
        "pin {} is not live: ended already (Unpin or its TTL), never issued, or another "
        "HierarchicalCache's",
        pin.id));
  }
  std::optional<uint64_t> store_pin = it->second.store_pin;
  Drop(it);
  return store_pin;
}

bool PinTable::SetStorePin(PinHandle pin, uint64_t store_pin) {
  auto it = pins_.find(pin.id);
  if (it == pins_.end()) return false;
  it->second.store_pin = store_pin;
  return true;
}

void PinTable::Expire() {
  if (deadlines_.empty()) return;
  const CacheClock::time_point now = Now();
  while (!deadlines_.empty() && deadlines_.begin()->first <= now) {
    Drop(pins_.find(deadlines_.begin()->second));
    ++core_.counters.pins_expired;
  }
}

std::vector<uint64_t> PinTable::Clear() {
  std::vector<uint64_t> store_pins;
  while (!pins_.empty()) {
    auto it = pins_.begin();
    if (it->second.store_pin) store_pins.push_back(*it->second.store_pin);
    Drop(it);
  }
  return store_pins;
}

void PinTable::Drop(std::unordered_map<uint64_t, Pin>::iterator it) {
  core_.tree.Retain(it->second.last, it->second.tiers, -1);
  if (!it->second.forever) deadlines_.erase({it->second.deadline, it->first});
  pins_.erase(it);
}

Status PinTable::CheckConsistency() const {
  // Retentions each node should have, from the pins: one per pin through it, per tier.
  std::map<const RadixNode*, std::array<int32_t, 3>> expected;
  int64_t with_ttl = 0;
  for (const auto& [id, pin] : pins_) {
    for (const RadixNode* n = pin.last; !n->is_root(); n = n->parent()) {
      for (size_t t = 0; t < 3; ++t) expected[n][t] += (pin.tiers >> t) & 1;
    }
    if (!pin.forever) {
      ++with_ttl;
      if (deadlines_.count({pin.deadline, id}) == 0) {
        return Status::Internal(fmt::format("pin {}: its deadline is not filed", id));
      }
    }
  }
  if (with_ttl != static_cast<int64_t>(deadlines_.size())) {
    return Status::Internal(
        fmt::format("{} deadlines filed for {} pins with a TTL", deadlines_.size(), with_ttl));
  }
  Status st;
  core_.tree.ForEachNode([&](const RadixNode& n) {
    if (!st.ok()) return;
    auto it = expected.find(&n);
    const std::array<int32_t, 3> want =
        it == expected.end() ? std::array<int32_t, 3>{} : it->second;
    for (size_t t = 0; t < 3; ++t) {
      if (n.retained(t) != want[t]) {
        st = Status::Internal(fmt::format("node {}: retained {} in tier {}, but {} pins cover it",
                                          n.id(), n.retained(t), t, want[t]));
        return;
      }
    }
  });
  KVTIER_RETURN_IF_ERROR(st);
  for (RadixTree::Tier t : kTiers) {
    if (core_.tree.retained_tokens(t) > BudgetOf(core_.config, t)) {
      return Status::Internal(fmt::format(
          "pins cover {} tokens of the {} tier, beyond {} = {}", core_.tree.retained_tokens(t),
          CacheTierName(static_cast<CacheTier>(t)), BudgetName(t), BudgetOf(core_.config, t)));
    }
  }
  return Status::OK();
}

}  // namespace kvtier
