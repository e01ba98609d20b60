// StoreKvEvents and its config: a page store's KV events (kvtier/kv_events.h, "a page store's
// events").
#include <fmt/format.h>

#include <algorithm>
#include <iterator>

#include "kvtier/kv_events.h"

namespace kvtier {
namespace {

ConfigSchema<StoreKvEventsConfig> BuildStoreKvEventsSchema() {
  using C = StoreKvEventsConfig;
  ConfigSchema<C> s;
  s.push_back(StringField<C>("kv_events_endpoint", Member(&C::kv_events_endpoint),
                             "ZeroMQ PUB endpoint of the store's KV events (vLLM's protocol: "
                             "bound when it holds '*' or is ipc:// / inproc://, else connected); "
                             "empty = no events"));
  s.push_back(StringField<C>("kv_events_replay_endpoint", Member(&C::kv_events_replay_endpoint),
                             "ZeroMQ ROUTER endpoint answering replay requests (always bound); "
                             "empty = none"));
  s.push_back(StringField<C>("kv_events_topic", Member(&C::kv_events_topic),
                             "the topic frame of every KV events message"));
  s.push_back(StringField<C>("kv_events_medium", Member(&C::kv_events_medium),
                             "the medium of the store's KV events; empty = the store's own "
                             "(DISK for file://, REDIS for redis://, MEMORY for memory://)"));
  return s;
}

}  // namespace

const ConfigSchema<StoreKvEventsConfig>& StoreKvEventsConfigSchema() {
  static const ConfigSchema<StoreKvEventsConfig> schema = BuildStoreKvEventsSchema();
  return schema;
}

Status StoreKvEventsConfig::Validate(const FieldNamer& name_of) const {
  auto name = [&](std::string_view field) {
    return name_of ? name_of(field) : fmt::format("kv events: {}", field);
  };
  if (!enabled()) {
    for (const auto& f : StoreKvEventsConfigSchema()) {
      if (f.name == "kv_events_endpoint" || f.get_string(*this).empty()) continue;
      return Status::InvalidArgument(
          fmt::format("{} = '{}' is set but kv_events_endpoint is empty (no events are published "
                      "without it)",
                      name(f.name), f.get_string(*this)));
    }
  }
  const bool printable = std::all_of(kv_events_medium.begin(), kv_events_medium.end(),
                                     [](char c) { return c > ' ' && c < 127; });
  if (!printable) {
    return Status::InvalidArgument(fmt::format("{} = '{}' must be printable ASCII without spaces",
                                               name("kv_events_medium"), kv_events_medium));
  }
  return Status::OK();
}

KvEventPublisherConfig StoreKvEventsConfig::PublisherConfig() const {
  KvEventPublisherConfig c;
  c.endpoint = kv_events_endpoint;
  c.replay_endpoint = kv_events_replay_endpoint;
  c.topic = kv_events_topic;
  return c;
}

StoreKvEvents::StoreKvEvents(std::shared_ptr<KvEventSink> sink, std::string medium,
                             int64_t block_size)
    : sink_(std::move(sink)), medium_(std::move(medium)), block_size_(block_size) {}

void StoreKvEvents::AppendEvictions(StorageBackend& store, std::vector<KvEvent>& events) {
  std::vector<PageKey> evicted = store.TakeEvictions();
  if (evicted.empty()) return;
  BlockRemoved removed{{}, medium_};
  removed.block_hashes.reserve(evicted.size());
  for (const PageKey& key : evicted) removed.block_hashes.push_back(BlockHashOf(key));
  events.push_back(std::move(removed));
}

void StoreKvEvents::OnSet(StorageBackend& store, std::span<const PageKey> keys,
                          std::span<const std::optional<PageKey>> parents,
                          std::span<const PageStatus> outcome) {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<KvEvent> events;
  AppendEvictions(store, events);
  // A page this call wrote that the store also evicted was dropped right after its write (a
  // store evicts a chain's tail first, and the chain may be its oldest): its BlockRemoved goes
  // after its BlockStored. (An older copy evicted before this write would be the other order;
  // a set of a page the store holds replaces it, so that takes an eviction by another call
  // racing this one, and then the stream says absent where the page is: a missed hit, never a
  // hit the store cannot serve.)
  BlockRemoved dropped{{}, medium_};
  if (!events.empty()) {
    std::vector<uint64_t> written;
    for (size_t i = 0; i < keys.size() && i < outcome.size(); ++i) {
      if (outcome[i] == PageStatus::kOk) written.push_back(BlockHashOf(keys[i]));
    }
    std::sort(written.begin(), written.end());
    std::vector<uint64_t>& evicted = std::get<BlockRemoved>(events.back()).block_hashes;
    auto was_written = [&](uint64_t h) {
      return std::binary_search(written.begin(), written.end(), h);
    };
    std::copy_if(evicted.begin(), evicted.end(), std::back_inserter(dropped.block_hashes),
                 was_written);
    evicted.erase(std::remove_if(evicted.begin(), evicted.end(), was_written), evicted.end());
    if (evicted.empty()) events.pop_back();
  }
  const size_t first_stored = events.size();
  for (size_t i = 0; i < keys.size() && i < outcome.size(); ++i) {
    if (outcome[i] != PageStatus::kOk) continue;
    std::optional<uint64_t> parent;
    if (i < parents.size() && parents[i]) parent = BlockHashOf(*parents[i]);
    // A page continues the previous event's chain only when its known parent is that event's
    // last block; a page of unknown parent starts an event of its own.
    BlockStored* last =
        events.size() > first_stored ? std::get_if<BlockStored>(&events.back()) : nullptr;
    if (last == nullptr || !parent || last->block_hashes.back() != *parent) {
      events.push_back(BlockStored{{}, parent, {}, block_size_, std::nullopt, medium_});
      last = &std::get<BlockStored>(events.back());
    }
    last->block_hashes.push_back(BlockHashOf(keys[i]));
  }
  if (!dropped.block_hashes.empty()) events.push_back(std::move(dropped));
  if (!events.empty()) sink_->Publish(std::move(events));
}

void StoreKvEvents::OnRemove(StorageBackend& store, std::span<const PageKey> keys,
                             std::span<const PageStatus> outcome) {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<KvEvent> events;
  AppendEvictions(store, events);
  BlockRemoved removed{{}, medium_};
  for (size_t i = 0; i < keys.size() && i < outcome.size(); ++i) {
    if (outcome[i] == PageStatus::kOk) removed.block_hashes.push_back(BlockHashOf(keys[i]));
  }
  if (!removed.block_hashes.empty()) events.push_back(std::move(removed));
  if (!events.empty()) sink_->Publish(std::move(events));
}

void StoreKvEvents::OnEvictions(StorageBackend& store) {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<KvEvent> events;
  AppendEvictions(store, events);
  if (!events.empty()) sink_->Publish(std::move(events));
}

}  // namespace kvtier
