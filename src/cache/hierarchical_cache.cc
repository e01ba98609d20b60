// The hierarchical KV cache (see kvtier/hierarchical_cache.h).
//
// State, all guarded by State::mu except where noted:
//   tree          the radix tree over both tiers;
//   page_owner    per device page: kFree, kEngine (handed out, not yet inserted or freed) or
//                 kTree (some node's device slots);
//   handles       live MatchHandles: the node each pins (ancestors included) and, on a GPU, the
//                 load-back it started;
//   inflight      copies submitted and not yet reaped. A node touched by one carries it as its
//                 `pending` copy and is evictable in no tier until Reap clears it; a split hands
//                 the copy to both halves (split hook).
// Invariants (CheckConsistency): the tree's device pages are exactly the kTree pages, each once;
// the device allocator's used pages are the kTree plus kEngine pages; the host allocator's used
// pages are exactly the tree's host pages, each once; every node's ref_count equals the number of
// live handles pinning it or a descendant.
//
// Copies: backups (device -> host) are submitted with their host pages already assigned to the
// nodes (so nothing else can take those pages) and run on worker threads / a CUDA stream outside
// `mu`; the worker threads touch only the PendingCopy (its index lists, status and done flag) and
// the region bytes of those slots. Load-backs and write_back evictions copy synchronously on the
// cpu backend; on a GPU a load-back is enqueued on the caller's stream and its nodes stay busy
// until its last event has completed.
#include "kvtier/hierarchical_cache.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "kvtier/device.h"
#include "kvtier/host_pool.h"
#include "kvtier/radix_tree.h"
#include "kvtier/slot_allocator.h"
#include "util/log.h"

namespace kvtier {

// An in-flight copy (declared in radix_tree.h).
struct PendingCopy {
  enum class Kind : uint8_t { kBackup, kLoad };
  Kind kind = Kind::kBackup;
  std::vector<RadixNode*> nodes;  // guarded by the cache mutex
  std::vector<int64_t> src;       // immutable once submitted
  std::vector<int64_t> dst;
  int64_t tokens = 0;
  bool gpu = false;
  // cpu: set by the worker (status first, then done with release order).
  std::atomic<bool> done{false};
  Status status;
  // GPU: recorded after the copy on its stream; per-layer events for loads.
  CudaEventHandle event;
  std::unique_ptr<LayerEvents> layer_events;
};

namespace {

enum PageOwner : uint8_t { kFree = 0, kEngine = 1, kTree = 2 };

bool IsPowerOfTwo(int64_t x) { return x > 0 && (x & (x - 1)) == 0; }

}  // namespace

struct HierarchicalCache::Impl {
  Impl(const HierarchicalCacheConfig& cfg, int64_t page_size)
      : config(cfg),
        P(page_size),
        log2_page(std::countr_zero(static_cast<uint64_t>(page_size))),
        tree(page_size,
             cfg.device_eviction_policy ? cfg.device_eviction_policy
                                        : MakeEvictionPolicy(cfg.device_eviction),
             cfg.host_eviction_policy ? cfg.host_eviction_policy
                                      : MakeEvictionPolicy(cfg.host_eviction)) {}

  struct Handle {
    RadixNode* last = nullptr;  // pinned (with its ancestors) unless a root
    std::shared_ptr<PendingCopy> load;
  };

  const HierarchicalCacheConfig config;
  const int64_t P;
  const int log2_page;  // P is a power of two: page numbers by shifting, not dividing
  KvRegion device;
  std::unique_ptr<HostKvPool> host;
  std::unique_ptr<TransferEngine> engine;
  std::unique_ptr<SlotAllocator> device_alloc;
  bool gpu = false;
  CudaStreamHandle backup_stream;  // GPU only
  CudaEventHandle kv_written;      // GPU only: recorded on the engine's stream at each Insert

  mutable std::mutex mu;
  RadixTree tree;
  std::vector<uint8_t> page_owner;
  std::vector<int64_t> device_frees;  // page starts evicted, not yet returned to device_alloc
  int64_t engine_pages = 0;
  std::unordered_map<uint64_t, Handle> handles;
  uint64_t next_handle = 1;
  std::vector<std::shared_ptr<PendingCopy>> inflight;
  Status health;
  CacheStats counters;

  // Backup workers (cpu backend).
  std::mutex worker_mu;
  std::condition_variable worker_cv;
  std::condition_variable done_cv;
  std::deque<std::shared_ptr<PendingCopy>> queue;  // guarded by worker_mu
  bool stop = false;                               // guarded by worker_mu
  std::vector<std::thread> workers;

  // ---- helpers; all REQUIRE mu held ------------------------------------------------------
  uint8_t& Owner(int64_t page_start) {
    return page_owner[static_cast<uint64_t>(page_start) >> log2_page];
  }

  Status CheckHealth() const {
    if (health.ok()) return Status::OK();
    return Status::FailedPrecondition(
        fmt::format("the cache is unusable after a failed copy: {}", health.ToString()));
  }

  std::vector<RadixNode*> Path(RadixNode* last) const {
    std::vector<RadixNode*> path;
    for (RadixNode* n = last; n != nullptr && !n->is_root(); n = n->parent()) path.push_back(n);
    std::reverse(path.begin(), path.end());
    return path;
  }

  // Appends the slots of `pages` (page starts) to `out`.
  void AppendSlots(std::span<const int64_t> pages, std::vector<int64_t>* out) const {
    const size_t at = out->size();
    const int64_t page_size = P;  // a local, so the stores below cannot alias it
    const size_t n = pages.size();
    out->resize(at + n * static_cast<size_t>(page_size));
    const int64_t* __restrict in = pages.data();
    int64_t* __restrict o = out->data() + at;
    for (size_t k = 0; k < n; ++k) {
      const int64_t page = in[k];
      for (int64_t j = 0; j < page_size; ++j) o[j] = page + j;  // vectorised
      o += page_size;
    }
  }

  std::vector<int64_t> DeviceSlotsOf(const std::vector<RadixNode*>& path) const {
    std::vector<int64_t> out;
    for (RadixNode* n : path) {
      if (!n->on_device()) break;
      AppendSlots(n->device_pages(), &out);
    }
    return out;
  }

  void Notify(CacheTier tier, RadixNode* node, bool kept_in_host) {
    if (!config.eviction_listener) return;
    const std::vector<Token> prefix = tree.PrefixTokens(node);
    config.eviction_listener(
        EvictionEvent{tier, node->name_space(), prefix, node->num_tokens(), kept_in_host, false});
  }

  Status RunCopy(const PendingCopy& op, CudaStream stream) {
    const bool to_host = op.kind == PendingCopy::Kind::kBackup;
    const KvRegion& src = to_host ? device : host->region();
    const KvRegion& dst = to_host ? host->region() : device;
    return engine->Transfer(TransferRequest::AllLayers(src, dst, SlotIndices::Host(op.src),
                                                       SlotIndices::Host(op.dst)),
                            TransferOptions{stream, op.layer_events.get()});
  }

  bool IsDone(PendingCopy& op) {
    if (!op.gpu) return op.done.load(std::memory_order_acquire);
    if (op.done.load(std::memory_order_relaxed)) return true;
    Result<bool> q = op.event.Query();
    if (!q.ok()) {
      op.status = q.status();
    } else if (!*q) {
      return false;
    }
    op.done.store(true, std::memory_order_relaxed);
    return true;
  }

  void Wait(PendingCopy& op) {
    if (op.gpu) {
      if (!op.done.load(std::memory_order_relaxed)) {
        Status st = op.event.Synchronize();
        if (!st.ok() && op.status.ok()) op.status = std::move(st);
        op.done.store(true, std::memory_order_relaxed);
      }
      return;
    }
    std::unique_lock<std::mutex> lk(worker_mu);
    done_cv.wait(lk, [&] { return op.done.load(std::memory_order_acquire); });
  }

  // Clears finished copies off their nodes; a failed copy makes the cache unusable.
  void Reap() {
    size_t keep = 0;
    for (size_t i = 0; i < inflight.size(); ++i) {
      std::shared_ptr<PendingCopy>& op = inflight[i];
      if (!IsDone(*op)) {
        if (keep != i) inflight[keep] = std::move(op);
        ++keep;
        continue;
      }
      if (!op->status.ok() && health.ok()) {
        health = op->status.WithContext(op->kind == PendingCopy::Kind::kBackup ? "backup copy"
                                                                               : "load-back copy");
        util::Log(util::LogLevel::kError, "kvtier: cache: {}", health.ToString());
      }
      for (RadixNode* n : op->nodes) {
        if (n->pending() == op) tree.SetPending(n, nullptr);
      }
      if (op->kind == PendingCopy::Kind::kBackup) {
        counters.backup_tokens += op->tokens;
        counters.backup_inflight_tokens -= op->tokens;
      }
    }
    inflight.resize(keep);
  }

  void WaitAll() {
    for (auto& op : inflight) Wait(*op);
    Reap();
  }

  // Takes a node's device pages and queues them for FlushDeviceFrees (one allocator call per
  // eviction round).
  void FreeTreeDevicePages(RadixNode* node) {
    const size_t from = device_frees.size();
    tree.TakeDevicePages(node, &device_frees);
    for (size_t i = from; i < device_frees.size(); ++i) Owner(device_frees[i]) = kFree;
  }
  void FlushDeviceFrees() {
    if (device_frees.empty()) return;
    Status st = device_alloc->FreePages(device_frees);
    if (!st.ok() && health.ok()) health = Status::Internal(st.WithContext("device pages").ToString());
    device_frees.clear();
  }

  void FreeHostPages(const std::vector<int64_t>& pages) {
    Status st = host->FreePages(pages);
    if (!st.ok() && health.ok()) health = Status::Internal(st.WithContext("host pages").ToString());
  }

  int64_t EvictHost(int64_t need_pages) {
    int64_t freed = 0;
    while (freed < need_pages) {
      RadixNode* v = tree.HostVictim();
      if (v == nullptr) break;
      const int64_t n = v->num_tokens();
      Notify(CacheTier::kHost, v, false);
      FreeHostPages(tree.TakeHostPages(v));
      tree.Remove(v);
      freed += n / P;
      counters.host_evicted_tokens += n;
      ++counters.host_evictions;
    }
    return freed;
  }

  bool EnsureHostPages(int64_t pages) {
    const int64_t free = host->allocator().free_pages();
    if (free < pages) EvictHost(pages - free);
    return host->allocator().free_pages() >= pages;
  }

  // Assigns host pages to the unbacked part of the path ending at `node` (top-down) and builds
  // the copy. Null when host memory cannot be found (nothing changes then).
  std::shared_ptr<PendingCopy> PrepareBackup(RadixNode* node) {
    std::vector<RadixNode*> path;
    for (RadixNode* n = node; !n->is_root() && !n->on_host(); n = n->parent()) path.push_back(n);
    if (path.empty()) return nullptr;
    std::reverse(path.begin(), path.end());
    int64_t tokens = 0;
    for (RadixNode* n : path) tokens += n->num_tokens();
    if (!EnsureHostPages(tokens / P)) {
      counters.backup_skipped_tokens += tokens;
      return nullptr;
    }
    Result<std::vector<int64_t>> pages = host->AllocatePages(tokens / P);
    if (!pages.ok()) {
      counters.backup_skipped_tokens += tokens;
      return nullptr;
    }
    auto op = std::make_shared<PendingCopy>();
    op->kind = PendingCopy::Kind::kBackup;
    op->tokens = tokens;
    op->gpu = gpu;
    op->dst = PageSlots(*pages, P);
    op->src.reserve(static_cast<size_t>(tokens));
    size_t off = 0;
    for (RadixNode* n : path) {
      AppendSlots(n->device_pages(), &op->src);
      const size_t np = n->device_pages().size();
      tree.SetHostPages(n, std::vector<int64_t>(pages->begin() + off, pages->begin() + off + np));
      off += np;
      op->nodes.push_back(n);
    }
    return op;
  }

  // Write policy: backs up the path ending at `node` asynchronously.
  void Backup(RadixNode* node) {
    std::shared_ptr<PendingCopy> op = PrepareBackup(node);
    if (!op) return;
    for (RadixNode* n : op->nodes) tree.SetPending(n, op);
    counters.backup_inflight_tokens += op->tokens;
    inflight.push_back(op);
    if (gpu) {
      Status st = RunCopy(*op, backup_stream.get());
      if (st.ok()) {
        Result<CudaEventHandle> ev = CudaEventHandle::Create(device.device);
        st = ev.ok() ? ev->Record(backup_stream.get()) : ev.status();
        if (ev.ok()) op->event = std::move(*ev);
      }
      if (!st.ok()) {
        op->status = std::move(st);
        op->done.store(true);
      }
      return;
    }
    if (workers.empty()) {
      op->status = RunCopy(*op, nullptr);
      op->done.store(true, std::memory_order_release);
      Reap();
      return;
    }
    {
      std::lock_guard<std::mutex> lk(worker_mu);
      queue.push_back(op);
    }
    worker_cv.notify_one();
  }

  // write_back eviction: copies the unbacked path ending at `node` to host memory now.
  bool WriteBack(RadixNode* node) {
    std::shared_ptr<PendingCopy> op = PrepareBackup(node);
    if (!op) return false;
    Status st = RunCopy(*op, gpu ? backup_stream.get() : nullptr);
    if (st.ok() && gpu) {
      st = backup_stream.Synchronize();
      if (st.ok()) st = engine->Synchronize(backup_stream.get());
    }
    if (!st.ok()) {
      if (health.ok()) health = st.WithContext("write_back copy");
      return false;
    }
    counters.write_back_tokens += op->tokens;
    counters.backup_tokens += op->tokens;
    return true;
  }

  void MaybeBackup(const std::vector<RadixNode*>& path) {
    if (config.write_policy == WritePolicy::kWriteBack) return;
    const int64_t threshold = config.write_policy == WritePolicy::kWriteThrough
                                  ? 1
                                  : config.write_through_threshold;
    for (auto it = path.rbegin(); it != path.rend(); ++it) {
      RadixNode* n = *it;
      if (n->on_device() && !n->on_host() && n->hit_count() >= threshold) {
        Backup(n);
        return;
      }
    }
  }

  // `pages` device pages, evicting first what must go. OutOfMemory, naming `what`, when pins and
  // copies in flight leave too little to evict.
  Result<std::vector<int64_t>> AllocateDevicePages(int64_t pages, std::string_view what) {
    Reap();
    const int64_t free = device_alloc->free_pages();
    if (free < pages) EvictDevice(pages - free);
    KVTIER_RETURN_IF_ERROR(CheckHealth());
    Result<std::vector<int64_t>> alloc = device_alloc->AllocatePages(pages);
    if (!alloc.ok()) {
      return Status::OutOfMemory(fmt::format(
          "{}: the device cannot make room ({} pages free, {} held by the engine, the rest "
          "pinned or busy)", what, device_alloc->free_pages(), engine_pages));
    }
    return alloc;
  }

  // Frees at least `need_pages` device pages if it can; returns the pages freed.
  int64_t EvictDevice(int64_t need_pages) {
    int64_t freed = 0;
    Reap();
    while (freed < need_pages) {
      if (!health.ok()) break;
      RadixNode* v = tree.DeviceVictim();
      tree.PrefetchDeviceVictims();
      if (v == nullptr) {
        if (inflight.empty()) break;
        WaitAll();  // nodes with copies in flight become evictable once those finish
        continue;
      }
      const int64_t n = v->num_tokens();
      if (!v->on_host() && config.write_policy == WritePolicy::kWriteBack) WriteBack(v);
      if (!health.ok()) break;
      if (v->on_host()) {
        Notify(CacheTier::kDevice, v, true);
        FreeTreeDevicePages(v);
      } else {
        if (v->num_children() != 0) {
          health = Status::Internal(fmt::format(
              "device victim node {} has no host copy but has {} children", v->id(),
              v->num_children()));
          break;
        }
        Notify(CacheTier::kDevice, v, false);
        FreeTreeDevicePages(v);
        tree.Remove(v);
        counters.dropped_tokens += n;
      }
      freed += n / P;
      counters.device_evicted_tokens += n;
      ++counters.device_evictions;
    }
    FlushDeviceFrees();
    return freed;
  }

  // Checks that `slots` are whole aligned pages inside the device pool; page starts to `pages`.
  Status CheckPages(std::span<const int64_t> slots, std::string_view arg,
                    std::vector<int64_t>* pages) const {
    if (slots.size() % P != 0) {
      return Status::InvalidArgument(fmt::format(
          "{} has {} slots, not a multiple of page_size = {}", arg, slots.size(), P));
    }
    const int64_t N = device.geometry.num_slots;
    pages->reserve(pages->size() + slots.size() / P);
    for (size_t k = 0; k < slots.size(); k += P) {
      const int64_t s = slots[k];
      if (s < 0 || s >= N) {
        return Status::InvalidArgument(
            fmt::format("{}[{}] = {} is outside the device pool [0, {})", arg, k, s, N));
      }
      if (s % P != 0) {
        return Status::InvalidArgument(fmt::format(
            "{}[{}] = {} starts a page but is not a multiple of page_size = {}", arg, k, s, P));
      }
      // N is a multiple of P, so the rest of an aligned page is in range too.
      for (int64_t j = 1; j < P; ++j) {
        if (slots[k + j] != s + j) {
          return Status::InvalidArgument(fmt::format(
              "{}[{}] = {} does not continue its page (expected {})", arg, k + j, slots[k + j],
              s + j));
        }
      }
      pages->push_back(s);
    }
    return Status::OK();
  }

  // Pages the engine passes back must be held by it, each once. `skip[i]` exempts page i.
  Status CheckEngineHeld(std::span<const int64_t> pages, std::string_view arg,
                         const std::vector<bool>* skip) {
    for (size_t i = 0; i < pages.size(); ++i) {
      if (skip != nullptr && (*skip)[i]) continue;
      const int64_t p = pages[i] >> log2_page;
      if (page_owner[p] != kEngine) {
        // Undo the marks of this call before answering.
        for (size_t j = 0; j < i; ++j) {
          if ((skip == nullptr || !(*skip)[j]) && Owner(pages[j]) == 0xFF) {
            Owner(pages[j]) = kEngine;
          }
        }
        const char* why = page_owner[p] == kFree ? "is not allocated"
                          : page_owner[p] == kTree ? "is cached by another prefix"
                                                   : "appears twice in this call";
        return Status::InvalidArgument(fmt::format(
            "{}: page at slot {} (page {} of the call) {}; only pages from AllocateDeviceSlots "
            "may be passed", arg, pages[i], i, why));
      }
      page_owner[p] = 0xFF;  // mark to catch repeats
    }
    for (size_t i = 0; i < pages.size(); ++i) {
      if (Owner(pages[i]) == 0xFF) Owner(pages[i]) = kEngine;
    }
    return Status::OK();
  }
};

HierarchicalCache::HierarchicalCache(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

HierarchicalCache::~HierarchicalCache() {
  Impl& s = *impl_;
  {
    std::lock_guard<std::mutex> lk(s.mu);
    s.WaitAll();
  }
  {
    std::lock_guard<std::mutex> lk(s.worker_mu);
    s.stop = true;
  }
  s.worker_cv.notify_all();
  for (auto& t : s.workers) t.join();
  if (s.gpu) (void)s.backup_stream.Synchronize();
}

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
  if (!IsPowerOfTwo(g.page_size) || g.page_size > 256) {
    return Status::InvalidArgument(fmt::format(
        "device_region.page_size = {} must be a power of two in [1, 256]", g.page_size));
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
    return Status::InvalidArgument(fmt::format(
        "device_region is in host memory but the transfer backend is {}; use cpu",
        TransferBackendName(engine->backend())));
  }

  auto state = std::make_unique<Impl>(config, g.page_size);
  state->device = device_region;
  state->engine = std::move(engine);
  state->gpu = gpu;

  HostKvPoolConfig hc;
  hc.layout = config.host_layout;
  hc.mla = device_region.mla;
  hc.num_layers = g.num_layers;
  hc.slot_bytes = g.slot_bytes;
  hc.page_size = g.page_size;
  hc.head_num = config.host_head_num > 0 ? config.host_head_num : g.head_num;
  if (config.host_capacity_bytes > 0) {
    hc.capacity_bytes = config.host_capacity_bytes;
  } else {
    hc.device_ratio = config.host_ratio;
    hc.device_pool_bytes = g.buffer_bytes() * device_region.num_buffers();
  }
  hc.huge_pages = config.host_huge_pages;
  hc.register_with_cuda = gpu;
  KVTIER_ASSIGN_OR_RETURN(state->host, HostKvPool::Create(hc));
  KVTIER_ASSIGN_OR_RETURN(state->device_alloc, SlotAllocator::Create(g.num_slots, g.page_size));
  state->page_owner.assign(static_cast<size_t>(g.num_pages()), kFree);
  if (gpu) {
    KVTIER_ASSIGN_OR_RETURN(state->backup_stream, CudaStreamHandle::Create(device_region.device));
    KVTIER_ASSIGN_OR_RETURN(state->kv_written, CudaEventHandle::Create(device_region.device));
  } else {
    Impl* s = state.get();
    for (int i = 0; i < config.backup_threads; ++i) {
      s->workers.emplace_back([s] {
        for (;;) {
          std::shared_ptr<PendingCopy> op;
          {
            std::unique_lock<std::mutex> lk(s->worker_mu);
            s->worker_cv.wait(lk, [&] { return s->stop || !s->queue.empty(); });
            if (s->queue.empty()) return;
            op = std::move(s->queue.front());
            s->queue.pop_front();
          }
          Status st = s->RunCopy(*op, nullptr);
          {
            std::lock_guard<std::mutex> lk(s->worker_mu);
            op->status = std::move(st);
            op->done.store(true, std::memory_order_release);
          }
          s->done_cv.notify_all();
        }
      });
    }
  }
  Impl* s = state.get();
  s->tree.SetSplitHook([s](RadixNode* upper, RadixNode* lower) {
    if (lower->pending()) lower->pending()->nodes.push_back(upper);
  });
  return std::unique_ptr<HierarchicalCache>(new HierarchicalCache(std::move(state)));
}

Result<MatchResult> HierarchicalCache::Match(std::span<const Token> tokens, std::string_view ns) {
  Impl& s = *impl_;
  std::lock_guard<std::mutex> lk(s.mu);
  KVTIER_RETURN_IF_ERROR(s.CheckHealth());
  s.Reap();
  RadixTree::MatchResult r = s.tree.Match(ns, tokens);
  MatchResult out;
  out.device_tokens = r.device_tokens;
  out.host_tokens = r.host_tokens;
  const std::vector<RadixNode*> path = s.Path(r.last);
  out.device_slots.reserve(static_cast<size_t>(r.device_tokens));
  out.host_slots.reserve(static_cast<size_t>(r.host_tokens));
  for (RadixNode* n : path) {
    if (n->on_device()) {
      s.AppendSlots(n->device_pages(), &out.device_slots);
    } else {
      s.AppendSlots(n->host_pages(), &out.host_slots);
    }
    s.tree.Touch(n, 1);
  }
  out.handle.id = s.next_handle++;
  if (!r.last->is_root()) s.tree.IncRef(r.last);
  s.handles.emplace(out.handle.id, Impl::Handle{r.last, nullptr});
  s.MaybeBackup(path);
  ++s.counters.match_calls;
  s.counters.match_query_tokens += static_cast<int64_t>(tokens.size());
  s.counters.device_hit_tokens += r.device_tokens;
  s.counters.host_hit_tokens += r.host_tokens;
  return out;
}

Result<LoadBackResult> HierarchicalCache::LoadBack(MatchHandle handle, CudaStream stream) {
  Impl& s = *impl_;
  std::lock_guard<std::mutex> lk(s.mu);
  KVTIER_RETURN_IF_ERROR(s.CheckHealth());
  s.Reap();
  auto it = s.handles.find(handle.id);
  if (it == s.handles.end()) {
    return Status::InvalidArgument(fmt::format(
        "handle {} is not live (never issued, or already released)", handle.id));
  }
  const auto start = std::chrono::steady_clock::now();
  const std::vector<RadixNode*> path = s.Path(it->second.last);
  std::vector<RadixNode*> host_nodes;
  int64_t tokens = 0;
  for (RadixNode* n : path) {
    if (n->on_device()) continue;
    host_nodes.push_back(n);
    tokens += n->num_tokens();
  }
  LoadBackResult out;
  if (tokens == 0 || tokens < s.config.load_back_min_tokens) {
    out.skipped_tokens = tokens;
    s.counters.load_back_skipped_tokens += tokens;
    out.device_slots = s.DeviceSlotsOf(path);
    return out;
  }
  const int64_t pages = tokens / s.P;
  if (pages > s.device_alloc->num_pages()) {
    return Status::OutOfMemory(fmt::format("LoadBack of {} tokens exceeds the device pool of {}",
                                           tokens, s.device_alloc->num_slots()));
  }
  Result<std::vector<int64_t>> alloc =
      s.AllocateDevicePages(pages, fmt::format("LoadBack of {} tokens", tokens));
  if (!alloc.ok()) return alloc.status();
  auto op = std::make_shared<PendingCopy>();
  op->kind = PendingCopy::Kind::kLoad;
  op->gpu = s.gpu;
  op->tokens = tokens;
  op->dst = PageSlots(*alloc, s.P);
  for (RadixNode* n : host_nodes) {
    s.AppendSlots(n->host_pages(), &op->src);
  }
  Status st;
  if (s.gpu) {
    Result<LayerEvents> events =
        LayerEvents::Create(static_cast<int>(s.device.geometry.num_layers), s.device.device);
    st = events.status();
    if (events.ok()) {
      op->layer_events = std::make_unique<LayerEvents>(std::move(*events));
      st = s.RunCopy(*op, stream);
    }
    if (st.ok()) {
      Result<CudaEventHandle> ev = CudaEventHandle::Create(s.device.device);
      st = ev.ok() ? ev->Record(stream) : ev.status();
      if (ev.ok()) op->event = std::move(*ev);
    }
  } else {
    st = s.RunCopy(*op, nullptr);
  }
  if (!st.ok()) {
    Status freed = s.device_alloc->FreePages(*alloc);
    (void)freed;
    return st.WithContext("LoadBack");
  }
  size_t off = 0;
  for (RadixNode* n : host_nodes) {
    const size_t np = n->host_pages().size();
    s.tree.SetDevicePages(n, std::vector<int64_t>(alloc->begin() + off, alloc->begin() + off + np));
    off += np;
  }
  for (int64_t p : *alloc) s.Owner(p) = kTree;
  if (s.gpu) {
    for (RadixNode* n : host_nodes) {
      op->nodes.push_back(n);
      s.tree.SetPending(n, op);
    }
    s.inflight.push_back(op);
    it->second.load = op;
  }
  out.loaded_tokens = tokens;
  out.device_slots = s.DeviceSlotsOf(path);
  ++s.counters.load_back_calls;
  s.counters.load_back_tokens += tokens;
  s.counters.load_back_seconds +=
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return out;
}

Status HierarchicalCache::WaitLayer(MatchHandle handle, int64_t layer, CudaStream consumer) {
  Impl& s = *impl_;
  std::lock_guard<std::mutex> lk(s.mu);
  auto it = s.handles.find(handle.id);
  if (it == s.handles.end()) {
    return Status::InvalidArgument(fmt::format(
        "handle {} is not live (never issued, or already released)", handle.id));
  }
  if (layer < 0 || layer >= s.device.geometry.num_layers) {
    return Status::InvalidArgument(fmt::format("layer = {} is out of range [0, {})", layer,
                                               s.device.geometry.num_layers));
  }
  // The handle's own load-back, and any other handle's load-back still filling slots of this
  // match (its nodes carry it as their pending copy until it has finished).
  std::vector<const PendingCopy*> loads;
  if (it->second.load && it->second.load->layer_events) loads.push_back(it->second.load.get());
  for (RadixNode* n : s.Path(it->second.last)) {
    const PendingCopy* op = n->pending().get();
    if (op != nullptr && op->kind == PendingCopy::Kind::kLoad && op->layer_events &&
        std::find(loads.begin(), loads.end(), op) == loads.end()) {
      loads.push_back(op);
    }
  }
  for (const PendingCopy* op : loads) {
    KVTIER_RETURN_IF_ERROR(op->layer_events->Wait(static_cast<int>(layer), consumer));
  }
  return Status::OK();
}

Status HierarchicalCache::Release(MatchHandle handle) {
  Impl& s = *impl_;
  std::lock_guard<std::mutex> lk(s.mu);
  auto it = s.handles.find(handle.id);
  if (it == s.handles.end()) {
    return Status::InvalidArgument(fmt::format(
        "handle {} is not live (never issued, or already released)", handle.id));
  }
  if (!it->second.last->is_root()) s.tree.DecRef(it->second.last);
  s.handles.erase(it);
  s.Reap();
  return Status::OK();
}

Result<std::vector<int64_t>> HierarchicalCache::AllocateDeviceSlots(int64_t num_tokens,
                                                                   const AllocateOptions&) {
  Impl& s = *impl_;
  std::lock_guard<std::mutex> lk(s.mu);
  KVTIER_RETURN_IF_ERROR(s.CheckHealth());
  if (num_tokens < 0) {
    return Status::InvalidArgument(fmt::format("num_tokens = {} must not be negative", num_tokens));
  }
  const int64_t pages = (num_tokens + s.P - 1) / s.P;
  if (pages > s.device_alloc->num_pages()) {
    return Status::InvalidArgument(fmt::format("num_tokens = {} exceeds the device pool of {} slots",
                                               num_tokens, s.device_alloc->num_slots()));
  }
  Result<std::vector<int64_t>> alloc =
      s.AllocateDevicePages(pages, fmt::format("AllocateDeviceSlots({})", num_tokens));
  if (!alloc.ok()) return alloc.status();
  for (int64_t p : *alloc) s.Owner(p) = kEngine;
  s.engine_pages += pages;
  return PageSlots(*alloc, s.P);
}

Status HierarchicalCache::FreeDeviceSlots(std::span<const int64_t> slots) {
  Impl& s = *impl_;
  std::lock_guard<std::mutex> lk(s.mu);
  std::vector<int64_t> pages;
  KVTIER_RETURN_IF_ERROR(s.CheckPages(slots, "slots", &pages));
  KVTIER_RETURN_IF_ERROR(s.CheckEngineHeld(pages, "FreeDeviceSlots", nullptr));
  KVTIER_RETURN_IF_ERROR(s.device_alloc->FreePages(pages));
  for (int64_t p : pages) s.Owner(p) = kFree;
  s.engine_pages -= static_cast<int64_t>(pages.size());
  return Status::OK();
}

Result<InsertResult> HierarchicalCache::Insert(std::span<const Token> tokens,
                                               std::span<const int64_t> device_slots,
                                               std::string_view ns,
                                               const InsertOptions& options) {
  Impl& s = *impl_;
  std::lock_guard<std::mutex> lk(s.mu);
  KVTIER_RETURN_IF_ERROR(s.CheckHealth());
  s.Reap();
  if (tokens.size() != device_slots.size()) {
    return Status::InvalidArgument(fmt::format("tokens has {} entries but device_slots has {}",
                                               tokens.size(), device_slots.size()));
  }
  if (tokens.size() % s.P != 0) {
    return Status::InvalidArgument(fmt::format(
        "tokens has {} entries, not a multiple of page_size = {} (insert whole pages; keep the "
        "partial last page)", tokens.size(), s.P));
  }
  std::vector<int64_t> pages;
  KVTIER_RETURN_IF_ERROR(s.CheckPages(device_slots, "device_slots", &pages));
  // Pages of the cached device prefix may be the tree's own (as Match returned them).
  RadixTree::MatchResult peek = s.tree.Peek(ns, tokens);
  std::vector<int64_t> cached;
  if (peek.last != nullptr && peek.device_tokens > 0) {
    cached = s.DeviceSlotsOf(s.Path(peek.last));
    cached.resize(static_cast<size_t>(peek.device_tokens));
  }
  std::vector<bool> own(pages.size(), false);
  for (size_t i = 0; i < pages.size(); ++i) {
    own[i] = i * s.P < cached.size() && cached[i * s.P] == pages[i];
  }
  KVTIER_RETURN_IF_ERROR(s.CheckEngineHeld(pages, "Insert", &own));

  std::vector<RadixTree::InsertSegment> segments;
  s.tree.Insert(ns, tokens, pages, &segments);
  InsertResult out;
  std::vector<int64_t> duplicates;
  for (const auto& seg : segments) {
    const int64_t len = seg.end - seg.begin;
    switch (seg.kind) {
      case RadixTree::SegmentKind::kOnDevice:
        out.cached_tokens += len;
        for (int64_t k = seg.begin; k < seg.end; k += s.P) {
          const int64_t mine = seg.node->device_pages()[(k - seg.begin) / s.P];
          if (device_slots[k] != mine) {
            duplicates.push_back(device_slots[k]);
            s.Owner(device_slots[k]) = kFree;
          }
        }
        s.tree.Touch(seg.node, 1);
        break;
      case RadixTree::SegmentKind::kRevived:
      case RadixTree::SegmentKind::kNew:
        (seg.kind == RadixTree::SegmentKind::kNew ? out.new_tokens : out.revived_tokens) += len;
        for (int64_t k = seg.begin; k < seg.end; k += s.P) {
          s.Owner(device_slots[k]) = kTree;
        }
        s.tree.Touch(seg.node, seg.kind == RadixTree::SegmentKind::kNew ? 0 : 1);
        break;
    }
    s.tree.RaisePriority(seg.node, options.priority);
  }
  s.engine_pages -= static_cast<int64_t>(std::count(own.begin(), own.end(), false));
  if (!duplicates.empty()) {
    Status st = s.device_alloc->FreePages(duplicates);
    if (!st.ok()) s.health = Status::Internal(st.WithContext("freeing duplicates").ToString());
  }
  out.duplicate_tokens = static_cast<int64_t>(duplicates.size()) * s.P;
  s.counters.inserted_tokens += out.new_tokens + out.revived_tokens;
  s.counters.duplicate_tokens += out.duplicate_tokens;
  if (s.gpu) {
    // Backups run on the backup stream: order them after the engine's writes of this KV (and,
    // since every later backup is enqueued behind this wait, after all earlier inserts' too).
    Status st = s.kv_written.Record(options.stream);
    if (st.ok()) st = s.kv_written.WaitOn(s.backup_stream.get());
    if (!st.ok()) s.health = st.WithContext("ordering backups after the engine's stream");
  }
  if (options.pin) {
    RadixNode* last = segments.empty() ? nullptr : segments.back().node;
    if (last == nullptr) {
      // Nothing inserted (no tokens): an empty pin on the namespace root.
      last = s.tree.Match(ns, std::span<const Token>()).last;
    } else {
      s.tree.IncRef(last);
    }
    out.handle.id = s.next_handle++;
    s.handles.emplace(out.handle.id, Impl::Handle{last, nullptr});
  }
  if (!segments.empty()) s.MaybeBackup(s.Path(segments.back().node));
  return out;
}

Result<int64_t> HierarchicalCache::EvictDevice(int64_t num_tokens) {
  Impl& s = *impl_;
  std::lock_guard<std::mutex> lk(s.mu);
  KVTIER_RETURN_IF_ERROR(s.CheckHealth());
  if (num_tokens < 0) {
    return Status::InvalidArgument(fmt::format("num_tokens = {} must not be negative", num_tokens));
  }
  const int64_t freed = s.EvictDevice((num_tokens + s.P - 1) / s.P);
  KVTIER_RETURN_IF_ERROR(s.CheckHealth());
  return freed * s.P;
}

Result<int64_t> HierarchicalCache::EvictHost(int64_t num_tokens) {
  Impl& s = *impl_;
  std::lock_guard<std::mutex> lk(s.mu);
  KVTIER_RETURN_IF_ERROR(s.CheckHealth());
  if (num_tokens < 0) {
    return Status::InvalidArgument(fmt::format("num_tokens = {} must not be negative", num_tokens));
  }
  s.Reap();
  return s.EvictHost((num_tokens + s.P - 1) / s.P) * s.P;
}

Status HierarchicalCache::WaitForBackups() {
  Impl& s = *impl_;
  std::lock_guard<std::mutex> lk(s.mu);
  s.WaitAll();
  return s.CheckHealth();
}

CacheStats HierarchicalCache::stats() const {
  const Impl& s = *impl_;
  std::lock_guard<std::mutex> lk(s.mu);
  CacheStats c = s.counters;
  c.page_size = s.P;
  c.device_total_tokens = s.device_alloc->num_slots();
  c.device_used_tokens = s.device_alloc->used_pages() * s.P;
  c.device_cached_tokens = s.tree.device_tokens();
  c.device_engine_tokens = s.engine_pages * s.P;
  c.host_total_tokens = s.host->num_slots();
  c.host_used_tokens = s.host->allocator().used_pages() * s.P;
  c.host_total_bytes = s.host->capacity_bytes();
  c.nodes = s.tree.num_nodes();
  c.live_handles = static_cast<int64_t>(s.handles.size());
  return c;
}

Status HierarchicalCache::CheckConsistency() const {
  const Impl& s = *impl_;
  std::lock_guard<std::mutex> lk(s.mu);
  KVTIER_RETURN_IF_ERROR(s.tree.CheckInvariants());
  const int64_t P = s.P;
  std::vector<uint8_t> dev_seen(s.page_owner.size(), 0);
  std::vector<uint8_t> host_seen(static_cast<size_t>(s.host->num_pages()), 0);
  std::unordered_map<const RadixNode*, int64_t> expected_refs;
  for (const auto& [id, h] : s.handles) {
    for (const RadixNode* n = h.last; !n->is_root(); n = n->parent()) ++expected_refs[n];
  }
  Status st;
  int64_t tree_pages = 0, host_pages = 0;
  s.tree.ForEachNode([&](const RadixNode& n) {
    if (!st.ok()) return;
    for (int64_t start : n.device_pages()) {
      const int64_t p = start / P;
      if (s.page_owner[p] != kTree || dev_seen[p] || !s.device_alloc->IsAllocated(p * P)) {
        st = Status::Internal(fmt::format(
            "node {}: device page at slot {} has owner {}, seen {}, allocated {}", n.id(), p * P,
            s.page_owner[p], dev_seen[p], s.device_alloc->IsAllocated(p * P)));
        return;
      }
      dev_seen[p] = 1;
      ++tree_pages;
    }
    for (int64_t start : n.host_pages()) {
      const int64_t p = start / P;
      if (host_seen[p] || !s.host->allocator().IsAllocated(p * P)) {
        st = Status::Internal(fmt::format("node {}: host page at slot {} seen {}, allocated {}",
                                          n.id(), p * P, host_seen[p],
                                          s.host->allocator().IsAllocated(p * P)));
        return;
      }
      host_seen[p] = 1;
      ++host_pages;
    }
    auto it = expected_refs.find(&n);
    const int64_t want = it == expected_refs.end() ? 0 : it->second;
    if (n.ref_count() != want) {
      st = Status::Internal(fmt::format("node {}: ref_count {} but {} live handles pin it", n.id(),
                                        n.ref_count(), want));
      return;
    }
    if (n.busy()) {
      bool found = false;
      for (const auto& op : s.inflight) found = found || op == n.pending();
      if (!found) st = Status::Internal(fmt::format("node {}: busy with a reaped copy", n.id()));
    }
  });
  KVTIER_RETURN_IF_ERROR(st);
  const int64_t owner_tree = std::count(s.page_owner.begin(), s.page_owner.end(), kTree);
  const int64_t owner_engine = std::count(s.page_owner.begin(), s.page_owner.end(), kEngine);
  if (owner_tree != tree_pages || owner_engine != s.engine_pages ||
      s.device_alloc->used_pages() != tree_pages + s.engine_pages) {
    return Status::Internal(fmt::format(
        "device pages: tree {} (owner map {}), engine {} (owner map {}), allocator used {}",
        tree_pages, owner_tree, s.engine_pages, owner_engine, s.device_alloc->used_pages()));
  }
  if (s.host->allocator().used_pages() != host_pages) {
    return Status::Internal(fmt::format("host pages: tree {}, allocator used {}", host_pages,
                                        s.host->allocator().used_pages()));
  }
  return Status::OK();
}

const KvRegion& HierarchicalCache::device_region() const { return impl_->device; }
const KvRegion& HierarchicalCache::host_region() const { return impl_->host->region(); }
int64_t HierarchicalCache::page_size() const { return impl_->P; }
TransferBackend HierarchicalCache::backend() const { return impl_->engine->backend(); }

}  // namespace kvtier

namespace kvtier {

// Interim (cache-v2 in progress): the storage tier's calls answer FailedPrecondition until the
// restructured cache lands.
Result<StorageQueryResult> HierarchicalCache::QueryStorage(MatchHandle) {
  return Status::FailedPrecondition("QueryStorage: the storage tier is not implemented yet");
}
Result<PrefetchResult> HierarchicalCache::Prefetch(MatchHandle handle) {
  return Prefetch(handle, impl_->config.storage.prefetch_policy);
}
Result<PrefetchResult> HierarchicalCache::Prefetch(MatchHandle, PrefetchPolicy) {
  return Status::FailedPrecondition("Prefetch: the storage tier is not implemented yet");
}
Result<PrefetchResult> HierarchicalCache::PollPrefetch(MatchHandle) {
  return Status::FailedPrecondition("PollPrefetch: the storage tier is not implemented yet");
}
Result<PrefetchResult> HierarchicalCache::FinishPrefetch(MatchHandle) {
  return Status::FailedPrecondition("FinishPrefetch: the storage tier is not implemented yet");
}
bool HierarchicalCache::MutexHeldByCurrentThread() const { return false; }
StorageBackend* HierarchicalCache::storage() const { return nullptr; }

}  // namespace kvtier
