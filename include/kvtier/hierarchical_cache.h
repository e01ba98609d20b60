// kvtier/hierarchical_cache.h — the engine-facing hierarchical KV cache (device + host tiers).
//
// The engine brings its device KV pool as a layer_first `KvRegion` (in CPU-only tests that region
// simply lives in host memory and the cpu backend moves it; the cache does not care). The cache
// owns everything else: the allocation of the device pool's pages (engines get slots from
// AllocateDeviceSlots and hand them back through Insert or FreeDeviceSlots), a HostKvPool for the
// host tier, the radix tree that indexes both tiers, and the copies between them.
//
// A request's life, as an engine drives it:
//   m = Match(tokens, ns)          cached prefix: device slots, plus tokens cached only in host
//                                  memory; the matched nodes stay pinned until Release(m.handle)
//   LoadBack(m.handle, stream)     host part -> freshly allocated device slots; per-layer
//                                  readiness through WaitLayer (GPU); all or nothing
//   AllocateDeviceSlots(n)         slots for the tokens the engine computes (evicts if needed)
//   ... prefill writes the KV of the new tokens into those slots ...
//   Insert(tokens, slots, ns)      the cache takes ownership of the slots (duplicates of pages
//                                  that are already cached are freed); the write policy decides
//                                  what is backed up to host memory
//   Release(m.handle)
//
// Ownership of device pages: every page of the device pool is free, held by the engine (handed
// out by AllocateDeviceSlots, not yet inserted or freed) or held by the tree. Insert and
// FreeDeviceSlots accept only pages the engine holds (or, for Insert, the tree's own pages at the
// same positions, as returned by Match). Anything else is InvalidArgument and changes nothing.
//
// Write policies: write_through backs up every insert; write_through_selective backs up a node
// once its hit count (inserts and matches touching it) reaches `write_through_threshold`;
// write_back backs up only when a node is evicted from the device. Backups always cover the whole
// unbacked path from the namespace root, so host copies form a contiguous prefix.
//
// Eviction: device eviction takes unreferenced device leaves in policy order; a node with a host
// copy stays cached in host memory; under write_back an unbacked node is first copied to host
// memory (synchronously), otherwise it is dropped. Host eviction frees unreferenced nodes cached
// only in host memory that have no children.
//
// Copies in flight (the races that corrupt KV in other systems, each with a test):
//   - a device slot is never freed while a backup reads it: nodes with an in-flight copy are not
//     evictable; eviction that needs them waits for the copies to finish;
//   - a host page is never reused while a copy writes into or reads from it: host pages belong to
//     their node from the moment the copy is submitted, and a busy node is not evictable;
//   - a matched host node is never evicted between Match and the end of its LoadBack: the handle
//     pins it;
//   - (GPU) the device slots a LoadBack writes are not evicted before the copy has finished.
// Backups run on worker threads (cpu backend; backup_threads = 0 runs them in the calling thread)
// or on a dedicated CUDA stream (kernel/dma backends), completion observed through futures and
// events, never by sleeping.
//
// Thread safety: every method may be called from any thread; one internal mutex serialises the
// bookkeeping (copies on the cpu backend run inside it for LoadBack and write_back evictions,
// outside it for backups). The eviction listener runs under that mutex and must not call back
// into the cache.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "kvtier/eviction_policy.h"
#include "kvtier/layout.h"
#include "kvtier/radix_tree.h"
#include "kvtier/status.h"
#include "kvtier/transfer.h"

namespace kvtier {

enum class WritePolicy : uint8_t { kWriteThrough = 0, kWriteThroughSelective = 1, kWriteBack = 2 };
// "write_through", "write_through_selective", "write_back".
const char* WritePolicyName(WritePolicy policy);
Result<WritePolicy> ParseWritePolicy(std::string_view name);

enum class CacheTier : uint8_t { kDevice = 0, kHost = 1 };

// Reported for every node that leaves a tier.
struct EvictionEvent {
  CacheTier tier;
  std::string_view name_space;
  std::span<const Token> prefix;  // tokens from the namespace root through the evicted node
  int64_t num_tokens;             // the last num_tokens of `prefix` left `tier`
  bool kept_in_host;              // device evictions: the tokens stay cached in host memory
};

struct HierarchicalCacheConfig {
  // Page size of both tiers; 0 = the device region's page_size, else it must equal it.
  // A power of two in [1, 256].
  int64_t page_size = 0;
  // Host tier capacity: host_capacity_bytes when > 0, else host_ratio x the device pool's bytes.
  int64_t host_capacity_bytes = 0;
  double host_ratio = 2.0;
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
  // cpu backend: threads running backups; 0 = in the calling thread (deterministic).
  int backup_threads = 1;
  // LoadBack leaves host hits shorter than this many tokens where they are (the engine
  // recomputes them instead).
  int64_t load_back_min_tokens = 0;

  // Called (under the cache's lock) for every eviction; for tests and metrics.
  std::function<void(const EvictionEvent&)> eviction_listener;

  // InvalidArgument naming the field and its value.
  Status Validate() const;
};

// Pins what a Match matched until Release. Plain value; the cache validates it on every use.
struct MatchHandle {
  uint64_t id = 0;
};

struct MatchResult {
  MatchHandle handle;
  int64_t device_tokens = 0;          // leading tokens whose KV is on the device ...
  std::vector<int64_t> device_slots;  // ... at these slots of the device region
  int64_t host_tokens = 0;            // the next tokens, cached in host memory only ...
  std::vector<int64_t> host_slots;    // ... at these slots of host_region()
};

struct LoadBackResult {
  int64_t loaded_tokens = 0;   // copied from host memory by this call
  int64_t skipped_tokens = 0;  // host hits left alone (below load_back_min_tokens)
  std::vector<int64_t> device_slots;  // the whole matched prefix now on the device
};

struct InsertOptions {
  // Feeds the priority eviction policy (a node keeps the highest priority it was given).
  int32_t priority = 0;
  // The result carries a live handle pinning the inserted tokens (for a request that keeps
  // decoding on them, as SGLang's cache_unfinished_req does); Release it like a Match handle.
  bool pin = false;
  // GPU: the stream on which the engine wrote the KV of these slots (nullptr: the legacy default
  // stream). Backups of the slots are ordered after the work queued on it so far.
  CudaStream stream = nullptr;
};

struct InsertResult {
  MatchHandle handle;            // with options.pin: a live handle pinning the inserted tokens
  int64_t cached_tokens = 0;     // already on the device (their slots stay the cache's)
  int64_t revived_tokens = 0;    // were cached in host memory only; now also on the device
  int64_t new_tokens = 0;        // not cached before
  int64_t duplicate_tokens = 0;  // engine slots freed because the tree already had that page
};

// Counters for operators (tokens unless named otherwise).
struct CacheStats {
  int64_t page_size = 0;
  int64_t device_total_tokens = 0;
  int64_t device_used_tokens = 0;    // allocated pages: cached + held by the engine
  int64_t device_cached_tokens = 0;  // in the tree
  int64_t device_engine_tokens = 0;  // handed to the engine, not yet inserted or freed
  int64_t host_total_tokens = 0;
  int64_t host_used_tokens = 0;
  int64_t host_total_bytes = 0;
  int64_t nodes = 0;
  int64_t live_handles = 0;

  int64_t match_calls = 0;
  int64_t match_query_tokens = 0;
  int64_t device_hit_tokens = 0;
  int64_t host_hit_tokens = 0;
  int64_t load_back_calls = 0;
  int64_t load_back_tokens = 0;
  int64_t load_back_skipped_tokens = 0;
  double load_back_seconds = 0;  // wall time of LoadBack calls (submission only on a GPU)
  int64_t inserted_tokens = 0;   // new + revived
  int64_t duplicate_tokens = 0;
  int64_t backup_tokens = 0;          // completed device -> host copies
  int64_t backup_inflight_tokens = 0;
  int64_t backup_skipped_tokens = 0;  // no host space
  int64_t write_back_tokens = 0;      // copied to host on device eviction (write_back)
  int64_t device_evicted_tokens = 0;
  int64_t device_evictions = 0;  // nodes
  int64_t dropped_tokens = 0;    // evicted from the device with no host copy
  int64_t host_evicted_tokens = 0;
  int64_t host_evictions = 0;  // nodes
};

class HierarchicalCache {
 public:
  // Validates config and the device region (layer_first; host memory only with the cpu
  // backend), creates the host pool and the transfer engine (or takes `engine`, e.g. a wrapper
  // used by tests; its backend must agree with where the regions live).
  static Result<std::unique_ptr<HierarchicalCache>> Create(
      const HierarchicalCacheConfig& config, const KvRegion& device_region,
      std::unique_ptr<TransferEngine> engine = nullptr);

  // Waits for every copy in flight. Handles still live are dropped.
  ~HierarchicalCache();
  HierarchicalCache(const HierarchicalCache&) = delete;
  HierarchicalCache& operator=(const HierarchicalCache&) = delete;

  // The longest cached page-aligned prefix of `tokens` in namespace `ns`. Always returns a live
  // handle (also for a miss) that must be released.
  Result<MatchResult> Match(std::span<const Token> tokens, std::string_view ns = "");

  // Copies the host part of the handle's match to freshly allocated device slots (evicting if
  // needed). All or nothing: OutOfMemory (nothing changes) when the device cannot make room.
  // Host parts shorter than load_back_min_tokens are skipped. cpu: the bytes are in place on
  // return. GPU: enqueued on `stream`; consumers wait per layer with WaitLayer.
  Result<LoadBackResult> LoadBack(MatchHandle handle, CudaStream stream = nullptr);
  // GPU: makes `consumer` wait (on the device) until layer `layer` of every slot the handle's
  // match covers is in place: its own LoadBack and any other handle's LoadBack still filling
  // slots of this prefix. Call it before reading layer `layer` of matched slots on a GPU.
  // cpu (or nothing in flight): OK at once.
  Status WaitLayer(MatchHandle handle, int64_t layer, CudaStream consumer);
  // Unpins the handle's match. InvalidArgument for an unknown or already released handle.
  Status Release(MatchHandle handle);

  // Slots for `num_tokens` new tokens, rounded up to whole pages, evicting if needed. The engine
  // holds them until it passes them to Insert or FreeDeviceSlots. InvalidArgument for negative
  // counts or more than the device pool holds; OutOfMemory when eviction cannot make room.
  Result<std::vector<int64_t>> AllocateDeviceSlots(int64_t num_tokens);
  // Returns engine-held pages. REQUIRES: whole pages (slots.size() a multiple of page_size,
  // each page its aligned run of slots), all held by the engine. All or nothing.
  Status FreeDeviceSlots(std::span<const int64_t> slots);

  // Caches `tokens` whose KV the engine has written into `device_slots` (one per token).
  // REQUIRES: equal lengths, a multiple of page_size; whole pages held by the engine, or the
  // tree's own pages at the same positions. The cache owns all the given slots afterwards.
  Result<InsertResult> Insert(std::span<const Token> tokens, std::span<const int64_t> device_slots,
                              std::string_view ns = "", const InsertOptions& options = {});

  // Evicts at least `num_tokens` (rounded up to pages) from a tier if it can; returns the
  // tokens evicted (device: freed device tokens).
  Result<int64_t> EvictDevice(int64_t num_tokens);
  Result<int64_t> EvictHost(int64_t num_tokens);

  // Waits until every backup in flight has finished.
  Status WaitForBackups();

  CacheStats stats() const;
  // Tree invariants plus agreement of the tree, the allocators, the page ownership map and the
  // live handles; Internal naming the first disagreement.
  Status CheckConsistency() const;

  const KvRegion& device_region() const;
  const KvRegion& host_region() const;
  int64_t page_size() const;
  TransferBackend backend() const;

 private:
  struct State;
  explicit HierarchicalCache(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

}  // namespace kvtier
