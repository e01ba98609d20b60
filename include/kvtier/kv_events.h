// kvtier/kv_events.h — KV cache events in vLLM's published schema, for KV-aware routers.
//
// A router (vLLM's, SGLang's, NVIDIA Dynamo, llm-d's indexer) keeps, per engine, the set of blocks
// each tier holds, from a stream of events:
//   BlockStored(block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium)
//   BlockRemoved(block_hashes, medium)
//   AllBlocksCleared()
// batched as KVEventBatch(ts, events[, data_parallel_rank]). These are vLLM's msgspec structs
// (vllm/distributed/kv_events.py), encoded as vLLM encodes them with array_like=True, tag=True,
// omit_defaults=True: every struct is a msgpack array in field order, an event's first element is
// its class name ("BlockStored", "BlockRemoved", "AllBlocksCleared"):
//   batch          [ts float64, [event, ...]] or [ts, [event, ...], data_parallel_rank]
//   BlockStored    ["BlockStored", [hash, ...], parent hash | nil, [token, ...], block_size,
//                   lora_id | nil, medium | nil, lora_name (nil)]
//   BlockRemoved   ["BlockRemoved", [hash, ...], medium | nil]
//   AllBlocksCleared ["AllBlocksCleared"]
// msgspec decodes array-like structs by position and ignores extra trailing elements, so one
// encoding is read by every array-like vLLM decoder: those before `medium` (which ignore medium and
// lora_name), those with `medium`, and those with `lora_name`. vLLM's later releases (PR 42892,
// 2026-06) encode events as maps keyed by field name instead; this encoder writes the array form.
//
// Block hashes: the 64-bit form of kvtier's page keys (kvtier/page_key.h), BlockHashOf(key) = the
// last 8 bytes of the 32-byte SHA-256 page key read as a big-endian unsigned integer — vLLM's own
// rule for int block hashes (int.from_bytes(hash, "big") & (2^64 - 1)) applied to kvtier's key.
// A router computes it from tokens alone: kvtier.page_keys(tokens, page_size, salt, as_int=True).
// Hashes of 2^63 and above are msgpack uint64, as vLLM sends them.
//
// Media (the tier a block entered or left): "GPU" (device), "CPU_PINNED" (host), and for storage
// the backend's kind: "DISK" (file://), "REDIS" (redis://, redis+cluster://), "MEMORY" (memory://).
//
// Transport (KvEventPublisher): vLLM's ZmqEventPublisher's wire protocol:
//   - a PUB socket sends each batch as three frames (topic, seq as 8-byte big-endian, payload);
//     seq counts batches from 0 per publisher;
//   - an optional ROUTER replay socket: a request (identity, "", start seq as 8-byte big-endian)
//     is answered with (identity, "", seq, payload) for every buffered batch with seq >= start,
//     then (identity, "", -1 as 8-byte big-endian signed, "") ends the answer;
//   - the PUB endpoint is bound when it contains '*' or "::" or is ipc:// or inproc://, else
//     connected (vLLM's rule); the replay endpoint is always bound.
// Publish never blocks: batches wait in a queue of at most `max_queue_batches` for the publisher
// thread, and a batch that finds the queue full is dropped and counted. A dropped batch still
// takes its seq, so subscribers see the gap; the replay socket cannot fill it (it never existed
// on the wire). A subscriber too slow for the PUB socket's high-water mark loses batches inside
// ZeroMQ (per subscriber, not counted here); it sees the gap and fetches them from the replay
// buffer (the last `replay_buffer_batches` batches).
//
// A page store's events (StoreKvEvents, for kvtier.PageStore: a StorageBackend driven by an engine
// without kvtier's cache): BlockStored for the pages a set wrote, BlockRemoved for the pages the
// store evicted by itself (StorageBackend::TakeEvictions) and the pages a remove / clear removed,
// all in one medium (the store's StorageMediumOf(url) unless configured: vLLM's tier says
// "STORAGE"). A page's block hash is BlockHashOf(its key); the parent is BlockHashOf(the parent
// key the set was given), else nil. No token ids are known (token_ids is empty, as in vLLM's own
// placeholder events of offloaded blocks); block_size is the store's page size.
//
// Thread safety: KvEventPublisher::Publish and stats() may be called from any thread; the sockets
// belong to the publisher thread. StoreKvEvents may be called from any thread (the store's I/O
// threads: its calls are serialised, so evictions and stores are published in the order it took
// them). Encoding functions are pure.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "kvtier/config_schema.h"
#include "kvtier/page_key.h"
#include "kvtier/status.h"
#include "kvtier/storage.h"
#include "kvtier/storage_schemes.h"
#include "kvtier/token.h"

namespace kvtier {

// The tiers' media; a store's is its scheme's row (kMediumDisk, kMediumRedis, kMediumMemory:
// storage_schemes.h).
inline constexpr std::string_view kMediumGpu = "GPU";
inline constexpr std::string_view kMediumCpuPinned = "CPU_PINNED";

// The 64-bit block hash of a page key (see above).
uint64_t BlockHashOf(const PageKey& key);

// The medium of a storage tier opened from `url`: its scheme's row's (storage_schemes.h: "DISK"
// for file, "REDIS" for redis and redis+cluster, "MEMORY" for memory), else the scheme in upper
// case ("STORAGE" without one). Only the scheme is read (a URL's password never reaches an event).
std::string StorageMediumOf(std::string_view url);

// One or more consecutive blocks of one prefix chain entered `medium`.
struct BlockStored {
  std::vector<uint64_t> block_hashes;
  std::optional<uint64_t> parent_block_hash;  // the block before the first; nullopt at a root
  std::vector<Token> token_ids;               // block_size tokens per block, in order
  int64_t block_size = 0;
  std::optional<int64_t> lora_id;
  std::optional<std::string> medium;
  friend bool operator==(const BlockStored&, const BlockStored&) = default;
};

// Blocks left `medium`.
struct BlockRemoved {
  std::vector<uint64_t> block_hashes;
  std::optional<std::string> medium;
  friend bool operator==(const BlockRemoved&, const BlockRemoved&) = default;
};

// Every block of every medium left.
struct AllBlocksCleared {
  friend bool operator==(const AllBlocksCleared&, const AllBlocksCleared&) = default;
};

using KvEvent = std::variant<BlockStored, BlockRemoved, AllBlocksCleared>;

struct KvEventBatch {
  double ts = 0;  // seconds since the Unix epoch
  std::vector<KvEvent> events;
  std::optional<int64_t> data_parallel_rank;  // omitted from the encoding when unset
  friend bool operator==(const KvEventBatch&, const KvEventBatch&) = default;
};

// The batch's msgpack bytes, as vLLM's msgspec encoder writes them (see above).
std::string EncodeKvEventBatch(const KvEventBatch& batch);

// Where a cache sends its events. The cache calls Publish with the events of one operation, in
// the order they happened, while it holds its own lock (so the stream's order is the cache's
// order): an implementation must not block, wait for I/O or call back into the cache.
class KvEventSink {
 public:
  virtual ~KvEventSink() = default;
  virtual void Publish(std::vector<KvEvent> events) = 0;
};

struct KvEventPublisherConfig {
  std::string endpoint = "tcp://*:5557";  // PUB: bound or connected (see above)
  std::string replay_endpoint;            // ROUTER, always bound; empty: no replay socket
  std::string topic;                      // the first frame of every published message
  int64_t max_queue_batches = 100000;     // batches waiting for the publisher thread, >= 1
  int64_t replay_buffer_batches = 10000;  // batches kept for replay, >= 0
  int64_t send_hwm = 100000;              // the PUB socket's high-water mark (messages), >= 0
  int64_t linger_ms = 1000;  // how long closing waits for unsent messages, in [0, 60000]
  std::optional<int64_t> data_parallel_rank;  // written into every batch when set

  // InvalidArgument naming the field and its value.
  Status Validate() const;
};

struct KvEventPublisherStats {
  uint64_t published_batches = 0;  // sent on the PUB socket
  uint64_t published_events = 0;
  uint64_t dropped_batches = 0;  // found the queue full
  uint64_t dropped_events = 0;
  uint64_t replay_requests = 0;      // answered
  uint64_t bad_replay_requests = 0;  // not (identity, "", 8-byte seq): ignored
  uint64_t send_errors = 0;          // ZeroMQ refused a send (the batch stays replayable)
};

// The ZeroMQ publisher. Move-only through its unique_ptr; destruction sends what is queued, then
// closes the sockets (waiting up to linger_ms for unsent messages).
class KvEventPublisher final : public KvEventSink {
 public:
  // Binds / connects the sockets and starts the publisher thread. InvalidArgument for a bad
  // config, Unavailable naming the endpoint when a socket cannot bind or connect.
  static Result<std::unique_ptr<KvEventPublisher>> Open(const KvEventPublisherConfig& config);
  ~KvEventPublisher() override;
  KvEventPublisher(const KvEventPublisher&) = delete;
  KvEventPublisher& operator=(const KvEventPublisher&) = delete;

  // One batch stamped with the current time; never blocks (dropped and counted when the queue is
  // full). An empty `events` publishes nothing.
  void Publish(std::vector<KvEvent> events) override;
  // Waits until every batch published before the call has been sent (or dropped), up to
  // `timeout`; true when it has.
  bool Flush(std::chrono::milliseconds timeout);

  KvEventPublisherStats stats() const;
  // The endpoints as bound (a '*' port resolved, e.g. "tcp://127.0.0.1:41234"); a connected PUB
  // endpoint as configured; "" for no replay socket.
  const std::string& endpoint() const;
  const std::string& replay_endpoint() const;

 private:
  class Impl;
  explicit KvEventPublisher(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// ---- a page store's events ----------------------------------------------------------------------

// Where a page store publishes its events; its fields are keyword options of kvtier.PageStore
// (StoreKvEventsConfigSchema), next to the storage options.
struct StoreKvEventsConfig {
  std::string kv_events_endpoint;         // the PUB socket (KvEventPublisherConfig); "" = no events
  std::string kv_events_replay_endpoint;  // the ROUTER replay socket; "" = none
  std::string kv_events_topic;            // the first frame of every message
  std::string kv_events_medium;           // the events' medium; "" = StorageMediumOf(the URL)

  bool enabled() const { return !kv_events_endpoint.empty(); }
  // InvalidArgument naming the field (`name_of` renames it): an option set without an endpoint
  // (it would be silently unused), a medium that is not printable text.
  Status Validate(const FieldNamer& name_of = {}) const;
  // The publisher's config for these options.
  KvEventPublisherConfig PublisherConfig() const;
};
const ConfigSchema<StoreKvEventsConfig>& StoreKvEventsConfigSchema();

// A page store's events (see the top of this file), published to `sink` in one batch per call.
class StoreKvEvents {
 public:
  // `medium`: the events' medium; `block_size`: tokens per page (the namespace's page size).
  StoreKvEvents(std::shared_ptr<KvEventSink> sink, std::string medium, int64_t block_size);
  StoreKvEvents(const StoreKvEvents&) = delete;
  StoreKvEvents& operator=(const StoreKvEvents&) = delete;

  // After a set of `keys` into `store` completed with `outcome` (one per key): BlockRemoved for
  // what `store` evicted by itself since the last call (it made room for these pages), then
  // BlockStored for the pages written (kOk), consecutive ones of one chain in one event; a page
  // written and evicted by the same call (dropped at once) gets its BlockRemoved after them.
  // `parents`: empty (unknown) or one per key. REQUIRES store.TrackEvictions(true) for evictions.
  void OnSet(StorageBackend& store, std::span<const PageKey> keys,
             std::span<const std::optional<PageKey>> parents, std::span<const PageStatus> outcome);
  // After a remove / clear of `keys`: pending evictions, then BlockRemoved for the kOk pages.
  void OnRemove(StorageBackend& store, std::span<const PageKey> keys,
                std::span<const PageStatus> outcome);
  // The pending evictions alone (before a store closes).
  void OnEvictions(StorageBackend& store);

  const std::string& medium() const { return medium_; }

 private:
  // REQUIRES mu_ held.
  void AppendEvictions(StorageBackend& store, std::vector<KvEvent>& events);

  const std::shared_ptr<KvEventSink> sink_;
  const std::string medium_;
  const int64_t block_size_;
  // Serialises TakeEvictions with Publish, so one eviction is published once, in the order the
  // calls completed.
  std::mutex mu_;
};

}  // namespace kvtier
