// kvtier/hierarchical_cache.h — the engine-facing hierarchical KV cache: device, host and storage.
//
// The engine brings its device KV pool as a layer_first `KvRegion` (in CPU-only tests that region
// simply lives in host memory and the cpu backend moves it; the cache does not care). The cache
// owns everything else: the allocation of the device pool's pages (engines get slots from
// AllocateDeviceSlots and hand them back through Insert or FreeDeviceSlots), a HostKvPool for the
// host tier (or pins in a host tier shared with other processes: `shared_host`, a
// SharedHostPool), optionally a StorageBackend (kvtier/storage.h) for the storage tier, the radix
// tree that indexes all three tiers, and the copies between them.
//
// A request's life, as an engine drives it:
//   m = Match(tokens, ns)          cached prefix: device slots, then tokens cached in host memory,
//                                  then tokens known to be in storage; the matched nodes stay
//                                  pinned until Release(m.handle)
//   QueryStorage(m.handle)         (storage) asks the backend for further pages of `tokens` the
//                                  tree does not know (another process, an earlier run)
//   Prefetch(m.handle, policy)     (storage) storage -> host for the storage part; returns at once
//   LoadBack(m.handle, stream)     host part -> freshly allocated device slots; a running
//                                  prefetch is ended by its policy, its pages streamed to the
//                                  device as they arrive; per-layer readiness through WaitLayer
//   AllocateDeviceSlots(n)         slots for the tokens the engine computes (evicts if needed)
//   ... prefill writes the KV of the new tokens into those slots ...
//   Insert(tokens, slots, ns)      the cache takes ownership of the slots (duplicates of pages
//                                  that are already cached are freed); the write policy decides
//                                  what is backed up to host memory and storage
//   Release(m.handle)              unpins; cancels a prefetch still running
//
// Retention (Pin / Unpin): a prefix that must stay cached whatever the eviction policy says (a
// system prompt, an agent's tools). Pin covers the longest cached prefix of its tokens *now*
// (pages cached later are not covered: pin again once they are, pins overlap freely) in the
// tiers it names: a pinned page is not evicted from a named tier while it is there (a pin copies
// nothing into a tier; a page that never reached host memory is not put there by a host pin), and
// a pinned node stays in the tree. Storage: the tree does not forget pinned pages, and a backend
// that can (file://, memory://) keeps their keys out of its own eviction (StorageBackend::
// PinPages); Redis cannot (docs/architecture.md says what to configure instead). A pin ends at
// Unpin or when its TTL has run out; expired pins are released lazily, by the next call that
// takes the cache's lock (no thread, no timer: one comparison per call). Each tier has a budget
// of pinned tokens (pin_*_budget_tokens; 0: no pins in that tier): a pin that would take a tier
// beyond it is refused (InvalidArgument) and changes nothing. Tokens covered by several pins
// count once.
//
// Ownership of device pages: every page of the device pool is free, held by the engine (handed
// out by AllocateDeviceSlots, not yet inserted or freed) or held by the tree. Insert and
// FreeDeviceSlots accept only pages the engine holds (or, for Insert, the tree's own pages at the
// same positions, as returned by Match). Anything else is InvalidArgument and changes nothing.
//
// Namespaces: `ns` separates tenants: prefixes never match across namespaces, and with a storage
// tier `ns` is the tenant salt of the page keys (kvtier/page_key.h; the empty namespace gives
// SGLang's unsalted keys). A namespace exists while it holds nodes.
//
// Write policies: write_through backs up every insert; write_through_selective backs up a node
// once its hit count (inserts and matches touching it) reaches `write_through_threshold`;
// write_back backs up to host only when a node leaves the device, and to storage only when it
// leaves host memory. Device -> host backups cover the whole unbacked path from the namespace
// root, so host copies form a contiguous prefix. With a storage tier, write_through and
// write_through_selective also back up to storage what they backed up to host, once the device ->
// host copy has completed; only pages storage does not already hold are written; backups to
// storage go through a bounded queue (when it is full they are skipped and counted, never waited
// for).
//
// Eviction is page-granular in every tier: when a tier needs n pages, the tail pages of the
// evictable leaf that comes first in the tier's policy order go first (a node is split when only
// part of it goes), then the next, until n pages are free. Under LRU a page's recency is the last
// Match or Insert that touched it. Device leaves with a host copy stay cached in host memory;
// under write_back an unbacked device leaf is first copied to host memory (submitted under the
// lock, the slots freed once the copy has completed). Host eviction takes host-only leaves; a
// node that storage holds stays known as storage-only (up to `max_storage_only_pages`, least
// recently used forgotten beyond that; a page a prefetch finds absent or corrupt is forgotten
// with everything after it). A node being written to storage keeps its host pages until the write
// has completed.
//
// Prefetch (storage -> host): host pages are allocated up front and marked filling; a filling
// page is never a host hit and never evicted. At most max_prefetch_host_fraction of the host pool
// is filling at once; a prefetch of fewer than prefetch_threshold_tokens tokens does nothing. The
// prefetch ends by its policy when the engine asks (FinishPrefetch, or LoadBack): best_effort
// takes what has arrived, wait_complete waits for every page, timeout waits until every page
// arrived or the deadline passed (base + per 1,024 tokens, capped). Pages that arrived (a prefix:
// a missing, corrupt or timed-out page cuts it) become host hits of the handle; the rest is
// cancelled and its host pages freed. Bytes are verified by the storage format (checksums); a
// page that does not check out is a miss, never wrong bytes.
//
// Copies in flight (the races that corrupt KV in other systems, each with a test):
//   - a device slot is never freed while a backup reads it, nor while the engine's writes to it
//     (on the stream given to Insert) may still be queued: a copy into reused slots is ordered
//     after them;
//   - a host page is never reused while a copy writes into or reads from it (device <-> host or
//     host <-> storage): pages belong to their operation from submission to completion;
//   - a matched node is never evicted between Match and Release: the handle pins it;
//   - (GPU) the device slots a LoadBack writes are not evicted before the copy has finished;
//   - a copy that fails after part of it was enqueued keeps its pages reserved until it is known
//     to be finished; a failed backup changes nothing but its own pages and is not counted as a
//     backup.
// Copies run on the cpu thread pool (cpu backend; backup_threads = 0 runs them in the calling
// thread after the lock is released) or on a dedicated CUDA stream (kernel/dma), storage I/O on
// the backend's threads; completion is observed through futures and events, never by sleeping.
//
// Thread safety: every method may be called from any thread. One internal mutex guards the
// bookkeeping only: no byte copy, stream synchronisation, storage call, wait for another
// operation or user callback runs while it is held (the eviction listener runs after it is
// released; the KV event sink, which must only queue, is handed its events just before). Calls that
// wait (WaitForBackups, FinishPrefetch, LoadBack finishing a prefetch, eviction that needs a copy
// to complete) wait outside it.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kvtier/eviction_policy.h"
#include "kvtier/kv_events.h"
#include "kvtier/layout.h"
#include "kvtier/status.h"
#include "kvtier/storage.h"
#include "kvtier/token.h"
#include "kvtier/transfer.h"

namespace kvtier {

class SharedHostPool;  // kvtier/shared_host_pool.h

enum class WritePolicy : uint8_t { kWriteThrough = 0, kWriteThroughSelective = 1, kWriteBack = 2 };
inline constexpr int kNumWritePolicies = static_cast<int>(WritePolicy::kWriteBack) + 1;
// "write_through", "write_through_selective", "write_back".
const char* WritePolicyName(WritePolicy policy);
Result<WritePolicy> ParseWritePolicy(std::string_view name);

// How a prefetch ends when the engine asks for its result (SGLang's hicache prefetch policies).
enum class PrefetchPolicy : uint8_t { kBestEffort = 0, kWaitComplete = 1, kTimeout = 2 };
inline constexpr int kNumPrefetchPolicies = static_cast<int>(PrefetchPolicy::kTimeout) + 1;
// "best_effort", "wait_complete", "timeout".
const char* PrefetchPolicyName(PrefetchPolicy policy);
Result<PrefetchPolicy> ParsePrefetchPolicy(std::string_view name);

enum class CacheTier : uint8_t { kDevice = 0, kHost = 1, kStorage = 2 };
// "device", "host", "storage".
const char* CacheTierName(CacheTier tier);

// Which host pages go on to storage (storage admission, issue 40): a page is worth a write only
// if it will be read again. Whatever the write policy offers (write_through and
// write_through_selective: what their backups landed; write_back: what host eviction would drop),
// admission decides, page by page from the first unstored page of the path on; the first page it
// refuses ends the write (a stored page is only reachable after its whole prefix).
//   all        every page (the write policy alone decides);
//   hits       pages of nodes whose hit count (inserts and matches touching them, as
//              write_through_selective counts) is at least `threshold`;
//   frequency  pages whose access count in a small count-min sketch (TinyLFU's: 4 rows of
//              `sketch_counters` 4-bit counters, halved every 10 x sketch_counters accesses, so
//              it forgets) is at least `threshold`, or any page while the writes waiting have
//              room (the store's queue takes the store now, or the backlog holds it whole).
//              An access is a page of a Match's matched prefix or a page Insert added; the sketch
//              remembers pages long after every tier dropped them.
// Writes wait in a backlog of at most `backlog_bytes` (and at most an eighth of the host tier:
// waiting writes keep their host pages) before they reach the store (at most
// max_backup_queue_pages pages of writes are with the store at once). When it is full, the writes
// least likely to be reused (the lowest estimate: hit count for all / hits, sketch count for
// frequency) are dropped, the newcomer included, not the newest by queue order. Every page not
// written is counted under one reason (CacheStats: backlog full, admission refused, queue full,
// timed out, failed, store refused). A path refused or dropped is offered again by the next Match
// that hits it in host memory.
enum class StorageAdmission : uint8_t { kAll = 0, kHits = 1, kFrequency = 2 };
inline constexpr int kNumStorageAdmissions = static_cast<int>(StorageAdmission::kFrequency) + 1;
// "all", "hits", "frequency".
const char* StorageAdmissionName(StorageAdmission admission);
Result<StorageAdmission> ParseStorageAdmission(std::string_view name);

struct StorageAdmissionConfig {
  StorageAdmission policy = StorageAdmission::kFrequency;
  int64_t threshold = 2;                     // hits / frequency: the count a page needs
  int64_t sketch_counters = 1 << 16;         // frequency: counters per sketch row (a power of two)
  int64_t backlog_bytes = int64_t{1} << 30;  // writes waiting for the store; 0: none wait
};
// Its fields (policy, threshold, sketch_counters, backlog_bytes); in the cache's schema as
// admission_*.
const ConfigSchema<StorageAdmissionConfig>& StorageAdmissionConfigSchema();

// Reported for every run of pages that leaves a tier (after the cache's lock is released).
// kStorage: the tree forgot pages it knew to be in storage (the bytes may still be there).
struct EvictionEvent {
  CacheTier tier;
  std::string_view name_space;
  std::span<const Token> prefix;  // tokens from the namespace root through the evicted pages
  int64_t num_tokens;             // the last num_tokens of `prefix` left `tier`
  bool kept_in_host;              // device evictions: the tokens stay cached in host memory
  bool kept_in_storage;           // host evictions: the tokens stay known as storage-only
};

// The storage tier. Off unless `backend` or `url` is set.
struct StorageTierConfig {
  // A backend shared with others (several caches may use one). Its namespace must describe this
  // cache's host pages: layout == host_layout, mla, num_layers, slot_bytes, page_size, head_num.
  std::shared_ptr<StorageBackend> backend;
  // Or a URL (kvtier/storage.h) that Create opens with the namespace built from the device region,
  // the host layout and the fields below. Ignored when `backend` is set.
  std::string url;
  StorageOptions options;  // for `url`
  std::string model_id;    // for `url`: StorageNamespace::model_id (free text)
  std::string kv_dtype = "bf16";
  int64_t tp_rank = 0;
  int64_t tp_size = 1;

  PrefetchPolicy prefetch_policy = PrefetchPolicy::kBestEffort;  // Prefetch's default
  int64_t prefetch_threshold_tokens = 256;                       // smaller prefetches do nothing
  double prefetch_timeout_base_s = 2.0;                          // timeout policy: base ...
  double prefetch_timeout_per_1k_tokens_s = 0.1;  // ... + this per 1,024 tokens requested ...
  double prefetch_timeout_max_s = 30.0;           // ... capped here
  double max_prefetch_host_fraction = 0.5;        // of the host pool filling at once, in (0, 1]
  int64_t max_prefetch_batch_pages = 256;         // pages per Get batch
  // Streamed storage hits: a LoadBack that ends a wait_complete or timeout prefetch copies its
  // pages to the device as they arrive, in prefix order, instead of waiting for the whole read
  // first (LoadBack). Such prefetches are read in at least 8 batches, so that they arrive in
  // pieces. Off: the read ends first, then the load runs (as FinishPrefetch, then LoadBack).
  bool stream_load_back = true;
  // Never slower than recomputing: the engine's prefill rate in tokens/s (0 = off). When set, a
  // storage hit is prefetched only where reading it is estimated cheaper than recomputing it:
  // reading costs bytes / the storage read bandwidth this cache measured (a moving average over
  // its completed prefetches' Get batches: bytes that arrived / time from submission to the last
  // batch), recomputing costs tokens / prefill_tokens_per_second. Both grow linearly with the
  // tokens, so a storage part is read whole or not at all; until the first prefetch completed
  // nothing is measured and nothing is cut. QueryStorage and Prefetch say where and why they cut
  // (StorageCut).
  double prefill_tokens_per_second = 0;

  // Storage-only pages the tree remembers (beyond: the least recently used are forgotten).
  int64_t max_storage_only_pages = 1 << 20;
  // Backups to storage waiting for the backend or running, in pages; beyond, they wait in the
  // write backlog (admission above). Each queued page holds its host page, and the store works
  // through its queue in order: 512 keeps two full Set batches (max_backup_batch_pages) and 32
  // pages per I/O thread with the store (1 GiB of Llama-3-8B's 2 MiB pages, 0.6 s of a 1.8 GB/s
  // disk), and leaves the choice of what waits to the backlog, which drops the least likely
  // reused. 4,096 (before) queued 4.7 s of writes at 2 MiB (the GPU replay's Sets waited 1.2 s
  // and timed out) and held 2/3 of the CPU replay's host tier; every admission policy had more
  // hits with 512 there (docs/perf-notes/storage-writes.md).
  int64_t max_backup_queue_pages = 512;
  // Pages per Set batch; fewer where pages are large: a batch is sized to be written within the
  // backend's per-call timeout at 128 MB/s (cache/backup_planner.h).
  int64_t max_backup_batch_pages = 256;
  // Which pages are written to storage and how many writes wait (StorageAdmission above).
  StorageAdmissionConfig admission;
  // Called with the keys of the pages admission admitted, each time it admits some (before the
  // write is queued, backlogged or dropped for want of room), under the cache's lock: it must only
  // record, never block or call into the cache. For measuring what the policy chose (kvtier
  // replay's storage oracle); empty: not called.
  std::function<void(std::span<const PageKey>)> admitted_listener;

  bool enabled() const { return backend != nullptr || !url.empty(); }
  // When enabled: the storage fields of HierarchicalCacheConfigSchema within their bounds and
  // tp_rank < tp_size; InvalidArgument naming the field and its value.
  Status Validate() const;
};

struct HierarchicalCacheConfig {
  // Page size of every tier; 0 = the device region's page_size, else it must equal it
  // (ValidatePageSize, kvtier/layout.h).
  int64_t page_size = 0;
  // Host tier capacity: host_capacity_bytes when > 0, else host_ratio x the device pool's bytes.
  // Both 0: no host tier. Then device evictions forget the tokens, nothing is backed up (any
  // write policy), Match reports no host tokens, LoadBack loads nothing, host_region() is empty
  // and the host gauges are 0. A storage tier needs a host tier (prefetches land in host memory).
  int64_t host_capacity_bytes = 0;
  double host_ratio = 2.0;
  // With a storage tier: page_first, page_first_direct or page_head (a page is one contiguous
  // range per buffer, stored with zero copies).
  KvLayout host_layout = KvLayout::kPageFirst;
  int64_t host_head_num = 0;  // page_head: heads per slot; 0 = the device region's head_num
  bool host_huge_pages = false;

  WritePolicy write_policy = WritePolicy::kWriteThroughSelective;
  int64_t write_through_threshold = 2;  // write_through_selective: hits before a backup

  EvictionPolicyKind device_eviction = EvictionPolicyKind::kLru;
  EvictionPolicyKind host_eviction = EvictionPolicyKind::kLru;
  // Custom policies; override the kinds above when set.
  std::shared_ptr<const EvictionPolicy> device_eviction_policy;
  std::shared_ptr<const EvictionPolicy> host_eviction_policy;

  TransferBackend transfer_backend = TransferBackend::kCpu;
  TransferEngineConfig transfer;
  // cpu backend: threads of the pool running device <-> host backups, in [0, 64]; 0 = in the
  // calling thread, after the cache's lock is released (deterministic).
  int backup_threads = 1;
  // LoadBack leaves host hits shorter than this many tokens where they are (the engine
  // recomputes them instead).
  int64_t load_back_min_tokens = 0;

  StorageTierConfig storage;

  // A host tier shared with other processes (kvtier/shared_host_pool.h) instead of the cache's
  // own host pool. Its segment fixes the host layout (host_layout and host_head_num are not
  // used; its page_size, num_layers, slot_bytes, head_num and MLA flag must be the device
  // region's). Host pages are published by key (tenant salt `ns` and storage.model_id included):
  //   - Match: after the tree's device and host match, the next pages are looked up by key in
  //     the segment and become host hits of the handle, pages other processes published
  //     included (device-only nodes at the end of the match take theirs as host copies first);
  //   - backups reserve pages by key: a page already published (by anyone) is taken without a
  //     copy; a page another process is writing, or no room, skips the backup (counted);
  //   - the tree's host pages are pinned in the segment; host eviction unpins them (at most
  //     host_capacity_bytes, or host_ratio x the device pool, held at once; capped at the
  //     segment); an unpinned page stays findable until the segment's LRU evicts it;
  //   - LoadBack copies straight from the segment's pages.
  // Incompatible with a storage tier (InvalidArgument).
  std::shared_ptr<SharedHostPool> shared_host;

  // Called for every eviction, after the cache's lock is released, on the thread whose call
  // evicted; it may call back into the cache. For tests and metrics.
  std::function<void(const EvictionEvent&)> eviction_listener;

  // KV events (kvtier/kv_events.h): every run of pages entering or leaving a tier — device
  // ("GPU": Insert, LoadBack; eviction), host ("CPU_PINNED": a backup's pages assigned, a prefetch
  // concluded, shared pages adopted; eviction, a failed copy), storage (a store completed, pages
  // QueryStorage found; the tree forgetting them, storage reporting them gone) — as BlockStored /
  // BlockRemoved with the pages' block hashes (BlockHashOf of their keys, salted by the
  // namespace). Handed to the sink in order, under the cache's lock, as the lock is released: the
  // sink must not block or call into the cache (KvEventPublisher only queues). With a sink, Insert
  // computes page keys even without a storage tier.
  std::shared_ptr<KvEventSink> kv_event_sink;
  // The storage tier's medium in events; empty: StorageMediumOf(the backend's URL).
  std::string kv_event_storage_medium;

  // Retention budgets (Pin): the most tokens pins may cover in each tier (tokens covered by
  // several pins count once; a pin counts against each tier it names, for all the tokens it
  // covers, wherever they are cached). 0: Pin refuses that tier. The device and host budgets
  // must leave room in their pools (Create checks they are below the pool's tokens).
  int64_t pin_device_budget_tokens = 0;
  int64_t pin_host_budget_tokens = 0;
  int64_t pin_storage_budget_tokens = 0;
  // For tests: the clock pins' TTLs run on (null: std::chrono::steady_clock::now).
  std::function<std::chrono::steady_clock::time_point()> pin_clock;

  bool has_host_tier() const { return host_capacity_bytes > 0 || host_ratio != 0; }
  // Every field of HierarchicalCacheConfigSchema within its bounds, then the rules between
  // fields; InvalidArgument naming the field (through `name_of`, when given) and its value.
  Status Validate(const FieldNamer& name_of = nullptr) const;
};

// Every field of HierarchicalCacheConfig that is a number, a name or a flag
// (kvtier/config_schema.h): name, bounds and help, declared once; defaults are the member
// initializers above. The transfer engine's fields come from TransferEngineConfigSchema under their
// own names; storage fields are prefixed "storage_" where the bare name would be ambiguous
// ("storage" is storage.url) and are checked only with a storage tier. Validate, the Python keyword
// arguments of kvtier.HierarchicalCache and the replay's checks read it.
const ConfigSchema<HierarchicalCacheConfig>& HierarchicalCacheConfigSchema();

// The block hashes (kvtier/kv_events.h) of the pages each tier holds, sorted; what a subscriber
// rebuilds from the cache's KV events.
struct TierBlockHashes {
  std::vector<uint64_t> device;   // "GPU"
  std::vector<uint64_t> host;     // "CPU_PINNED"
  std::vector<uint64_t> storage;  // the storage medium (pages the tree knows to be stored)
};

// Pins what a Match matched until Release. Plain value; the cache validates it on every use, and
// a handle of another cache instance is InvalidArgument (ids are unique per instance).
struct MatchHandle {
  uint64_t id = 0;
};

struct MatchResult {
  MatchHandle handle;
  int64_t device_tokens = 0;          // leading tokens whose KV is on the device ...
  std::vector<int64_t> device_slots;  // ... at these slots of the device region
  int64_t host_tokens = 0;            // the next tokens, cached in host memory ...
  std::vector<int64_t> host_slots;    // ... at these slots of host_region()
  int64_t storage_tokens = 0;         // the next tokens, known to be in storage only
};

// Why storage tokens were not (or would not be) prefetched.
enum class StorageCutReason : uint8_t {
  kNone = 0,              // nothing cut
  kRecomputeCheaper = 1,  // reading them is estimated slower than recomputing them
};
// "none", "recompute_cheaper".
const char* StorageCutReasonName(StorageCutReason reason);

// Where the cache cut a storage hit (StorageTierConfig::prefill_tokens_per_second).
struct StorageCut {
  StorageCutReason reason = StorageCutReason::kNone;
  int64_t tokens = 0;  // storage tokens left to recomputing (from the end of the storage part)
  // The estimates for the whole storage part that decided it (0 when not estimated: the rule is
  // off or no read bandwidth was measured yet).
  double read_seconds = 0;           // bytes / measured storage read bandwidth
  double recompute_seconds = 0;      // tokens / prefill_tokens_per_second
  double read_bytes_per_second = 0;  // the measured bandwidth used
};

// QueryStorage's answer: the handle's storage part after the query.
struct StorageQueryResult {
  int64_t storage_tokens = 0;  // tokens after the host part found in storage (tree + backend)
  int64_t queried_tokens = 0;  // of those, found by asking the backend in this call
  // Of storage_tokens, those a Prefetch now would read (storage_tokens - cut.tokens).
  int64_t worth_reading_tokens = 0;
  StorageCut cut;
};

enum class PrefetchState : uint8_t {
  kNone = 0,      // nothing to prefetch, below the threshold, no host room, or no storage tier
  kRunning = 1,   // pages are still arriving
  kComplete = 2,  // every requested page arrived
  kPartial = 3,   // ended with a prefix of the pages (best_effort, a miss, a corrupt page, cancel)
  kTimedOut = 4,  // timeout policy: the deadline passed with pages missing
};
// "none", "running", "complete", "partial", "timed_out".
const char* PrefetchStateName(PrefetchState state);

struct PrefetchResult {
  PrefetchState state = PrefetchState::kNone;
  PrefetchPolicy policy = PrefetchPolicy::kBestEffort;
  int64_t requested_tokens = 0;  // storage tokens the prefetch asked for
  int64_t arrived_tokens = 0;    // leading tokens in host memory so far / at the end
  // After the prefetch ended: the handle's host part now (host hits incl. the arrived tokens,
  // after its device part: those a streamed LoadBack loaded already are device hits).
  int64_t host_tokens = 0;
  // Start (Prefetch): storage tokens not requested because recomputing them is cheaper; a cut
  // of the whole storage part leaves state kNone.
  StorageCut cut;
};

struct LoadBackResult {
  int64_t loaded_tokens = 0;          // copied from host memory by this call
  int64_t skipped_tokens = 0;         // host hits left alone (below load_back_min_tokens)
  std::vector<int64_t> device_slots;  // the whole matched prefix now on the device
  PrefetchResult prefetch;            // the prefetch this call ended, if one was running
};

struct InsertOptions {
  // Feeds the priority eviction policy (a node keeps the highest priority it was given).
  int32_t priority = 0;
  // The result carries a live handle pinning the inserted tokens (for a request that keeps
  // decoding on them, as SGLang's cache_unfinished_req does); Release it like a Match handle.
  bool pin = false;
  // GPU: the stream on which the engine wrote the KV of these slots (nullptr: the legacy default
  // stream). Copies out of the slots, and copies into them after they are reused, are ordered
  // after the work queued on it so far.
  CudaStream stream = nullptr;
};

// A live pin (Pin / Unpin). Plain value; id 0 is no pin.
struct PinHandle {
  uint64_t id = 0;
};

// Pin's ttl_seconds for a pin that lasts until Unpin.
inline constexpr double kPinForever = std::numeric_limits<double>::infinity();

struct PinResult {
  PinHandle pin;              // id 0: nothing of the tokens is cached, nothing was pinned
  int64_t pinned_tokens = 0;  // the leading tokens the pin covers (the longest cached prefix)
  // Storage named, with a storage tier: the backend keeps the pages' keys out of its own eviction
  // too (false: it cannot, e.g. Redis; the tree still does not forget them).
  bool store_pinned = false;
};

struct InsertResult {
  MatchHandle handle;            // with options.pin: a live handle pinning the inserted tokens
  int64_t cached_tokens = 0;     // already on the device (their slots stay the cache's)
  int64_t revived_tokens = 0;    // were cached in host memory / storage only; now on the device
  int64_t new_tokens = 0;        // not cached before
  int64_t duplicate_tokens = 0;  // engine slots freed because the tree already had that page
};

struct AllocateOptions {
  // When the device cannot make room for all of num_tokens: return as many whole pages as it can
  // (possibly none) instead of OutOfMemory.
  bool allow_fewer = false;
};

// A histogram in the Prometheus sense, kept raw: counts[i] = observations in
// (kBounds[i-1], kBounds[i]] (not cumulative); counts[kNumBounds] = above the last bound.
// `Bounds::kBounds` holds the upper bounds, ascending.
template <typename Bounds>
struct Histogram {
  static constexpr auto kBounds = Bounds::kBounds;
  static constexpr int kNumBounds = static_cast<int>(Bounds::kBounds.size());
  std::array<int64_t, Bounds::kBounds.size() + 1> counts{};
  int64_t count = 0;
  double sum = 0;
  void Observe(double value) {
    size_t i = 0;
    while (i < kBounds.size() && value > kBounds[i]) ++i;
    ++counts[i];
    ++count;
    sum += value;
  }
};
// Seconds of a LoadBack copy (a streamed LoadBack makes one per piece).
struct LoadBackDurationBounds {
  static constexpr std::array<double, 12> kBounds = {0.0001, 0.0005, 0.001, 0.002, 0.005, 0.01,
                                                     0.02,   0.05,   0.1,   0.5,   1.0,   5.0};
};
// Seconds of one eviction (a call that evicted pages): SGLang's buckets from 1 ms up, with finer
// ones below, where evicting a few hundred pages lands.
struct EvictionDurationBounds {
  static constexpr std::array<double, 18> kBounds = {
      0.00001, 0.00002, 0.00005, 0.0001, 0.0002, 0.0005, 0.001, 0.002, 0.003,
      0.005,   0.01,    0.02,    0.05,   0.1,    0.2,    0.5,   1.0,   5.0};
};
// GB/s of one prefetch or one storage backup (SGLang's buckets).
struct BandwidthBounds {
  static constexpr std::array<double, 7> kBounds = {0.1, 0.5, 1, 5, 10, 50, 100};
};
using DurationHistogram = Histogram<LoadBackDurationBounds>;
using EvictionHistogram = Histogram<EvictionDurationBounds>;
using BandwidthHistogram = Histogram<BandwidthBounds>;

// Counters (monotonic; tokens unless named otherwise) and gauges for operators. Reading them
// never waits behind a copy.
struct CacheStats {
  int64_t page_size = 0;
  // Gauges.
  int64_t device_total_tokens = 0;
  int64_t device_used_tokens = 0;    // allocated pages: cached + held by the engine
  int64_t device_cached_tokens = 0;  // in the tree
  int64_t device_engine_tokens = 0;  // handed to the engine, not yet inserted or freed
  int64_t host_total_tokens = 0;
  int64_t host_used_tokens = 0;     // cached + filling
  int64_t host_filling_tokens = 0;  // allocated to prefetches still running
  int64_t host_total_bytes = 0;
  int64_t storage_known_tokens = 0;  // tokens the tree knows to be in storage (any tier too)
  int64_t storage_only_tokens = 0;   // ... of which in storage only
  int64_t nodes = 0;
  int64_t namespaces = 0;
  int64_t live_handles = 0;
  // Retention (Pin): tokens covered by live pins in each tier, and the live pins.
  int64_t pinned_device_tokens = 0;
  int64_t pinned_host_tokens = 0;
  int64_t pinned_storage_tokens = 0;
  int64_t live_pins = 0;
  int64_t backup_inflight_tokens = 0;          // device -> host copies running
  int64_t storage_backup_inflight_tokens = 0;  // host -> storage writes queued or running
  int64_t storage_backlog_tokens = 0;          // ... of which waiting in the write backlog
  int64_t storage_backlog_bytes = 0;
  int64_t prefetch_inflight_tokens = 0;  // storage -> host reads running

  // Matching (cached_tokens_total{cache_source=device|host|storage}).
  int64_t match_calls = 0;
  int64_t match_query_tokens = 0;
  int64_t device_hit_tokens = 0;
  int64_t host_hit_tokens = 0;
  int64_t storage_hit_tokens = 0;  // storage part of matches (tree and QueryStorage)
  int64_t query_storage_calls = 0;
  int64_t query_storage_tokens = 0;  // found by asking the backend

  // Prefetch (storage -> host).
  int64_t prefetch_calls = 0;
  int64_t prefetch_requested_tokens = 0;
  int64_t prefetched_tokens = 0;  // arrived and became host hits
  int64_t prefetch_below_threshold_tokens = 0;
  int64_t prefetch_no_room_tokens = 0;  // not started: the filling cap or no host pages
  int64_t prefetch_complete = 0, prefetch_partial = 0, prefetch_timed_out = 0;  // prefetches
  int64_t prefetch_cancelled = 0;  // released while running
  int64_t prefetch_bytes = 0;
  double prefetch_seconds = 0;            // start to end of each prefetch
  BandwidthHistogram prefetch_bandwidth;  // GB/s of each prefetch that brought pages

  // Load back (host -> device).
  int64_t load_back_calls = 0;
  int64_t load_back_tokens = 0;
  int64_t load_back_skipped_tokens = 0;
  // Time of the LoadBack copies to completion: on a GPU the copy's device time between CUDA events
  // (counted once the copy has completed), on cpu the synchronous copy's wall time (a streamed
  // LoadBack: its pieces', not its waits for storage).
  double load_back_seconds = 0;
  DurationHistogram load_back_duration;

  // Inserts and backups.
  int64_t inserted_tokens = 0;  // new + revived
  int64_t duplicate_tokens = 0;
  int64_t backup_tokens = 0;          // completed device -> host copies
  int64_t backup_failed_tokens = 0;   // device -> host copies that failed (not in backup_tokens)
  int64_t backup_skipped_tokens = 0;  // no host space (shared host: or being written elsewhere)
  // Shared host tier: pages found published already (not copied by backups), and host hits
  // found in the segment by key after the tree's match (a part of host_hit_tokens).
  int64_t backup_present_tokens = 0;
  int64_t shared_host_hit_tokens = 0;
  int64_t backup_bytes = 0;
  double backup_seconds = 0;      // submission to completion, summed over copies
  int64_t write_back_tokens = 0;  // copied to host on device eviction (write_back)
  // Host -> storage. Every page offered to storage ends under exactly one of written (tokens),
  // present, refused (admission), backlog (dropped from a full backlog), queue_full (dropped),
  // capacity, timed_out or failed; `policy` counts device pages that left the cache never copied
  // because the write policy did not ask (write_through_selective below its threshold). A page
  // skipped once may be offered again later (counted again there).
  int64_t storage_backup_tokens = 0;          // completed host -> storage writes
  int64_t storage_backup_failed_tokens = 0;   // not written: the write failed (not timed out)
  int64_t storage_backup_present_tokens = 0;  // not written: storage already held them
  // Not written: the cache's bounded backup queue (max_backup_queue_pages) or the backend's
  // write queue was full.
  int64_t storage_backup_dropped_tokens = 0;
  // Not written: the write backlog (admission.backlog_bytes) was full and these writes were the
  // least likely to be reused.
  int64_t storage_backup_backlog_tokens = 0;
  int64_t storage_backup_refused_tokens = 0;    // not written: admission refused (StorageAdmission)
  int64_t storage_backup_timed_out_tokens = 0;  // not written: the write timed out
  int64_t storage_backup_capacity_tokens = 0;   // not written: the store had no room (kNoSpace)
  int64_t storage_backup_policy_tokens = 0;     // dropped from the device, never copied (policy)
  // Pages a store wrote past one of its pages that did not make it (unreachable: removed again).
  int64_t storage_stranded_removed_pages = 0;
  // Stores held back until a removal of one of their pages (stranded or corrupt) completed.
  int64_t storage_stores_held = 0;
  int64_t storage_backup_bytes = 0;
  double storage_backup_seconds = 0;
  BandwidthHistogram storage_backup_bandwidth;  // GB/s of each host -> storage write that wrote

  // Eviction.
  int64_t device_evicted_tokens = 0;
  int64_t device_evictions = 0;  // runs of pages (a node or its tail)
  int64_t dropped_tokens = 0;    // evicted from the device with no host copy
  int64_t host_evicted_tokens = 0;
  int64_t host_evictions = 0;
  int64_t storage_forgotten_tokens = 0;  // storage-only pages the tree forgot
  // Stored pages the store evicted by itself (its capacity, its free-space floor), marked not
  // stored and published as removed (KV events on only; StorageBackend::TrackEvictions).
  int64_t storage_evicted_by_store_tokens = 0;
  double eviction_seconds = 0;          // time spent choosing and evicting, all tiers
  EvictionHistogram eviction_duration;  // seconds of each eviction that evicted pages

  // Storage faults (misses, never wrong bytes).
  int64_t storage_errors = 0;         // failed or rejected calls and failed pages
  int64_t storage_corrupt_pages = 0;  // corrupt or wrong-namespace pages read
  // Time-outs (kvtier:storage_timeouts_total{op="read"|"write"}). Read: pages a prefetch read
  // that timed out, lookups (QueryStorage's Exists) that did not complete in time or were
  // rejected, and prefetches the timeout policy ended at their deadline. Write: pages a backup
  // to storage wrote that timed out.
  int64_t storage_read_timeouts = 0;
  int64_t storage_write_timeouts = 0;
  int64_t storage_queue_drops = 0;  // calls rejected by the backend's queue, skipped backups

  // Retention.
  int64_t pins = 0;          // pins made (Pin calls that covered tokens)
  int64_t pins_refused = 0;  // Pin calls refused by a tier's budget
  int64_t pins_expired = 0;  // pins ended by their TTL
};

class HierarchicalCache {
 public:
  // Validates config and the device region (layer_first; host memory only with the cpu
  // backend), creates the host pool, the transfer engine (or takes `engine`, e.g. a wrapper used
  // by tests; its backend must agree with where the regions live) and opens the storage tier.
  static Result<std::unique_ptr<HierarchicalCache>> Create(
      const HierarchicalCacheConfig& config, const KvRegion& device_region,
      std::unique_ptr<TransferEngine> engine = nullptr);

  // Cancels prefetches and waits for every copy in flight. Handles still live are dropped.
  ~HierarchicalCache();
  HierarchicalCache(const HierarchicalCache&) = delete;
  HierarchicalCache& operator=(const HierarchicalCache&) = delete;

  // The longest cached page-aligned prefix of `tokens` in namespace `ns`: device, then host, then
  // storage-only pages the tree knows. Always returns a live handle (also for a miss) that must
  // be released. The handle remembers the rest of `tokens` for QueryStorage.
  Result<MatchResult> Match(std::span<const Token> tokens, std::string_view ns = "");

  // Asks the storage backend (Exists, outside the lock) which further whole pages of the
  // handle's tokens are stored, beyond the match, and extends the handle's storage part by them.
  // No storage tier: OK with nothing found. Backend errors and timeouts find nothing (counted).
  Result<StorageQueryResult> QueryStorage(MatchHandle handle);

  // Starts copying the handle's storage part into host memory (host pages allocated now, marked
  // filling; batched Gets on the backend's threads) and returns at once. `policy` decides how
  // FinishPrefetch / LoadBack end it. Does nothing (state kNone) below prefetch_threshold_tokens,
  // without a storage part, or when host memory for it cannot be found within the filling cap
  // (fewer pages are prefetched when only some fit). FailedPrecondition if a prefetch of this
  // handle is running already.
  Result<PrefetchResult> Prefetch(MatchHandle handle);
  Result<PrefetchResult> Prefetch(MatchHandle handle, PrefetchPolicy policy);
  // The prefetch's progress, without waiting or ending it.
  Result<PrefetchResult> PollPrefetch(MatchHandle handle);
  // Ends the handle's prefetch by its policy (waiting outside the lock as the policy says): the
  // arrived prefix becomes host hits of the handle, the rest is cancelled. kNone when none ran.
  Result<PrefetchResult> FinishPrefetch(MatchHandle handle);

  // Copies the host part of the handle's match to freshly allocated device slots (evicting if
  // needed), ending a running prefetch by its policy first. cpu: the bytes are in place on
  // return. GPU: enqueued on `stream`, after the engine's pending writes to the reused slots;
  // consumers wait per layer with WaitLayer. Host parts shorter than load_back_min_tokens are
  // skipped.
  //
  // Streamed storage hits (storage.stream_load_back, the default, with a wait_complete or
  // timeout prefetch running): the host part is copied at once, then the prefetch's pages in
  // pieces as they arrive — a piece once every page before it landed, so pages that arrive out
  // of order wait — while the rest is still read; the call returns when the read has ended by
  // its policy (every page arrived, the first page that will not arrive is known, or the
  // timeout passed) and its last piece is copied (GPU: enqueued). So a storage hit costs about
  // its read time plus one piece's copy, not the read plus the whole copy. The result is the
  // unstreamed one: loaded_tokens and device_slots end where the arrived prefix ends (a missing
  // or corrupt page cuts it; nothing after it is handed out), `prefetch` says how the prefetch
  // ended, and WaitLayer covers every piece. load_back_min_tokens then applies to the host part
  // and the requested storage tokens together. best_effort prefetches, or stream_load_back off:
  // FinishPrefetch, then one copy.
  //
  // OutOfMemory as AllocateDeviceSlots: the handle's match is as before (a streamed load: less
  // the pieces loaded before, which stay cached on the device, and with its prefetch still
  // running); unpinned device pages may have been evicted (reported to the eviction listener). A
  // copy that fails makes this call fail with its error and changes nothing else (but for pieces
  // loaded before it): the match is as before, and the device pages it was given stay reserved
  // until the copy is known to have finished (on a GPU, layers enqueued before the failure may
  // still run), then return to the pool. A handle released while its load streams: the call
  // fails with InvalidArgument; the pieces loaded stay cached.
  Result<LoadBackResult> LoadBack(MatchHandle handle, CudaStream stream = nullptr);
  // GPU: makes `consumer` wait (on the device) until layer `layer` of every slot the handle's
  // match covers is in place: its own LoadBack (every piece of a streamed one) and any other
  // handle's LoadBack still filling slots of this prefix. Call it before reading layer `layer` of
  // matched slots on a GPU. cpu (or nothing in flight): OK at once.
  Status WaitLayer(MatchHandle handle, int64_t layer, CudaStream consumer);
  // Unpins the handle's match and cancels its prefetch. InvalidArgument for an unknown, already
  // released or foreign handle.
  Status Release(MatchHandle handle);

  // Pins the longest cached prefix of `tokens` in namespace `ns` in the tiers `tiers` (each at
  // most once; host needs a host tier, storage a storage tier) for `ttl_seconds` (> 0;
  // kPinForever: until Unpin). See "Retention" above for what a pin keeps. InvalidArgument for bad
  // arguments, or when a tier's budget would be exceeded (the message names the tier, its budget
  // and the tokens asked for); nothing changes then. Nothing cached: OK with pin.id == 0.
  Result<PinResult> Pin(std::span<const Token> tokens, std::span<const CacheTier> tiers,
                        double ttl_seconds = kPinForever, std::string_view ns = "");
  // Ends a pin now. InvalidArgument for an unknown pin, one ended already (Unpin or its TTL) or
  // another cache's.
  Status Unpin(PinHandle pin);

  // Slots for `num_tokens` new tokens, rounded up to whole pages, evicting if needed (tail pages
  // of the policy's first leaves). The engine holds them until it passes them to Insert or
  // FreeDeviceSlots. InvalidArgument for negative counts or more than the device pool holds.
  // OutOfMemory when eviction cannot make room: answered before anything is evicted when live
  // handles and the engine's pages leave too little; when copies in flight keep pages busy the
  // call waits for them (outside the lock, a bounded number of times) first, and unpinned pages
  // may have been evicted by then. With allow_fewer: as many pages as can be had (all unpinned
  // pages evicted if needed) instead of OutOfMemory.
  Result<std::vector<int64_t>> AllocateDeviceSlots(int64_t num_tokens,
                                                   const AllocateOptions& options = {});
  // Returns engine-held pages. REQUIRES: whole pages (slots.size() a multiple of page_size,
  // each page its aligned run of slots), all held by the engine. All or nothing.
  Status FreeDeviceSlots(std::span<const int64_t> slots);

  // Caches `tokens` whose KV the engine has written into `device_slots` (one per token). Page
  // keys (storage tier, shared host tier) are computed once, here, before the lock is taken; with
  // either, tokens must be in [0, 2^32) (InvalidArgument otherwise; Match too with a shared host).
  // REQUIRES: equal lengths, a multiple of page_size; whole pages held by the engine, or the
  // tree's own pages at the same positions. The cache owns all the given slots afterwards.
  // An empty insert creates nothing (no namespace).
  Result<InsertResult> Insert(std::span<const Token> tokens, std::span<const int64_t> device_slots,
                              std::string_view ns = "", const InsertOptions& options = {});

  // Evicts at least `num_tokens` (rounded up to pages; counts beyond the tier mean all of it)
  // from a tier if it can; returns the tokens evicted now (device: freed device tokens). Under
  // write_back, EvictDevice waits (outside the lock) for the copies to host memory it started;
  // EvictHost does not wait for stores: nodes being stored leave at a later eviction.
  Result<int64_t> EvictDevice(int64_t num_tokens);
  Result<int64_t> EvictHost(int64_t num_tokens);

  // Waits until every backup in flight (device -> host and host -> storage) has finished.
  // FailedPrecondition naming the first failure since the last call, if a backup failed.
  Status WaitForBackups();

  CacheStats stats() const;
  // Prometheus text exposition of stats() (SGLang's metric names, prefixed "kvtier:"), written
  // by the metrics writer (src/cache/cache_metrics.cc, with the Python side).
  std::string Metrics() const;
  // Tree invariants plus agreement of the tree, the allocators, the page ownership map, the
  // operations in flight and the live handles; Internal naming the first disagreement.
  Status CheckConsistency() const;
  // The block hashes of the pages each tier holds now: what a subscriber to kv_event_sink's events
  // rebuilds, for checking the events against the cache. Pages without keys (no sink, no storage)
  // are keyed from their tokens here. Costs a walk of the whole tree under the lock.
  Result<TierBlockHashes> CachedBlocks() const;
  // For tests: whether the calling thread holds the cache's mutex now (engine and storage
  // wrappers assert that it does not).
  bool MutexHeldByCurrentThread() const;

  const KvRegion& device_region() const;
  // The host pool's region; without a host tier an empty region (no buffers, 0 slots).
  const KvRegion& host_region() const;
  int64_t page_size() const;
  TransferBackend backend() const;
  // The storage tier's backend, or null.
  StorageBackend* storage() const;

 private:
  struct Impl;
  explicit HierarchicalCache(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvtier
