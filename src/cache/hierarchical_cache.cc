// The hierarchical KV cache (see kvtier/hierarchical_cache.h): the orchestrator over the parts
// and the bookkeeping they share (cache/cache_core.h: the state, its invariants and the locking
// discipline).
#include "kvtier/hierarchical_cache.h"

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include "cache/hierarchical_cache_impl.h"
#include "kvtier/device.h"
#include "kvtier/host_memory.h"
#include "kvtier/slot_allocator.h"
#include "util/log.h"

namespace kvtier {
namespace {

// The token count a call was given (AllocateDeviceSlots, EvictDevice, EvictHost).
Status CheckTokenCount(int64_t num_tokens) {
  if (num_tokens >= 0) return Status::OK();
  return Status::InvalidArgument(fmt::format("num_tokens = {} must not be negative", num_tokens));
}

}  // namespace

// ---------------------------------------------------------------------------------------------

HierarchicalCache::HierarchicalCache(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

HierarchicalCache::~HierarchicalCache() { impl_->Close(); }

Result<std::unique_ptr<HierarchicalCache>> HierarchicalCache::Create(
    const HierarchicalCacheConfig& config, const KvRegion& device_region,
    std::unique_ptr<TransferEngine> engine) {
  KVTIER_RETURN_IF_ERROR(config.Validate());
  KVTIER_RETURN_IF_ERROR(device_region.Validate("device_region"));
  const KvGeometry& g = device_region.geometry;
  if (g.layout != KvLayout::kLayerFirst) {
    return Status::InvalidArgument(fmt::format(
        "device_region.layout = {}: the device tier must be layer_first", LayoutName(g.layout)));
  }
  if (config.page_size != 0 && config.page_size != g.page_size) {
    return Status::InvalidArgument(fmt::format("page_size = {} differs from device_region's {}",
                                               config.page_size, g.page_size));
  }
  if (!engine) {
    KVTIER_ASSIGN_OR_RETURN(engine, MakeTransferEngine(config.transfer_backend, config.transfer));
  }
  const bool gpu = engine->backend() != TransferBackend::kCpu;
  if (!gpu && device_region.memory != MemoryKind::kHost) {
    return Status::InvalidArgument(
        "device_region is in device memory but the transfer backend is cpu; use kernel, dma or "
        "auto");
  }
  if (gpu && device_region.memory != MemoryKind::kDevice) {
    return Status::InvalidArgument(
        fmt::format("device_region is in host memory but the transfer backend is {}; use cpu",
                    TransferBackendName(engine->backend())));
  }
  if (device_region.memory == MemoryKind::kHost) {
    // A load-back writes into the device tier: read-only memory (a read-only mmap) would crash
    // the first one (issue 36). Host memory only: device memory is not in the process's maps.
    for (int b = 0; b < device_region.num_buffers(); ++b) {
      const char* name = b == 0 ? (device_region.mla ? "device_region.k (MLA)" : "device_region.k")
                                : "device_region.v";
      const int64_t layers = device_region.has_layer_table() ? g.num_layers : 1;
      const int64_t bytes = g.num_slots * g.slot_bytes * (layers == 1 ? g.num_layers : 1);
      for (int64_t layer = 0; layer < layers; ++layer) {
        KVTIER_RETURN_IF_ERROR(CheckHostWritable(
            device_region.LayerBase(b, layer), bytes,
            layers == 1 ? std::string(name) : fmt::format("{} layer {}", name, layer)));
      }
    }
  }

  const int64_t device_tokens = g.num_slots;
  if (config.pin_device_budget_tokens >= device_tokens && config.pin_device_budget_tokens > 0) {
    return Status::InvalidArgument(
        fmt::format("pin_device_budget_tokens = {} must be below the device pool's {} tokens "
                    "(pins must leave room to allocate)",
                    config.pin_device_budget_tokens, device_tokens));
  }
  auto impl = std::make_unique<Impl>(config, g.page_size);
  KVTIER_RETURN_IF_ERROR(impl->Open(device_region, std::move(engine)));
  return std::unique_ptr<HierarchicalCache>(new HierarchicalCache(std::move(impl)));
}

Result<MatchResult> HierarchicalCache::Match(std::span<const Token> tokens, std::string_view ns) {
  Impl& s = *impl_;
  // Shared host tier: the keys of the whole pages after the tree's match (a peek under the lock
  // says where it ends and gives the key to chain from), hashed outside the lock.
  std::vector<PageKey> tail;
  int64_t tail_from = -1;  // page of tail[0]; -1: no lookup in the segment
  const int64_t whole_pages = static_cast<int64_t>(tokens.size()) / s.P;
  if (s.shared_host_tier && whole_pages > 0) {
    std::optional<PageKey> previous;
    {
      CacheLock lk(s);
      s.adopter.MatchedChain(ns, tokens, &tail_from, &previous);
    }
    if (tail_from < whole_pages) {
      Result<std::vector<PageKey>> k =
          ComputePageKeys(tokens.subspan(static_cast<size_t>(tail_from * s.P),
                                         static_cast<size_t>((whole_pages - tail_from) * s.P)),
                          s.P, previous);
      if (!k.ok()) return k.status().WithContext("Match: page keys");
      tail = std::move(*k);
    }
  }
  CacheWork work(&s.executor);
  MatchResult out;
  {
    CacheLock lk(s);
    KVTIER_RETURN_IF_ERROR(s.CheckHealth());
    s.Reap(&work);
    RadixTree::MatchResult r = s.tree.Match(ns, tokens);
    const int64_t adopted =
        tail_from < 0 ? 0 : s.adopter.AdoptShared(&r, ns, tokens, tail, tail_from);
    out.device_tokens = r.device_tokens;
    out.host_tokens = r.host_tokens;
    out.storage_tokens = r.storage_tokens;
    const std::vector<RadixNode*> path = CacheCore::Path(r.last);
    out.device_slots.reserve(static_cast<size_t>(r.device_tokens));
    out.host_slots.reserve(static_cast<size_t>(r.host_tokens));
    for (RadixNode* n : path) {
      if (n->on_device()) {
        s.AppendSlots(n->device_pages(), &out.device_slots);
      } else if (n->on_host()) {
        s.AppendSlots(n->host_pages(), &out.host_slots);
      }
      s.tree.Touch(n, 1);
    }
    HandleState h;
    if (!r.last->is_root()) {
      h.last = r.last;
      s.tree.IncRef(r.last);
    }
    h.ns = std::string(ns);
    if (s.storage) {
      const size_t from = static_cast<size_t>(r.matched_tokens);
      const size_t whole =
          (tokens.size() - from) / static_cast<size_t>(s.P) * static_cast<size_t>(s.P);
      h.rest.assign(tokens.begin() + static_cast<ptrdiff_t>(from),
                    tokens.begin() + static_cast<ptrdiff_t>(from + whole));
    }
    h.prefetch_policy = s.config.storage.prefetch_policy;
    out.handle = s.NewHandle(std::move(h));
    // Adopted pages count against this cache's host budget: unpin others (not these: pinned).
    if (s.host && s.host->free_pages() < 0) s.evictor.EvictHost(-s.host->free_pages(), &work);
    s.planner.MaybeBackup(path, &work);
    if (s.storage) {
      for (const RadixNode* n : path) s.planner.RecordAccess(n->keys());
      s.planner.MaybeStore(path, &work);
    }
    s.counters.shared_host_hit_tokens += adopted;
    ++s.counters.match_calls;
    s.counters.match_query_tokens += static_cast<int64_t>(tokens.size());
    s.counters.device_hit_tokens += r.device_tokens;
    s.counters.host_hit_tokens += r.host_tokens;
    s.counters.storage_hit_tokens += r.storage_tokens;
  }
  s.executor.Run(work);
  return out;
}

Result<StorageQueryResult> HierarchicalCache::QueryStorage(MatchHandle handle) {
  Impl& s = *impl_;
  CacheWork work(&s.executor);
  StorageQueryResult out;
  std::vector<Token> rest;
  std::optional<PageKey> previous;
  std::string ns;
  RadixNode* last = nullptr;
  int64_t removals_reaped = 0;
  {
    CacheLock lk(s);
    removals_reaped = s.planner.removals_reaped();
    KVTIER_ASSIGN_OR_RETURN(HandleState * h, s.FindHandle(handle));
    for (RadixNode* n : CacheCore::Path(h->last)) {
      if (!n->on_device() && !n->on_host() && n->stored()) out.storage_tokens += n->num_tokens();
    }
    out.cut = s.CutFor(out.storage_tokens);  // the early answers below: the tree's part
    out.worth_reading_tokens = out.storage_tokens - out.cut.tokens;
    if (!s.storage || h->rest.empty()) return out;
    ++s.counters.query_storage_calls;
    rest = h->rest;
    ns = h->ns;
    last = h->last;
    if (last != nullptr) {
      if (last->keys().empty()) return out;
      previous = last->keys().back();
    } else {
      previous = ChainSeed(ns);
    }
  }
  Result<std::vector<PageKey>> keys = ComputePageKeys(rest, s.P, previous);
  if (!keys.ok()) return keys.status();
  if (static_cast<int64_t>(keys->size()) > s.storage->options().max_batch_pages) {
    keys->resize(static_cast<size_t>(s.storage->options().max_batch_pages));
  }
  std::future<ExistsResult> fut = s.storage->Exists(*keys);
  ExistsResult found;
  const auto limit = s.storage->options().timeout + std::chrono::seconds(1);
  if (fut.wait_for(limit) == std::future_status::ready) {
    found = fut.get();
  } else {
    found.status = Status::Unavailable("Exists did not complete in time");
  }
  CacheLock lk(s);
  if (!found.status.ok()) {
    ++s.counters.storage_errors;
    if (found.status.code() == StatusCode::kUnavailable) ++s.counters.storage_read_timeouts;
  }
  KVTIER_ASSIGN_OR_RETURN(HandleState * h, s.FindHandle(handle));
  int64_t pages = std::clamp<int64_t>(found.leading, 0, static_cast<int64_t>(keys->size()));
  // A page with a removal in flight may have been seen before it went, and so may any page if a
  // removal completed meanwhile: the answer counts up to the first such page (none then).
  if (s.planner.removals_reaped() != removals_reaped) pages = 0;
  for (int64_t i = 0; i < pages; ++i) {
    if (s.planner.removing().count((*keys)[static_cast<size_t>(i)]) != 0) {
      pages = i;
      break;
    }
  }
  if (pages > 0 && h->last == last && h->rest == rest) {
    const size_t n = static_cast<size_t>(pages * s.P);
    RadixNode* deepest =
        s.tree.AddStored(last, ns, std::span<const Token>(rest).first(n),
                         std::span<const PageKey>(*keys).first(static_cast<size_t>(pages)));
    if (deepest != nullptr && !deepest->is_root() && deepest != last) {
      s.tree.IncRef(deepest);
      if (last != nullptr) s.tree.DecRef(last);
      h->last = deepest;
      for (RadixNode* x = deepest; x != last && !x->is_root(); x = x->parent()) {
        s.tree.Touch(x, 1);
      }
    }
    h->rest.erase(h->rest.begin(), h->rest.begin() + static_cast<ptrdiff_t>(n));
    out.queried_tokens = pages * s.P;
    out.storage_tokens += out.queried_tokens;
    s.counters.query_storage_tokens += out.queried_tokens;
    s.counters.storage_hit_tokens += out.queried_tokens;
    s.evictor.TrimStorage(&work);
  }
  out.cut = s.CutFor(out.storage_tokens);
  out.worth_reading_tokens = out.storage_tokens - out.cut.tokens;
  lk.unlock();
  s.executor.Run(work);
  return out;
}

Result<PrefetchResult> HierarchicalCache::Prefetch(MatchHandle handle) {
  return Prefetch(handle, impl_->config.storage.prefetch_policy);
}

Result<PrefetchResult> HierarchicalCache::Prefetch(MatchHandle handle, PrefetchPolicy policy) {
  Impl& s = *impl_;
  if (static_cast<int>(policy) > 2) {
    return Status::InvalidArgument(
        fmt::format("prefetch policy = {} is not a known policy", static_cast<int>(policy)));
  }
  CacheWork work(&s.executor);
  CacheLock lk(s);
  KVTIER_RETURN_IF_ERROR(s.CheckHealth());
  s.Reap(&work);
  KVTIER_ASSIGN_OR_RETURN(HandleState * h, s.FindHandle(handle));
  if (h->prefetch) {
    return Status::FailedPrecondition(
        fmt::format("handle {}: a prefetch is running already", handle.id));
  }
  return s.prefetcher.Start(*h, policy, &work);
}

Result<PrefetchResult> HierarchicalCache::PollPrefetch(MatchHandle handle) {
  Impl& s = *impl_;
  CacheLock lk(s);
  KVTIER_ASSIGN_OR_RETURN(HandleState * h, s.FindHandle(handle));
  return s.prefetcher.Progress(*h);
}

Result<PrefetchResult> HierarchicalCache::FinishPrefetch(MatchHandle handle) {
  Impl& s = *impl_;
  CacheWork work(&s.executor);
  PrefetchResult out;
  {
    CacheLock lk(s);
    KVTIER_ASSIGN_OR_RETURN(HandleState * h, s.FindHandle(handle));
    if (!h->prefetch) return s.prefetcher.Progress(*h);
    std::shared_ptr<CopyOp> op = h->prefetch;
    if (h->prefetch_policy != PrefetchPolicy::kBestEffort) {
      lk.unlock();
      if (h->prefetch_policy == PrefetchPolicy::kWaitComplete) {
        s.tracker.Wait(*op);
      } else {
        s.tracker.WaitUntil(*op, op->deadline);
      }
      lk.lock();
      KVTIER_ASSIGN_OR_RETURN(h, s.FindHandle(handle));
      if (h->prefetch != op) return s.prefetcher.Progress(*h);  // another call ended it meanwhile
    }
    out = s.prefetcher.Conclude(*h, /*cancelled=*/false, &work);
  }
  s.executor.Run(work);
  return out;
}

Result<LoadBackResult> HierarchicalCache::LoadBack(MatchHandle handle, CudaStream stream) {
  Impl& s = *impl_;
  Impl::LoadRun run;
  CacheWork work(&s.executor);
  CacheLock lk(s);
  KVTIER_ASSIGN_OR_RETURN(HandleState * h, s.FindHandle(handle));
  h->loads.clear();
  int64_t min_tokens = s.config.load_back_min_tokens;
  if (s.StreamsPrefetch(*h)) {
    KVTIER_RETURN_IF_ERROR(s.CheckHealth());
    const std::shared_ptr<CopyOp> prefetch = h->prefetch;
    KVTIER_RETURN_IF_ERROR(s.StreamLoad(lk, handle, prefetch, stream, &work, &run));
    min_tokens = 0;  // the whole expected load passed the threshold: its last piece is loaded too
  } else if (h->prefetch) {
    lk.unlock();
    KVTIER_ASSIGN_OR_RETURN(run.out.prefetch, FinishPrefetch(handle));
    lk.lock();
  }
  KVTIER_RETURN_IF_ERROR(s.LoadHostPart(lk, handle, stream, min_tokens, &work, &run));
  KVTIER_ASSIGN_OR_RETURN(h, s.FindHandle(handle));
  run.out.device_slots = s.DeviceSlotsOf(CacheCore::Path(h->last));
  if (run.copies > 0) {
    ++s.counters.load_back_calls;
    s.counters.load_back_tokens += run.out.loaded_tokens;
  }
  return std::move(run.out);
}

Status HierarchicalCache::WaitLayer(MatchHandle handle, int64_t layer, CudaStream consumer) {
  Impl& s = *impl_;
  std::vector<std::shared_ptr<CopyOp>> loads;
  {
    CacheLock lk(s);
    KVTIER_ASSIGN_OR_RETURN(HandleState * h, s.FindHandle(handle));
    if (layer < 0 || layer >= s.device.geometry.num_layers) {
      return Status::InvalidArgument(
          fmt::format("layer = {} is out of range [0, {})", layer, s.device.geometry.num_layers));
    }
    // The handle's own load-back (every copy of a streamed one), and any other load-back still
    // filling slots of this match.
    for (const auto& op : h->loads) {
      if (op->layer_events) loads.push_back(op);
    }
    const std::vector<RadixNode*> path = CacheCore::Path(h->last);
    const std::unordered_set<const RadixNode*> on_path(path.begin(), path.end());
    for (const auto& op : s.tracker.ops()) {
      if (op->kind != CopyOp::Kind::kLoad || !op->layer_events) continue;
      if (std::find(loads.begin(), loads.end(), op) != loads.end()) continue;
      for (const RadixNode* n : op->nodes) {
        if (on_path.count(n)) {
          loads.push_back(op);
          break;
        }
      }
    }
  }
  // Enqueuing a wait on the consumer's stream does not block; it runs outside the lock all the
  // same (the ops are kept alive by `loads`).
  for (const auto& op : loads) {
    KVTIER_RETURN_IF_ERROR(op->layer_events->Wait(static_cast<int>(layer), consumer));
  }
  return Status::OK();
}

Status HierarchicalCache::Release(MatchHandle handle) {
  Impl& s = *impl_;
  CacheWork work(&s.executor);
  {
    CacheLock lk(s);
    KVTIER_ASSIGN_OR_RETURN(HandleState * h, s.FindHandle(handle));
    if (h->prefetch) s.prefetcher.Conclude(*h, /*cancelled=*/true, &work);
    if (h->last != nullptr) s.tree.DecRef(h->last);
    s.handles.erase(handle.id);
    s.Reap(&work);
    s.evictor.TrimStorage(&work);
  }
  s.executor.Run(work);
  return Status::OK();
}

Result<std::vector<int64_t>> HierarchicalCache::AllocateDeviceSlots(
    int64_t num_tokens, const AllocateOptions& options) {
  Impl& s = *impl_;
  CacheWork work(&s.executor);
  std::vector<int64_t> slots;
  {
    CacheLock lk(s);
    KVTIER_RETURN_IF_ERROR(s.CheckHealth());
    KVTIER_RETURN_IF_ERROR(CheckTokenCount(num_tokens));
    if (num_tokens > s.ledger->num_slots()) {
      if (!options.allow_fewer) {
        return Status::InvalidArgument(
            fmt::format("num_tokens = {} exceeds the device pool of {} slots", num_tokens,
                        s.ledger->num_slots()));
      }
      num_tokens = s.ledger->num_slots();
    }
    s.Reap(&work);
    const int64_t pages = PagesFor(num_tokens, s.P);
    Result<std::vector<int64_t>> alloc =
        s.AllocateDevice(lk, pages, options.allow_fewer, DevicePageLedger::kEngine,
                         fmt::format("AllocateDeviceSlots({})", num_tokens), &work);
    if (!alloc.ok()) {
      lk.unlock();
      s.executor.Run(work);
      return alloc.status();
    }
    slots = PageSlots(*alloc, s.P);
  }
  s.executor.Run(work);
  return slots;
}

Status HierarchicalCache::FreeDeviceSlots(std::span<const int64_t> slots) {
  Impl& s = *impl_;
  CacheLock lk(s);
  std::vector<int64_t> pages;
  KVTIER_RETURN_IF_ERROR(s.ledger->CheckPages(slots, "slots", &pages));
  KVTIER_RETURN_IF_ERROR(s.ledger->CheckEngineHeld(pages, "FreeDeviceSlots", nullptr));
  return s.ledger->Free(pages);
}

Result<InsertResult> HierarchicalCache::Insert(std::span<const Token> tokens,
                                               std::span<const int64_t> device_slots,
                                               std::string_view ns, const InsertOptions& options) {
  Impl& s = *impl_;
  if (tokens.size() != device_slots.size()) {
    return Status::InvalidArgument(fmt::format("tokens has {} entries but device_slots has {}",
                                               tokens.size(), device_slots.size()));
  }
  if (tokens.size() % static_cast<size_t>(s.P) != 0) {
    return Status::InvalidArgument(fmt::format(
        "tokens has {} entries, not a multiple of page_size = {} (insert whole pages; keep the "
        "partial last page)",
        tokens.size(), s.P));
  }
  // Outside the lock: the page keys, and (GPU) the point on the engine's stream after which the
  // KV of these slots is written.
  std::vector<PageKey> keys;
  if ((s.storage || s.shared_host_tier || s.events) && !tokens.empty()) {
    Result<std::vector<PageKey>> k = ComputePromptPageKeys(tokens, s.P, ns);
    if (!k.ok()) return k.status().WithContext("Insert: page keys");
    keys = std::move(*k);
  }
  std::shared_ptr<CudaEventHandle> fence;
  if (s.gpu && !tokens.empty()) {
    Result<CudaEventHandle> ev = CudaEventHandle::Create(s.device.device);
    if (!ev.ok()) return ev.status().WithContext("Insert");
    KVTIER_RETURN_IF_ERROR(ev->Record(options.stream).WithContext("Insert"));
    fence = std::make_shared<CudaEventHandle>(std::move(*ev));
  }

  CacheWork work(&s.executor);
  InsertResult out;
  {
    CacheLock lk(s);
    KVTIER_RETURN_IF_ERROR(s.CheckHealth());
    s.Reap(&work);
    std::vector<int64_t> pages;
    KVTIER_RETURN_IF_ERROR(s.CheckInsertPages(tokens, device_slots, ns, &pages));
    std::vector<RadixTree::InsertSegment> segments;
    s.tree.Insert(ns, tokens, pages, keys, &segments);
    if (s.storage && !keys.empty()) {  // the pages this prompt added: their first access
      for (const RadixTree::InsertSegment& seg : segments) {
        if (seg.kind != RadixTree::SegmentKind::kNew) continue;
        s.planner.RecordAccess(std::span<const PageKey>(keys).subspan(
            static_cast<size_t>(seg.begin / s.P),
            static_cast<size_t>((seg.end - seg.begin) / s.P)));
      }
    }
    std::vector<int64_t> duplicates, taken;
    s.ApplySegments(segments, device_slots, options.priority, &out, &duplicates, &taken);
    s.ledger->Transfer(taken, DevicePageLedger::kTree);
    s.Fail(s.ledger->Free(duplicates), "freeing duplicates");
    out.duplicate_tokens = static_cast<int64_t>(duplicates.size()) * s.P;
    s.counters.inserted_tokens += out.new_tokens + out.revived_tokens;
    s.counters.duplicate_tokens += out.duplicate_tokens;
    if (fence) s.ledger->AddWriteFence(std::move(fence));
    if (options.pin) {
      HandleState h;
      h.ns = std::string(ns);
      if (!segments.empty()) {
        h.last = segments.back().node;
        s.tree.IncRef(h.last);
      }
      h.prefetch_policy = s.config.storage.prefetch_policy;
      out.handle = s.NewHandle(std::move(h));
    }
    if (!segments.empty()) s.planner.MaybeBackup(CacheCore::Path(segments.back().node), &work);
  }
  s.executor.Run(work);
  return out;
}

Result<int64_t> HierarchicalCache::EvictDevice(int64_t num_tokens) {
  Impl& s = *impl_;
  KVTIER_RETURN_IF_ERROR(CheckTokenCount(num_tokens));
  CacheWork work(&s.executor);
  int64_t freed = 0;
  Status health;
  {
    CacheLock lk(s);
    KVTIER_RETURN_IF_ERROR(s.CheckHealth());
    const int64_t need = std::min(PagesFor(num_tokens, s.P), s.ledger->num_pages());
    // write_back: victims are copied to host memory first; wait for those copies (outside the
    // lock) and evict again, a bounded number of times.
    for (int round = 0; round < 4 && health.ok(); ++round) {
      s.Reap(&work);
      freed += s.evictor.EvictDevice(need - freed, &work);
      health = s.CheckHealth();
      std::vector<std::shared_ptr<CopyOp>> waits;
      for (const auto& op : s.tracker.ops()) {
        if (op->kind == CopyOp::Kind::kBackup && op->write_back) waits.push_back(op);
      }
      if (freed >= need || waits.empty()) break;
      lk.unlock();
      s.executor.Run(work);
      for (auto& op : waits) s.tracker.Wait(*op);
      lk.lock();
    }
  }
  s.executor.Run(work);
  KVTIER_RETURN_IF_ERROR(health);
  return freed * s.P;
}

Result<int64_t> HierarchicalCache::EvictHost(int64_t num_tokens) {
  Impl& s = *impl_;
  KVTIER_RETURN_IF_ERROR(CheckTokenCount(num_tokens));
  CacheWork work(&s.executor);
  int64_t freed = 0;
  {
    CacheLock lk(s);
    KVTIER_RETURN_IF_ERROR(s.CheckHealth());
    s.Reap(&work);
    const int64_t host_pages = s.host ? s.host->num_pages() : 0;
    freed = s.evictor.EvictHost(std::min(PagesFor(num_tokens, s.P), host_pages), &work) * s.P;
    s.evictor.TrimStorage(&work);
  }
  s.executor.Run(work);
  return freed;
}

Status HierarchicalCache::WaitForBackups() {
  Impl& s = *impl_;
  CacheWork work(&s.executor);
  Status failure;
  {
    CacheLock lk(s);
    s.Drain(lk, &work, /*backups_only=*/true);
    failure = std::exchange(s.backup_failure, Status::OK());
    KVTIER_RETURN_IF_ERROR(s.CheckHealth());
  }
  if (!failure.ok()) {
    return Status::FailedPrecondition(
        fmt::format("a backup failed (its host pages were taken back): {}", failure.ToString()));
  }
  return Status::OK();
}

CacheStats HierarchicalCache::stats() const {
  Impl& s = *impl_;
  CacheWork work(&s.executor);
  CacheLock lk(s);
  s.Reap(&work);
  CacheStats c = s.Stats();
  c.host_filling_tokens = s.prefetcher.filling_pages() * s.P;
  c.prefetch_inflight_tokens = c.host_filling_tokens;
  c.live_pins = s.pins.size();
  c.storage_backlog_tokens = s.planner.backlog().tokens();
  c.storage_backlog_bytes = s.planner.backlog().bytes();
  return c;
}

Result<TierBlockHashes> HierarchicalCache::CachedBlocks() const {
  CacheLock lk(*impl_);
  return CachedBlocksOf(impl_->tree);
}

Status HierarchicalCache::CheckConsistency() const {
  CacheLock lk(*impl_);
  KVTIER_RETURN_IF_ERROR(CheckCacheConsistency(*impl_));
  return impl_->pins.CheckConsistency();
}

bool HierarchicalCache::MutexHeldByCurrentThread() const {
  return impl_->owner.load(std::memory_order_relaxed) == std::this_thread::get_id();
}

const KvRegion& HierarchicalCache::device_region() const { return impl_->device; }
const KvRegion& HierarchicalCache::host_region() const { return impl_->host_region; }
int64_t HierarchicalCache::page_size() const { return impl_->P; }
TransferBackend HierarchicalCache::backend() const { return impl_->engine->backend(); }
StorageBackend* HierarchicalCache::storage() const { return impl_->storage.get(); }

}  // namespace kvtier
