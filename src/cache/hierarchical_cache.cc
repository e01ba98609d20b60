// The hierarchical KV cache (see kvtier/hierarchical_cache.h): the tree and the policies on top of
// the device page ledger (cache/device_page_ledger.h) and the copy tracker (cache/copy_tracker.h).
//
// State, all guarded by Impl::mu:
//   tree          the radix tree over the three tiers (cache/radix_tree.h);
//   ledger        per device page: free, engine, tree or a copy in flight;
//   host pages    the host tier (cache/host_tier.h: the cache's own pool, or a shared segment
//                 whose pages it pins): a held page is a node's (tree) or an in-flight prefetch's
//                 (filling) — nothing else; null without a host tier (nothing is ever backed up,
//                 device evictions forget);
//   handles       live MatchHandles: the node each pins (ancestors included), the tokens after
//                 the match (for QueryStorage), a running prefetch and, on a GPU, its load-back;
//   tracker       operations in flight. Each marked its nodes busy once (a split hands the mark to
//                 both halves: the split hook); a busy node is evictable in no tier.
// Invariants (CheckConsistency): the tree's device pages are exactly the ledger's kTree pages; the
// ledger's kCopy pages are exactly the load-backs' unpublished pages; the host allocator's used
// pages are the tree's host pages plus the prefetches' filling pages; every node's ref_count
// equals the number of live handles pinning it or a descendant, and its busy count the number of
// operations that list it.
//
// Locking discipline: every public call takes `mu`, does bookkeeping only, and collects into a
// `Work` what must happen outside it — submitting copies (cpu pool, inline, or a CUDA stream) and
// storage calls, and the eviction listener's events — which RunWork does after `mu` is released.
// Completions are applied (Reap) by the next call under `mu`. Calls that wait (FinishPrefetch,
// WaitForBackups, allocations that need a write-back to finish) release `mu` while they wait.
#include "kvtier/hierarchical_cache.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <chrono>
#include <cmath>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include "cache/copy_tracker.h"
#include "cache/device_page_ledger.h"
#include "cache/host_tier.h"
#include "cache/radix_tree.h"
#include "kvtier/device.h"
#include "kvtier/host_pool.h"
#include "kvtier/shared_host_pool.h"
#include "kvtier/slot_allocator.h"
#include "storage/page_staging.h"
#include "util/log.h"
#include "util/thread_pool.h"

namespace kvtier {

namespace {

using Clock = std::chrono::steady_clock;

bool IsPowerOfTwo(int64_t x) { return x > 0 && (x & (x - 1)) == 0; }

// Pages covering `num_tokens` (no overflow near INT64_MAX).
int64_t PagesFor(int64_t num_tokens, int64_t page_size) {
  return num_tokens / page_size + (num_tokens % page_size != 0 ? 1 : 0);
}

double SecondsSince(Clock::time_point start, Clock::time_point end = Clock::now()) {
  return std::chrono::duration<double>(end - start).count();
}

// Handle ids: the instance's tag in the high 24 bits, a sequence number in the low 40.
constexpr int kHandleSeqBits = 40;
std::atomic<uint64_t> g_next_cache_tag{1};

// An eviction event whose strings the cache owns until the listener has run.
struct OwnedEvent {
  CacheTier tier;
  std::string name_space;
  std::vector<Token> prefix;
  int64_t num_tokens;
  bool kept_in_host;
  bool kept_in_storage;
};

}  // namespace

struct HierarchicalCache::Impl {
  Impl(const HierarchicalCacheConfig& cfg, int64_t page_size)
      : config(cfg),
        P(page_size),
        tag(g_next_cache_tag.fetch_add(1) & ((uint64_t{1} << (64 - kHandleSeqBits)) - 1)),
        tree(page_size,
             cfg.device_eviction_policy ? cfg.device_eviction_policy
                                        : MakeEvictionPolicy(cfg.device_eviction),
             cfg.host_eviction_policy ? cfg.host_eviction_policy
                                      : MakeEvictionPolicy(cfg.host_eviction)) {}

  struct Handle {
    RadixNode* last = nullptr;  // pinned with its ancestors; null: nothing matched
    std::string ns;
    std::vector<Token> rest;           // whole pages after the match (storage tier only)
    std::shared_ptr<CopyOp> load;      // GPU: its LoadBack
    std::shared_ptr<CopyOp> prefetch;  // running (not concluded) prefetch
    PrefetchPolicy prefetch_policy = PrefetchPolicy::kBestEffort;
  };

  // What a call does after releasing the mutex. Operations in it are registered already, so it
  // must run: a public call declares its Work before its Lock, and the Work's destructor runs
  // what is left after the lock is gone (early returns included).
  struct Work {
    explicit Work(Impl* owner = nullptr) : impl(owner) {}
    ~Work() {
      if (impl != nullptr) impl->RunWork(*this);
    }
    Work(const Work&) = delete;
    Work& operator=(const Work&) = delete;
    Impl* impl;
    std::vector<std::shared_ptr<CopyOp>> copies;   // device <-> host backups to submit
    std::vector<std::shared_ptr<CopyOp>> storage;  // prefetches and stores to submit
    std::vector<OwnedEvent> events;
    bool empty() const { return copies.empty() && storage.empty() && events.empty(); }
  };

  // The mutex with an owner record, so tests can ask whether the calling thread holds it.
  class Lock {
   public:
    explicit Lock(const Impl& impl) : impl_(impl), lk_(impl.mu) { Own(); }
    ~Lock() {
      if (lk_.owns_lock()) impl_.owner.store(std::thread::id(), std::memory_order_relaxed);
    }
    void unlock() {
      impl_.owner.store(std::thread::id(), std::memory_order_relaxed);
      lk_.unlock();
    }
    void lock() {
      lk_.lock();
      Own();
    }

   private:
    void Own() { impl_.owner.store(std::this_thread::get_id(), std::memory_order_relaxed); }
    const Impl& impl_;
    std::unique_lock<std::mutex> lk_;
  };

  const HierarchicalCacheConfig config;
  const int64_t P;
  const uint64_t tag;
  KvRegion device;
  std::unique_ptr<HostTier> host;  // null: no host tier (config.has_host_tier())
  KvRegion no_host_region;         // host_region() without a host tier: empty
  std::unique_ptr<TransferEngine> engine;
  bool gpu = false;
  CudaStreamHandle backup_stream;  // GPU only
  std::shared_ptr<StorageBackend> storage;
  bool owns_storage = false;                      // opened from a URL: closed with the cache
  std::unique_ptr<storage::PageStaging> staging;  // host pages <-> storage calls

  mutable std::mutex mu;
  mutable std::atomic<std::thread::id> owner{};
  RadixTree tree;
  std::unique_ptr<DevicePageLedger> ledger;
  CopyTracker tracker;
  // Completed operations taken from the tracker by Reap and not reaped yet (null once reaped).
  // A split while Reap runs (ReapStore splits) must find their busy nodes too: see SetSplitHook.
  std::vector<std::shared_ptr<CopyOp>> reaping;
  std::unordered_map<uint64_t, Handle> handles;
  uint64_t next_seq = 1;
  int64_t filling_pages = 0;      // host pages of prefetches not yet handed to the tree
  int64_t store_queue_pages = 0;  // host -> storage pages queued or running
  Status health;                  // an internal failure makes the cache unusable
  Status backup_failure;          // the first failed backup since WaitForBackups last said so
  CacheStats counters;

  std::unique_ptr<util::ThreadPool> pool;  // cpu backups; destroyed first (joins its workers)

  // ---- small helpers; REQUIRE mu held -------------------------------------------------------
  Status CheckHealth() const {
    if (health.ok()) return Status::OK();
    return Status::FailedPrecondition(
        fmt::format("the cache is unusable after an internal failure: {}", health.ToString()));
  }

  void Fail(Status st, std::string_view what) {
    if (st.ok() || !health.ok()) return;
    health = st.WithContext(what);
    util::Log(util::LogLevel::kError, "kvtier: cache: {}", health.ToString());
  }

  Result<Handle*> FindHandle(MatchHandle handle) {
    if ((handle.id >> kHandleSeqBits) != tag) {
      return Status::InvalidArgument(fmt::format(
          "handle {} is not live: it belongs to another HierarchicalCache instance or was never "
          "issued",
          handle.id));
    }
    auto it = handles.find(handle.id);
    if (it == handles.end()) {
      return Status::InvalidArgument(
          fmt::format("handle {} is not live (never issued, or already released)", handle.id));
    }
    return &it->second;
  }

  MatchHandle NewHandle(Handle h) {
    MatchHandle out{(tag << kHandleSeqBits) | next_seq++};
    handles.emplace(out.id, std::move(h));
    return out;
  }

  static std::vector<RadixNode*> Path(RadixNode* last) {
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

  void Event(Work* work, CacheTier tier, const RadixNode* node, bool kept_in_host,
             bool kept_in_storage) {
    if (!config.eviction_listener) return;
    work->events.push_back(OwnedEvent{tier, node->name_space(), tree.PrefixTokens(node),
                                      node->num_tokens(), kept_in_host, kept_in_storage});
  }

  void FreeHost(std::span<const int64_t> pages) {
    if (pages.empty()) return;
    Status st = host->Release(pages);
    if (!st.ok()) Fail(Status::Internal(st.ToString()), "releasing host pages");
  }
  // Pages a backup was given and did not use (or that its failed copy wrote): those it was to
  // write are abandoned, those published already released.
  void ReturnBackupPages(std::span<const int64_t> pages, const std::vector<int64_t>& written) {
    std::vector<int64_t> abandon, release;
    for (int64_t p : pages) {
      (std::find(written.begin(), written.end(), p) != written.end() ? abandon : release)
          .push_back(p);
    }
    if (!abandon.empty()) {
      Status st = host->Abandon(abandon);
      if (!st.ok()) Fail(Status::Internal(st.ToString()), "abandoning host pages");
    }
    FreeHost(release);
  }

  void FreeDevice(std::span<const int64_t> pages) { Fail(ledger->Free(pages), "device pages"); }

  int64_t PageBytes() const {
    return device.num_buffers() * device.geometry.num_layers * device.geometry.slot_bytes * P;
  }

  // ---- busy marks ---------------------------------------------------------------------------
  void MarkBusy(CopyOp& op, RadixNode* n) {
    tree.AddBusy(n);
    op.nodes.push_back(n);
  }
  void ClearBusy(CopyOp& op) {
    for (RadixNode* n : op.nodes) tree.RemoveBusy(n);
    op.nodes.clear();
  }

  // ---- eviction (page-granular) -------------------------------------------------------------
  // Removes `node` and its subtree when it is resident nowhere any more (its children can only
  // be storage-only or orphans then).
  void DropIfNowhere(RadixNode* node) {
    if (node->resident() || node->ref_count() > 0 || node->busy() > 0) return;
    int64_t forgotten = 0;
    tree.RemoveSubtree(node, &forgotten);
    counters.storage_forgotten_tokens += forgotten;
  }

  // Frees at least `need` device pages if it can; returns the pages freed now. Under write_back,
  // unbacked leaves are submitted for backup instead (added to `work`); they become evictable
  // once the copy has completed.
  int64_t EvictDevice(int64_t need, Work* work) {
    const auto start = Clock::now();
    int64_t freed = 0;
    std::vector<int64_t> frees;  // one ledger call per eviction; no regrowth while it fills
    frees.reserve(static_cast<size_t>(std::clamp<int64_t>(need, 0, ledger->num_pages())));
    while (freed < need && health.ok()) {
      RadixNode* v = tree.DeviceVictim();
      if (v == nullptr) break;
      tree.PrefetchDeviceVictims();
      const int64_t pages = v->num_tokens() / P;
      const int64_t take = std::min(pages, need - freed);
      if (!v->on_host() && config.write_policy == WritePolicy::kWriteBack) {
        // The whole unbacked path goes to host memory first (host copies form a prefix).
        if (Backup(v, work, /*write_back=*/true)) continue;  // v is busy now
      }
      v = tree.SplitAfter(v, pages - take);
      const int64_t n = v->num_tokens();
      const bool kept_in_host = v->on_host();
      Event(work, CacheTier::kDevice, v, kept_in_host, false);
      if (!kept_in_host) {
        counters.dropped_tokens += n;
        if (!tree.DropDeviceLeaf(v, &frees)) {  // the common case in one step
          tree.TakeDevicePages(v, &frees);
          DropIfNowhere(v);
        }
      } else {
        tree.TakeDevicePages(v, &frees);
      }
      freed += take;
      counters.device_evicted_tokens += n;
      ++counters.device_evictions;
    }
    FreeDevice(frees);
    CountEviction(start, freed);
    return freed;
  }

  // Frees at least `need` host pages if it can; returns the pages freed now. Under write_back
  // with a storage tier, unstored leaves are submitted for a store instead.
  int64_t EvictHost(int64_t need, Work* work) {
    if (!host) return 0;
    const auto start = Clock::now();
    int64_t freed = 0;
    while (freed < need && health.ok()) {
      RadixNode* v = tree.HostVictim();
      if (v == nullptr) break;
      const int64_t pages = v->num_tokens() / P;
      const int64_t take = std::min(pages, need - freed);
      if (!v->stored() && storage && config.write_policy == WritePolicy::kWriteBack &&
          !v->storing()) {
        if (Store(v, work)) continue;  // v is busy now; evictable once stored
      }
      v = tree.SplitAfter(v, pages - take);
      const int64_t n = v->num_tokens();
      const bool kept = v->stored();
      Event(work, CacheTier::kHost, v, false, kept);
      FreeHost(tree.TakeHostPages(v));
      DropIfNowhere(v);
      freed += take;
      counters.host_evicted_tokens += n;
      ++counters.host_evictions;
    }
    CountEviction(start, freed);
    return freed;
  }

  void CountEviction(Clock::time_point start, int64_t freed_pages) {
    const double seconds = SecondsSince(start);
    counters.eviction_seconds += seconds;
    if (freed_pages > 0) counters.eviction_duration.Observe(seconds);
  }

  // Keeps the storage-only part of the tree within its bound; orphans go at once.
  void TrimStorage(Work* work) {
    const int64_t limit = config.storage.max_storage_only_pages * P;
    for (;;) {
      RadixNode* v = tree.StorageVictim();
      if (v == nullptr) return;
      if (v->stored() && tree.storage_only_tokens() <= limit) return;
      if (v->stored()) Event(work, CacheTier::kStorage, v, false, false);
      int64_t forgotten = 0;
      tree.RemoveSubtree(v, &forgotten);
      counters.storage_forgotten_tokens += forgotten;
    }
  }

  // Host pages that eviction could free now (an upper bound: pins and busy nodes excluded).
  int64_t HostReclaimable() const {
    return host->free_pages() + (tree.host_tokens() - tree.locked_host_tokens()) / P;
  }
  // Device pages eviction could free once the copies in flight have completed (pins and the
  // engine's pages excluded).
  int64_t DeviceReclaimable() const {
    return ledger->free_pages() + (tree.device_tokens() - tree.pinned_device_tokens()) / P;
  }

  // `pages` free host pages if eviction can make them (nothing is evicted when it cannot).
  bool EnsureHostPages(int64_t pages, Work* work) {
    const int64_t free = host->free_pages();
    if (free >= pages) return true;
    if (HostReclaimable() < pages) return false;
    EvictHost(pages - free, work);
    return host->free_pages() >= pages;
  }

  // ---- backups --------------------------------------------------------------------------------
  // Device -> host for the unbacked path ending at `node`: host pages assigned now (so nothing
  // else takes them), the nodes busy until the copy has completed. False (nothing changed, no
  // host node evicted) when host memory cannot be found. Shared host tier: pages are reserved by
  // key; pages published already are taken without a copy; the backup covers the leading pages
  // the tier gave (the node where they end is split), the rest is skipped (counted).
  bool Backup(RadixNode* node, Work* work, bool write_back) {
    if (!host) return false;  // no host tier: nothing to back up to
    std::vector<RadixNode*> path;
    for (RadixNode* n = node; !n->is_root() && !n->on_host(); n = n->parent()) {
      if (n->busy() > 0 || !n->on_device()) return false;
      path.push_back(n);
    }
    if (path.empty()) return false;
    std::reverse(path.begin(), path.end());
    int64_t tokens = 0;
    for (RadixNode* n : path) tokens += n->num_tokens();
    const int64_t pages = tokens / P;
    if (!EnsureHostPages(pages, work)) {
      counters.backup_skipped_tokens += tokens;
      return false;
    }
    std::vector<PageKey> keys;
    if (host->shared()) {
      for (RadixNode* n : path) {
        if (static_cast<int64_t>(n->keys().size()) * P != n->num_tokens()) return false;
        keys.insert(keys.end(), n->keys().begin(), n->keys().end());
      }
    }
    Result<std::vector<HostTier::Page>> got = host->Acquire(pages, keys);
    if (!got.ok()) {
      util::Log(util::LogLevel::kWarning, "kvtier: cache: backup skipped: {}",
                got.status().ToString());
      counters.backup_skipped_tokens += tokens;
      return false;
    }
    // The leading pages the tier gave; the others go back.
    int64_t keep = 0;
    while (keep < pages && ((*got)[static_cast<size_t>(keep)].got == HostTier::Got::kWrite ||
                            (*got)[static_cast<size_t>(keep)].got == HostTier::Got::kReady)) {
      ++keep;
    }
    std::vector<int64_t> host_pages, written, unused, unused_written;
    for (int64_t i = 0; i < pages; ++i) {
      const HostTier::Page& pg = (*got)[static_cast<size_t>(i)];
      if (pg.got != HostTier::Got::kWrite && pg.got != HostTier::Got::kReady) continue;
      (i < keep ? host_pages : unused).push_back(pg.start);
      if (pg.got == HostTier::Got::kWrite) {
        (i < keep ? written : unused_written).push_back(pg.start);
      }
    }
    ReturnBackupPages(unused, unused_written);
    counters.backup_skipped_tokens += (pages - keep) * P;
    if (keep == 0) return false;
    if (keep < pages) {  // the path ends where the kept pages end
      int64_t acc = 0;
      for (size_t i = 0; i < path.size(); ++i) {
        const int64_t np = path[i]->num_tokens() / P;
        if (acc + np <= keep) {
          acc += np;
          continue;
        }
        if (keep > acc) {
          path[i] = tree.SplitAfter(path[i], keep - acc)->parent();
          path.resize(i + 1);
        } else {
          path.resize(i);
        }
        break;
      }
    }
    auto op = std::make_shared<CopyOp>();
    op->kind = CopyOp::Kind::kBackup;
    op->gpu = gpu;
    op->tokens = static_cast<int64_t>(written.size()) * P;
    op->bytes = static_cast<int64_t>(written.size()) * PageBytes();
    op->start = Clock::now();
    op->pages = written;
    op->write_back = write_back;
    const bool copy_all = written.size() == host_pages.size();
    if (copy_all) AppendSlots(host_pages, &op->dst);
    size_t off = 0;
    for (RadixNode* n : path) {
      const size_t np = n->device_pages().size();
      if (copy_all) {
        AppendSlots(n->device_pages(), &op->src);
      } else {
        for (size_t i = 0; i < np; ++i) {
          if ((*got)[off + i].got != HostTier::Got::kWrite) continue;
          AppendSlots(n->device_pages().subspan(i, 1), &op->src);
          AppendSlots(std::span<const int64_t>(host_pages).subspan(off + i, 1), &op->dst);
        }
      }
      tree.SetHostPages(
          n, std::vector<int64_t>(host_pages.begin() + static_cast<ptrdiff_t>(off),
                                  host_pages.begin() + static_cast<ptrdiff_t>(off + np)));
      off += np;
    }
    counters.backup_present_tokens += keep * P - op->tokens;
    if (written.empty()) return true;  // every page was published already: nothing to copy
    for (RadixNode* n : path) MarkBusy(*op, n);
    counters.backup_inflight_tokens += op->tokens;
    tracker.Add(op);
    work->copies.push_back(std::move(op));
    return true;
  }

  void MaybeBackup(const std::vector<RadixNode*>& path, Work* work) {
    if (!host || config.write_policy == WritePolicy::kWriteBack) return;
    const int64_t threshold =
        config.write_policy == WritePolicy::kWriteThrough ? 1 : config.write_through_threshold;
    for (auto it = path.rbegin(); it != path.rend(); ++it) {
      RadixNode* n = *it;
      if (n->on_device() && !n->on_host() && n->hit_count() >= threshold) {
        Backup(n, work, /*write_back=*/false);
        return;
      }
    }
  }

  // Host -> storage for the unstored host path ending at `node` (only pages storage does not
  // hold: the tree's `stored` marks, then the backend's Exists). False when nothing was queued
  // (nothing to store, the queue is full — counted — or a node on the path is busy).
  bool Store(RadixNode* node, Work* work) {
    if (!storage) return false;
    std::vector<RadixNode*> path;
    for (RadixNode* n = node; !n->is_root(); n = n->parent()) {
      if (!n->on_host()) return false;  // host copies form a prefix: cannot happen
      if (n->stored()) break;
      if (n->storing() || n->busy() > 0 || n->keys().empty()) return false;
      path.push_back(n);
    }
    if (path.empty()) return false;
    std::reverse(path.begin(), path.end());
    int64_t tokens = 0;
    for (RadixNode* n : path) tokens += n->num_tokens();
    const int64_t pages = tokens / P;
    if (store_queue_pages + pages > config.storage.max_backup_queue_pages ||
        pages > config.storage.max_backup_batch_pages) {
      counters.storage_backup_dropped_tokens += tokens;
      ++counters.storage_queue_drops;
      return false;
    }
    auto op = std::make_shared<CopyOp>();
    op->kind = CopyOp::Kind::kStore;
    op->tokens = tokens;
    op->start = Clock::now();
    op->batch_pages = pages;
    for (RadixNode* n : path) {
      for (size_t i = 0; i < n->host_pages().size(); ++i) {
        op->pages.push_back(n->host_pages()[i]);
        op->keys.push_back(n->keys()[i]);
      }
      tree.SetStoring(n, true);  // its host pages stay put (the device copy may still go)
      op->nodes.push_back(n);
    }
    op->page_status.assign(static_cast<size_t>(pages), PageStatus::kSkipped);
    op->batch_done.assign(1, 0);
    op->batches_left = 1;
    store_queue_pages += pages;
    counters.storage_backup_inflight_tokens += tokens;
    tracker.Add(op);
    work->storage.push_back(std::move(op));
    return true;
  }

  // ---- completions (Reap) -----------------------------------------------------------------------
  void Reap(Work* work) {
    if (gpu) ledger->PruneWriteFences();
    reaping = tracker.TakeDone();
    for (auto& entry : reaping) {
      const std::shared_ptr<CopyOp> op = std::move(entry);
      switch (op->kind) {
        case CopyOp::Kind::kBackup:
          ReapBackup(*op, work);
          break;
        case CopyOp::Kind::kLoad:
          ReapLoad(*op);
          break;
        case CopyOp::Kind::kPrefetch:
          if (!op->concluded) {
            tracker.Add(op);  // its handle takes the result; it stays accounted until then
          } else {
            FreeHost(op->free_on_completion);
            filling_pages -= static_cast<int64_t>(op->free_on_completion.size());
            op->free_on_completion.clear();
          }
          break;
        case CopyOp::Kind::kStore:
          ReapStore(*op, work);
          break;
      }
    }
    reaping.clear();
  }

  void ReapBackup(CopyOp& op, Work* work) {
    counters.backup_inflight_tokens -= op.tokens;
    if (op.status.ok()) {
      Status published = host->Publish(op.pages);
      if (!published.ok()) Fail(Status::Internal(published.ToString()), "publishing a backup");
      counters.backup_tokens += op.tokens;
      counters.backup_bytes += op.bytes;
      counters.backup_seconds += SecondsSince(op.start, op.finished);
      if (op.write_back) counters.write_back_tokens += op.tokens;
      std::vector<RadixNode*> nodes = op.nodes;
      ClearBusy(op);
      if (storage && config.write_policy != WritePolicy::kWriteBack && !nodes.empty()) {
        RadixNode* deepest = *std::max_element(nodes.begin(), nodes.end(),
                                               [](const RadixNode* a, const RadixNode* b) {
                                                 return a->prefix_tokens() < b->prefix_tokens();
                                               });
        Store(deepest, work);
      }
      return;
    }
    // Failed: take back the host pages it was given (deepest first); it never counted.
    counters.backup_failed_tokens += op.tokens;
    if (backup_failure.ok()) backup_failure = op.status.WithContext("backup copy");
    util::Log(util::LogLevel::kWarning, "kvtier: cache: {}",
              op.status.WithContext("backup copy").ToString());
    std::vector<RadixNode*> nodes = op.nodes;
    ClearBusy(op);
    std::sort(nodes.begin(), nodes.end(), [](const RadixNode* a, const RadixNode* b) {
      return a->prefix_tokens() > b->prefix_tokens();
    });
    for (RadixNode* n : nodes) {
      if (!n->on_host()) continue;
      if (n->host_children() > 0) {
        Fail(Status::Internal(fmt::format("node {}: its failed backup has host children", n->id())),
             "rolling back a failed backup");
        return;
      }
      ReturnBackupPages(tree.TakeHostPages(n), op.pages);
      DropIfNowhere(n);
    }
  }

  // A failed load-back published nothing (LoadBack returned the error); its pages come back now
  // that nothing writes them any more, and the cache stays usable (a sticky device error fails
  // the next GPU call on its own).
  void ReapLoad(CopyOp& op) {
    if (op.gpu && op.status.ok()) {
      // The copy's time on the device to completion (its events), else (no timing event) the
      // time until its completion was seen.
      double seconds = SecondsSince(op.start, op.finished);
      if (op.begin.get() != nullptr) {
        if (Result<float> ms = op.event.ElapsedMsSince(op.begin); ms.ok()) seconds = *ms / 1e3;
      }
      counters.load_back_seconds += seconds;
      counters.load_back_duration.Observe(seconds);
    }
    ClearBusy(op);
    FreeDevice(op.free_on_completion);
    op.free_on_completion.clear();
    if (!op.status.ok()) {
      util::Log(util::LogLevel::kWarning, "kvtier: cache: {}",
                op.status.WithContext("load-back copy").ToString());
    }
  }

  void ReapStore(CopyOp& op, Work* work) {
    const int64_t pages = static_cast<int64_t>(op.keys.size());
    store_queue_pages -= pages;
    counters.storage_backup_inflight_tokens -= op.tokens;
    int64_t ok = 0;
    while (ok < pages && op.page_status[static_cast<size_t>(ok)] == PageStatus::kOk) ++ok;
    const int64_t written = std::max<int64_t>(0, ok - op.present_pages);
    counters.storage_backup_present_tokens += std::min(op.present_pages, ok) * P;
    counters.storage_backup_tokens += written * P;
    counters.storage_backup_bytes += written * PageBytes();
    const double seconds = SecondsSince(op.start, op.finished);
    counters.storage_backup_seconds += seconds;
    if (written > 0 && seconds > 0) {
      counters.storage_backup_bandwidth.Observe(static_cast<double>(written * PageBytes()) /
                                                seconds / 1e9);
    }
    counters.storage_backup_failed_tokens += (pages - ok) * P;
    CountStorageFaults(op.page_status, op.status);
    // Mark stored the nodes (or the leading part of the node) whose pages all made it.
    std::vector<RadixNode*> nodes = std::move(op.nodes);
    std::sort(nodes.begin(), nodes.end(), [](const RadixNode* a, const RadixNode* b) {
      return a->prefix_tokens() < b->prefix_tokens();
    });
    int64_t left = ok;
    for (RadixNode* n : nodes) {
      tree.SetStoring(n, false);
    }
    for (RadixNode* n : nodes) {
      const int64_t np = n->num_tokens() / P;
      if (left <= 0) break;
      if (left >= np) {
        tree.SetStored(n, true);
        left -= np;
      } else {
        RadixNode* lower = tree.SplitAfter(n, left);
        tree.SetStored(lower->parent(), true);
        left = 0;
      }
    }
    (void)work;
  }

  // REQUIRES: `statuses` and `status` are not being written (a completed op, or a snapshot).
  void CountStorageFaults(const std::vector<PageStatus>& statuses, const Status& status) {
    for (PageStatus s : statuses) {
      switch (s) {
        case PageStatus::kCorrupt:
        case PageStatus::kWrongNamespace:
          ++counters.storage_corrupt_pages;
          break;
        case PageStatus::kTimedOut:
          ++counters.storage_timeouts;
          break;
        case PageStatus::kFailed:
          ++counters.storage_errors;
          break;
        default:
          break;
      }
    }
    if (!status.ok()) {
      ++counters.storage_errors;
      if (status.code() == StatusCode::kUnavailable) ++counters.storage_queue_drops;
    }
  }

  // ---- prefetch conclusion ----------------------------------------------------------------------
  // Ends the handle's prefetch: the arrived prefix becomes host pages of its nodes, pages that
  // storage reported missing or corrupt make their nodes orphans, the rest is cancelled (pages of
  // batches still running are freed when they complete).
  PrefetchResult Conclude(Handle& h, bool cancelled, Work* work) {
    std::shared_ptr<CopyOp> op = std::move(h.prefetch);
    h.prefetch.reset();
    PrefetchResult out;
    out.policy = h.prefetch_policy;
    out.requested_tokens = op->tokens;
    std::vector<PageStatus> statuses;
    std::vector<uint8_t> batches;
    Status status;
    tracker.Snapshot(*op, &statuses, &batches, &status);
    const int64_t total = static_cast<int64_t>(statuses.size());
    auto batch_done = [&](int64_t page) {
      return batches[static_cast<size_t>(page / op->batch_pages)] != 0;
    };
    int64_t arrived = 0;
    while (arrived < total && batch_done(arrived) &&
           statuses[static_cast<size_t>(arrived)] == PageStatus::kOk) {
      ++arrived;
    }
    // The first page that is known to be gone (absent or corrupt) from storage, if any.
    int64_t gone_from = -1;
    if (arrived < total && batch_done(arrived)) {
      const PageStatus s = statuses[static_cast<size_t>(arrived)];
      if (s == PageStatus::kAbsent || s == PageStatus::kCorrupt ||
          s == PageStatus::kWrongNamespace) {
        gone_from = arrived;
      }
    }
    // Hand arrived pages to their nodes, top-down, while the host prefix stays contiguous.
    std::vector<RadixNode*> nodes = op->nodes;
    std::sort(nodes.begin(), nodes.end(), [](const RadixNode* a, const RadixNode* b) {
      return a->prefix_tokens() < b->prefix_tokens();
    });
    ClearBusy(*op);
    for (RadixNode* n : nodes) tree.SetPrefetching(n, false);
    std::vector<int64_t> to_free;
    int64_t pos = 0;  // page index into op->pages
    int64_t used = 0;
    for (RadixNode* n : nodes) {
      if (pos >= total) break;
      const int64_t np = n->num_tokens() / P;
      const int64_t have = std::clamp<int64_t>(arrived - pos, 0, np);
      if (gone_from >= pos && gone_from < pos + np) {
        // From this node's page (gone_from - pos) on, storage no longer has the prefix.
        const int64_t keep = gone_from - pos;
        if (keep > 0) tree.SplitAfter(n, keep);  // n keeps its identity as the lower part
        MarkGone(n);
        if (keep > 0) n = n->parent();
      }
      if (have > 0) {
        RadixNode* target = n;
        if (have < n->num_tokens() / P) target = tree.SplitAfter(n, have)->parent();
        const bool parent_ok = target->parent()->is_root() || target->parent()->on_host();
        std::vector<int64_t> slice(op->pages.begin() + pos, op->pages.begin() + pos + have);
        if (!target->on_host() && parent_ok) {
          tree.SetHostPages(target, std::move(slice));
          used += have;
        } else {
          to_free.insert(to_free.end(), slice.begin(), slice.end());
          arrived = pos;  // the prefix ends here
        }
      }
      pos += np;
      if (have < np) break;
    }
    // Pages not handed over: freed now when their batch completed, else on completion.
    for (int64_t i = used; i < total; ++i) {
      if (std::find(to_free.begin(), to_free.end(), op->pages[static_cast<size_t>(i)]) !=
          to_free.end())
        continue;
      if (batch_done(i)) {
        to_free.push_back(op->pages[static_cast<size_t>(i)]);
      } else {
        op->free_on_completion.push_back(op->pages[static_cast<size_t>(i)]);
      }
    }
    FreeHost(to_free);
    filling_pages -= total - static_cast<int64_t>(op->free_on_completion.size());
    op->concluded = true;
    CountStorageFaults(statuses, status);  // the snapshot: batches may still be completing
    out.arrived_tokens = used * P;
    counters.prefetched_tokens += used * P;
    counters.prefetch_bytes += used * PageBytes();
    const double seconds = SecondsSince(op->start);
    counters.prefetch_seconds += seconds;
    if (used > 0 && seconds > 0) {
      counters.prefetch_bandwidth.Observe(static_cast<double>(used * PageBytes()) / seconds / 1e9);
    }
    const bool past_deadline = Clock::now() >= op->deadline;
    if (used == total) {
      out.state = PrefetchState::kComplete;
      ++counters.prefetch_complete;
    } else if (h.prefetch_policy == PrefetchPolicy::kTimeout && past_deadline && !cancelled &&
               gone_from < 0) {
      out.state = PrefetchState::kTimedOut;
      ++counters.prefetch_timed_out;
      ++counters.storage_timeouts;
    } else {
      out.state = PrefetchState::kPartial;
      ++counters.prefetch_partial;
    }
    if (cancelled) ++counters.prefetch_cancelled;
    out.host_tokens = HostTokensOf(h);
    TrimStorage(work);
    return out;
  }

  // The node and its storage-only descendants lose their storage copy (storage reported it
  // gone): orphans, removed once unpinned.
  void MarkGone(RadixNode* node) {
    std::vector<RadixNode*> stack = {node};
    while (!stack.empty()) {
      RadixNode* n = stack.back();
      stack.pop_back();
      tree.SetStored(n, false);
      n->ForEachChild([&](RadixNode* c) {
        if (!c->on_device() && !c->on_host()) stack.push_back(c);
      });
    }
  }

  int64_t HostTokensOf(const Handle& h) const {
    int64_t t = 0;
    for (RadixNode* n : Path(h.last)) {
      if (n->on_device()) continue;
      if (!n->on_host()) break;
      t += n->num_tokens();
    }
    return t;
  }

  PrefetchResult Progress(Handle& h) {
    PrefetchResult out;
    out.policy = h.prefetch_policy;
    out.host_tokens = HostTokensOf(h);
    if (!h.prefetch) return out;
    out.state = PrefetchState::kRunning;
    out.requested_tokens = h.prefetch->tokens;
    out.arrived_tokens = tracker.ArrivedPages(*h.prefetch) * P;
    return out;
  }

  // ---- shared host tier: pages other processes published --------------------------------------
  // Where the tree's match of `tokens` ends (in whole pages) and the key of the page before that
  // point (the namespace's chain seed at the start): what Match hashes the rest of the prompt
  // from. At the start when a node on the way lacks its keys.
  void MatchedChain(std::string_view ns, std::span<const Token> tokens, int64_t* pages,
                    std::optional<PageKey>* previous) const {
    const RadixTree::MatchResult peek = tree.Peek(ns, tokens);
    *pages = peek.matched_tokens / P;
    if (*pages > 0) {
      const RadixNode* last = peek.last;
      const int64_t index = *pages - 1 - (last->prefix_tokens() - last->num_tokens()) / P;
      if (index >= 0 && index < static_cast<int64_t>(last->keys().size())) {
        *previous = last->keys()[static_cast<size_t>(index)];
        return;
      }
    }
    *pages = 0;
    *previous = ChainSeed(ns);
  }

  // The pages after the host part of the tree's match `r` that the shared tier holds under their
  // keys, pinned (at most what host eviction could make room for): device-only nodes at the end
  // of the match take theirs as host copies (a backup with nothing to copy), the pages after the
  // match become a host-only leaf, and `r` then ends at the leaf. `tail`: the keys of the pages
  // of `tokens` from page `tail_from` on (the match's end when Match peeked). Returns the tokens
  // the match gained.
  int64_t AdoptShared(RadixTree::MatchResult* r, std::string_view ns, std::span<const Token> tokens,
                      std::span<const PageKey> tail, int64_t tail_from) {
    // The device-only nodes at the end of the match, top-down, and where host memory ends.
    std::vector<RadixNode*> bare;
    RadixNode* top = r->last;
    for (; !top->is_root() && !top->on_host(); top = top->parent()) {
      if (!top->on_device() || top->busy() > 0) return 0;
      bare.push_back(top);
    }
    std::reverse(bare.begin(), bare.end());
    const int64_t matched = r->matched_tokens / P;
    // The match shrank since the peek (evictions meanwhile): no keys for the pages it lost.
    if (matched < tail_from) return 0;
    // Keys from where host memory ends: the bare nodes' own, then the tail's.
    std::vector<PageKey> keys;
    for (const RadixNode* d : bare) {
      if (static_cast<int64_t>(d->keys().size()) * P != d->num_tokens()) return 0;
      keys.insert(keys.end(), d->keys().begin(), d->keys().end());
    }
    const size_t bare_pages = keys.size();
    keys.insert(keys.end(), tail.begin() + (matched - tail_from), tail.end());
    if (keys.empty()) return 0;
    Result<std::vector<int64_t>> found = host->FindPrefix(keys, HostReclaimable());
    if (!found.ok()) {
      util::Log(util::LogLevel::kWarning, "kvtier: cache: shared host lookup: {}",
                found.status().ToString());
      return 0;
    }
    const std::vector<int64_t>& pages = *found;
    size_t used = 0;
    for (RadixNode* d : bare) {
      const size_t np = static_cast<size_t>(d->num_tokens() / P);
      const size_t have = std::min(np, pages.size() - used);
      if (have == 0) break;
      RadixNode* target = have < np ? tree.SplitAfter(d, static_cast<int64_t>(have))->parent() : d;
      tree.SetHostPages(target,
                        std::vector<int64_t>(pages.begin() + static_cast<ptrdiff_t>(used),
                                             pages.begin() + static_cast<ptrdiff_t>(used + have)));
      used += have;
      counters.backup_present_tokens += static_cast<int64_t>(have) * P;
      if (have < np) break;
    }
    int64_t adopted = 0;
    if (used == bare_pages && used < pages.size()) {
      const size_t n = pages.size() - used;
      RadixNode* leaf = tree.AddHostLeaf(
          r->last->is_root() ? nullptr : r->last, ns,
          tokens.subspan(static_cast<size_t>(matched * P), n * static_cast<size_t>(P)),
          std::span<const PageKey>(keys).subspan(used, n),
          std::vector<int64_t>(pages.begin() + static_cast<ptrdiff_t>(used), pages.end()));
      if (leaf != nullptr) {
        adopted = static_cast<int64_t>(n) * P;
        used = pages.size();
        r->last = leaf;
        r->matched_tokens += adopted;
        r->host_tokens += adopted;
      }
    }
    FreeHost(std::span<const int64_t>(pages).subspan(used));  // found, but nowhere to go
    return adopted;
  }

  // ---- after the lock -------------------------------------------------------------------------
  Status RunCopy(const CopyOp& op, CudaStream stream) {
    const bool to_host = op.kind == CopyOp::Kind::kBackup;
    const KvRegion& src = to_host ? device : host->region();
    const KvRegion& dst = to_host ? host->region() : device;
    return engine->Transfer(
        TransferRequest::AllLayers(src, dst, SlotIndices::Host(op.src), SlotIndices::Host(op.dst)),
        TransferOptions{stream, op.layer_events.get()});
  }

  // GPU: enqueues `op` on `stream` after the engine's pending writes; the op completes through
  // its event. A failure after part of the copy may have been enqueued still records the event
  // (or synchronises the stream), so the op completes only when nothing writes any more.
  void SubmitGpu(CopyOp& op, CudaStream stream,
                 const std::vector<std::shared_ptr<CudaEventHandle>>& fences) {
    Status st;
    for (const auto& f : fences) {
      st = f->WaitOn(stream);
      if (!st.ok()) break;
    }
    const bool timed = op.kind == CopyOp::Kind::kLoad;
    if (st.ok() && timed) {
      Result<CudaEventHandle> begin = CudaEventHandle::Create(device.device, /*timing=*/true);
      if (begin.ok() && begin->Record(stream).ok()) op.begin = std::move(*begin);
    }
    if (st.ok()) st = RunCopy(op, stream);
    Result<CudaEventHandle> ev = CudaEventHandle::Create(device.device, /*timing=*/timed);
    Status rec = ev.ok() ? ev->Record(stream) : ev.status();
    if (rec.ok()) {
      op.event = std::move(*ev);
      tracker.MarkSubmitted(op, std::move(st));
      return;
    }
    Status sync = engine->Synchronize(stream);
    tracker.Complete(op, !st.ok() ? std::move(st) : !rec.ok() ? std::move(rec) : std::move(sync));
  }

  void SubmitStorage(const std::shared_ptr<CopyOp>& op) {
    CopyTracker* tr = &tracker;
    StorageBackend* backend = storage.get();
    storage::PageStaging* pages = staging.get();
    if (op->kind == CopyOp::Kind::kPrefetch) {
      const int64_t n = static_cast<int64_t>(op->keys.size());
      for (int64_t b = 0; b * op->batch_pages < n; ++b) {
        const int64_t from = b * op->batch_pages;
        const int64_t to = std::min(n, from + op->batch_pages);
        std::vector<PageKey> keys(op->keys.begin() + from, op->keys.begin() + to);
        const auto starts = std::span(op->pages).subspan(from, to - from);
        pages->GetAsync(*backend, std::move(keys), starts, [tr, op, b](BatchResult r) {
          tr->CompleteBatch(*op, b, r.status, r.pages);
        });
      }
      return;
    }
    // kStore: Exists first; write only what storage does not hold.
    backend->ExistsAsync(op->keys, [tr, op, backend, pages](ExistsResult e) {
      const int64_t n = static_cast<int64_t>(op->keys.size());
      const int64_t present = e.status.ok() ? std::clamp<int64_t>(e.leading, 0, n) : 0;
      tr->SetPresent(*op, present);
      if (present == n) {
        tr->CompleteBatch(*op, 0, Status::OK(),
                          std::vector<PageStatus>(static_cast<size_t>(n), PageStatus::kOk));
        return;
      }
      std::vector<PageKey> keys(op->keys.begin() + present, op->keys.end());
      pages->SetAsync(*backend, std::move(keys), std::span(op->pages).subspan(present),
                      [tr, op, present, n](BatchResult r) {
                        std::vector<PageStatus> all(static_cast<size_t>(n), PageStatus::kOk);
                        for (size_t i = 0;
                             i < r.pages.size() && present + static_cast<int64_t>(i) < n; ++i) {
                          all[static_cast<size_t>(present) + i] = r.pages[i];
                        }
                        if (!r.status.ok()) {
                          for (int64_t i = present; i < n; ++i)
                            all[static_cast<size_t>(i)] = PageStatus::kSkipped;
                        }
                        tr->CompleteBatch(*op, 0, r.status, all);
                      });
    });
  }

  // Runs what a call collected, without the mutex. Inline copies (backup_threads = 0) complete
  // here, and their follow-ups (stores after backups) run in the same call.
  void RunWork(Work& work) {
    for (int round = 0; !work.empty(); ++round) {
      bool inline_done = false;
      std::vector<std::shared_ptr<CudaEventHandle>> fences;
      if (gpu && !work.copies.empty()) {
        Lock lk(*this);
        fences = ledger->write_fences();
      }
      for (auto& op : work.copies) {
        if (gpu) {
          SubmitGpu(*op, backup_stream.get(), fences);
        } else if (pool) {
          pool->Post([this, op] { tracker.Complete(*op, RunCopy(*op, nullptr)); });
        } else {
          tracker.Complete(*op, RunCopy(*op, nullptr));
          inline_done = true;
        }
      }
      for (auto& op : work.storage) SubmitStorage(op);
      std::vector<OwnedEvent> events;
      events.swap(work.events);
      work.copies.clear();
      work.storage.clear();
      for (const OwnedEvent& e : events) {
        config.eviction_listener(EvictionEvent{e.tier, e.name_space, e.prefix, e.num_tokens,
                                               e.kept_in_host, e.kept_in_storage});
      }
      if (inline_done) {
        Lock lk(*this);
        Reap(&work);
      }
    }
  }

  // ---- device allocation --------------------------------------------------------------------
  // `pages` device pages for `owner`, evicting first what must go. With allow_fewer, as many as
  // can be had. OutOfMemory naming `what` when pins and the engine's pages leave too little
  // (before anything is evicted). `waits` collects operations whose completion would free more
  // (write_back copies, busy nodes); the caller may wait for them outside the lock and retry.
  Result<std::vector<int64_t>> TryAllocateDevice(int64_t pages, bool allow_fewer,
                                                 DevicePageLedger::Owner owner,
                                                 std::string_view what, Work* work,
                                                 std::vector<std::shared_ptr<CopyOp>>* waits) {
    const int64_t free = ledger->free_pages();
    if (free < pages) {
      if (!allow_fewer && DeviceReclaimable() < pages) {
        return Status::OutOfMemory(fmt::format(
            "{}: the device cannot make room ({} pages free, {} held by the engine, {} pinned by "
            "live handles, {} needed)",
            what, free, ledger->pages_of(DevicePageLedger::kEngine),
            tree.pinned_device_tokens() / P, pages));
      }
      EvictDevice(pages - free, work);
    }
    KVTIER_RETURN_IF_ERROR(CheckHealth());
    if (ledger->free_pages() >= pages) return ledger->Allocate(pages, owner);
    for (const auto& op : tracker.ops()) {
      if (op->kind == CopyOp::Kind::kBackup || op->kind == CopyOp::Kind::kLoad) {
        waits->push_back(op);
      }
    }
    if (allow_fewer && waits->empty()) return ledger->Allocate(ledger->free_pages(), owner);
    return Status::OutOfMemory(
        fmt::format("{}: the device cannot make room ({} pages free after eviction, {} needed)",
                    what, ledger->free_pages(), pages));
  }

  // Runs TryAllocateDevice, waiting outside the lock for copies whose completion makes more
  // evictable (write_back copies, busy nodes), and retrying a bounded number of times.
  Result<std::vector<int64_t>> AllocateDevice(Lock& lk, int64_t pages, bool allow_fewer,
                                              DevicePageLedger::Owner owner, std::string_view what,
                                              Work* work) {
    constexpr int kMaxWaits = 4;
    for (int attempt = 0;; ++attempt) {
      std::vector<std::shared_ptr<CopyOp>> waits;
      Result<std::vector<int64_t>> r =
          TryAllocateDevice(pages, allow_fewer, owner, what, work, &waits);
      if (r.ok() || waits.empty()) return r;
      if (attempt >= kMaxWaits) {
        if (allow_fewer) return ledger->Allocate(ledger->free_pages(), owner);
        return r;
      }
      lk.unlock();
      RunWork(*work);
      for (auto& op : waits) tracker.Wait(*op);
      lk.lock();
      KVTIER_RETURN_IF_ERROR(CheckHealth());
      Reap(work);
    }
  }

  // Waits for every operation in flight (outside the lock) until none is left.
  void Drain(Lock& lk, Work* work, bool backups_only) {
    for (;;) {
      Reap(work);
      std::vector<std::shared_ptr<CopyOp>> waits;
      for (const auto& op : tracker.ops()) {
        if (op->kind == CopyOp::Kind::kPrefetch && !op->concluded) continue;  // its handle's
        if (backups_only && op->kind != CopyOp::Kind::kBackup && op->kind != CopyOp::Kind::kStore) {
          continue;
        }
        waits.push_back(op);
      }
      if (waits.empty() && work->empty()) return;
      lk.unlock();
      RunWork(*work);
      for (auto& op : waits) tracker.Wait(*op);
      lk.lock();
    }
  }
};

// ---------------------------------------------------------------------------------------------

HierarchicalCache::HierarchicalCache(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

HierarchicalCache::~HierarchicalCache() {
  Impl& s = *impl_;
  Impl::Work work(&s);
  {
    Impl::Lock lk(s);
    for (auto& [id, h] : s.handles) {
      if (h.prefetch) s.Conclude(h, /*cancelled=*/true, &work);
    }
    // Prefetches still receiving pages must finish before their buffers go.
    for (;;) {
      s.Drain(lk, &work, /*backups_only=*/false);
      if (s.tracker.ops().empty()) break;
    }
  }
  s.pool.reset();
  if (s.gpu) (void)s.backup_stream.Synchronize();
  if (s.owns_storage && s.storage) s.storage->Close();
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
    return Status::InvalidArgument(
        fmt::format("device_region is in host memory but the transfer backend is {}; use cpu",
                    TransferBackendName(engine->backend())));
  }

  auto impl = std::make_unique<Impl>(config, g.page_size);
  Impl& s = *impl;
  s.device = device_region;
  s.engine = std::move(engine);
  s.gpu = gpu;

  HostKvPoolConfig hc;
  hc.geometry = g;  // num_slots is derived from the capacity below
  hc.geometry.layout = config.host_layout;
  hc.geometry.head_num = config.host_head_num > 0 ? config.host_head_num : g.head_num;
  hc.mla = device_region.mla;
  if (config.host_capacity_bytes > 0) {
    hc.capacity_bytes = config.host_capacity_bytes;
  } else {
    hc.device_ratio = config.host_ratio;
    hc.device_pool_bytes = g.buffer_bytes() * device_region.num_buffers();
  }
  hc.huge_pages = config.host_huge_pages;
  hc.register_with_cuda = gpu;
  if (!config.has_host_tier()) {
    s.no_host_region.geometry = hc.geometry;
    s.no_host_region.geometry.num_slots = 0;
    s.no_host_region.mla = device_region.mla;
  } else if (config.shared_host) {
    const double budget = config.host_capacity_bytes > 0
                              ? static_cast<double>(config.host_capacity_bytes)
                              : config.host_ratio * static_cast<double>(hc.device_pool_bytes);
    KVTIER_ASSIGN_OR_RETURN(
        s.host, OpenSharedHostTier(config.shared_host, device_region, gpu, config.storage.model_id,
                                   static_cast<int64_t>(std::min(budget, 9e18))));
  } else {
    KVTIER_ASSIGN_OR_RETURN(std::unique_ptr<HostKvPool> pool, HostKvPool::Create(hc));
    s.host = MakeLocalHostTier(std::move(pool));
  }
  KVTIER_ASSIGN_OR_RETURN(s.ledger, DevicePageLedger::Create(g.num_slots, g.page_size));
  if (gpu) {
    KVTIER_ASSIGN_OR_RETURN(s.backup_stream, CudaStreamHandle::Create(device_region.device));
  } else if (config.backup_threads > 0) {
    KVTIER_ASSIGN_OR_RETURN(s.pool, util::ThreadPool::Create(config.backup_threads + 1));
  }

  if (config.storage.enabled()) {
    StorageNamespace want;
    want.model_id = config.storage.model_id;
    want.kv_dtype = config.storage.kv_dtype;
    want.layout = config.host_layout;
    want.mla = device_region.mla;
    want.num_layers = g.num_layers;
    want.slot_bytes = g.slot_bytes;
    want.page_size = g.page_size;
    want.head_num = hc.geometry.head_num;
    want.tp_rank = config.storage.tp_rank;
    want.tp_size = config.storage.tp_size;
    if (config.storage.backend) {
      const StorageNamespace& have = config.storage.backend->ns();
      if (have.layout != want.layout || have.mla != want.mla ||
          have.num_layers != want.num_layers || have.slot_bytes != want.slot_bytes ||
          have.page_size != want.page_size ||
          (want.layout == KvLayout::kPageHead && have.head_num != want.head_num)) {
        return Status::InvalidArgument(fmt::format(
            "storage.backend's namespace ({}) does not describe this cache's host pages ({})",
            have.Describe(), want.Describe()));
      }
      s.storage = config.storage.backend;
    } else {
      KVTIER_RETURN_IF_ERROR(want.Validate().WithContext("storage namespace"));
      KVTIER_ASSIGN_OR_RETURN(std::unique_ptr<StorageBackend> opened,
                              OpenStorage(config.storage.url, want, config.storage.options));
      s.storage = std::move(opened);
      s.owns_storage = true;
    }
    KVTIER_ASSIGN_OR_RETURN(s.staging, storage::PageStaging::Create(s.host->region()));
  }

  Impl* self = impl.get();
  s.tree.SetSplitHook([self](RadixNode* upper, RadixNode* lower) {
    if (lower->busy() == 0 && !lower->storing()) return;
    for (const auto& op : self->tracker.ops()) {
      if (std::find(op->nodes.begin(), op->nodes.end(), lower) != op->nodes.end()) {
        op->nodes.push_back(upper);
      }
    }
    for (const auto& op : self->reaping) {  // completed, not reaped yet (see Reap)
      if (op && std::find(op->nodes.begin(), op->nodes.end(), lower) != op->nodes.end()) {
        op->nodes.push_back(upper);
      }
    }
    for (auto& [id, h] : self->handles) {
      const auto& op = h.prefetch;
      if (op && std::find(op->nodes.begin(), op->nodes.end(), lower) != op->nodes.end() &&
          std::find(op->nodes.begin(), op->nodes.end(), upper) == op->nodes.end()) {
        op->nodes.push_back(upper);
      }
    }
  });
  return std::unique_ptr<HierarchicalCache>(new HierarchicalCache(std::move(impl)));
}

Result<MatchResult> HierarchicalCache::Match(std::span<const Token> tokens, std::string_view ns) {
  Impl& s = *impl_;
  // Shared host tier: the keys of the whole pages after the tree's match (a peek under the lock
  // says where it ends and gives the key to chain from), hashed outside the lock.
  std::vector<PageKey> tail;
  int64_t tail_from = -1;  // page of tail[0]; -1: no lookup in the segment
  const int64_t whole_pages = static_cast<int64_t>(tokens.size()) / s.P;
  if (s.host && s.host->shared() && whole_pages > 0) {
    std::optional<PageKey> previous;
    {
      Impl::Lock lk(s);
      s.MatchedChain(ns, tokens, &tail_from, &previous);
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
  Impl::Work work(&s);
  MatchResult out;
  {
    Impl::Lock lk(s);
    KVTIER_RETURN_IF_ERROR(s.CheckHealth());
    s.Reap(&work);
    RadixTree::MatchResult r = s.tree.Match(ns, tokens);
    const int64_t adopted = tail_from < 0 ? 0 : s.AdoptShared(&r, ns, tokens, tail, tail_from);
    out.device_tokens = r.device_tokens;
    out.host_tokens = r.host_tokens;
    out.storage_tokens = r.storage_tokens;
    const std::vector<RadixNode*> path = Impl::Path(r.last);
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
    Impl::Handle h;
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
    if (s.host && s.host->free_pages() < 0) s.EvictHost(-s.host->free_pages(), &work);
    s.MaybeBackup(path, &work);
    s.counters.shared_host_hit_tokens += adopted;
    ++s.counters.match_calls;
    s.counters.match_query_tokens += static_cast<int64_t>(tokens.size());
    s.counters.device_hit_tokens += r.device_tokens;
    s.counters.host_hit_tokens += r.host_tokens;
    s.counters.storage_hit_tokens += r.storage_tokens;
  }
  s.RunWork(work);
  return out;
}

Result<StorageQueryResult> HierarchicalCache::QueryStorage(MatchHandle handle) {
  Impl& s = *impl_;
  Impl::Work work(&s);
  StorageQueryResult out;
  std::vector<Token> rest;
  std::optional<PageKey> previous;
  std::string ns;
  RadixNode* last = nullptr;
  {
    Impl::Lock lk(s);
    KVTIER_ASSIGN_OR_RETURN(Impl::Handle * h, s.FindHandle(handle));
    for (RadixNode* n : Impl::Path(h->last)) {
      if (!n->on_device() && !n->on_host() && n->stored()) out.storage_tokens += n->num_tokens();
    }
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
  Impl::Lock lk(s);
  if (!found.status.ok()) {
    ++s.counters.storage_errors;
    if (found.status.code() == StatusCode::kUnavailable) ++s.counters.storage_timeouts;
  }
  KVTIER_ASSIGN_OR_RETURN(Impl::Handle * h, s.FindHandle(handle));
  const int64_t pages = std::clamp<int64_t>(found.leading, 0, static_cast<int64_t>(keys->size()));
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
    s.TrimStorage(&work);
  }
  lk.unlock();
  s.RunWork(work);
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
  Impl::Work work(&s);
  PrefetchResult out;
  {
    Impl::Lock lk(s);
    KVTIER_RETURN_IF_ERROR(s.CheckHealth());
    s.Reap(&work);
    KVTIER_ASSIGN_OR_RETURN(Impl::Handle * h, s.FindHandle(handle));
    if (h->prefetch) {
      return Status::FailedPrecondition(
          fmt::format("handle {}: a prefetch is running already", handle.id));
    }
    h->prefetch_policy = policy;
    out.policy = policy;
    out.host_tokens = s.HostTokensOf(*h);
    if (!s.storage) return out;
    // The storage part: nodes after the host part that storage holds and nobody fills yet.
    std::vector<RadixNode*> part;
    int64_t tokens = 0;
    for (RadixNode* n : Impl::Path(h->last)) {
      if (n->on_device() || n->on_host()) {
        if (!part.empty()) break;
        continue;
      }
      if (!n->stored() || n->prefetching() || n->keys().empty()) break;
      part.push_back(n);
      tokens += n->num_tokens();
    }
    if (tokens == 0) return out;
    ++s.counters.prefetch_calls;
    if (!part.front()->parent()->is_root() && !part.front()->parent()->on_host()) {
      // Host copies form a prefix: pages after a device-only node have nowhere to go.
      s.counters.prefetch_no_room_tokens += tokens;
      return out;
    }
    if (tokens < s.config.storage.prefetch_threshold_tokens) {
      s.counters.prefetch_below_threshold_tokens += tokens;
      return out;
    }
    const int64_t cap = static_cast<int64_t>(std::floor(
        s.config.storage.max_prefetch_host_fraction * static_cast<double>(s.host->num_pages())));
    int64_t pages = std::min(tokens / s.P, cap - s.filling_pages);
    if (pages > 0 && !s.EnsureHostPages(pages, &work)) {
      pages = std::min(pages, s.host->free_pages());
    }
    if (pages <= 0 || pages * s.P < std::min(tokens, s.config.storage.prefetch_threshold_tokens)) {
      s.counters.prefetch_no_room_tokens += tokens;
      lk.unlock();
      s.RunWork(work);
      return out;
    }
    // The local tier (a shared one has no storage tier below it): every page is kWrite.
    KVTIER_ASSIGN_OR_RETURN(std::vector<HostTier::Page> acquired, s.host->Acquire(pages, {}));
    std::vector<int64_t> host_pages;
    host_pages.reserve(acquired.size());
    for (const HostTier::Page& pg : acquired) host_pages.push_back(pg.start);
    auto op = std::make_shared<CopyOp>();
    op->kind = CopyOp::Kind::kPrefetch;
    op->tokens = pages * s.P;
    op->start = Clock::now();
    const double budget = std::min(s.config.storage.prefetch_timeout_max_s,
                                   s.config.storage.prefetch_timeout_base_s +
                                       s.config.storage.prefetch_timeout_per_1k_tokens_s *
                                           static_cast<double>(op->tokens) / 1024.0);
    op->deadline = op->start + std::chrono::duration_cast<Clock::duration>(
                                   std::chrono::duration<double>(budget));
    op->pages = host_pages;
    op->batch_pages =
        std::min(s.config.storage.max_prefetch_batch_pages, s.storage->options().max_batch_pages);
    int64_t left = pages;
    for (RadixNode* n : part) {
      if (left <= 0) break;
      const int64_t np = n->num_tokens() / s.P;
      const int64_t take = std::min(np, left);
      for (int64_t i = 0; i < take; ++i) {
        op->keys.push_back(n->keys()[static_cast<size_t>(i)]);
      }
      s.tree.SetPrefetching(n, true);
      s.MarkBusy(*op, n);
      left -= take;
    }
    op->page_status.assign(static_cast<size_t>(pages), PageStatus::kSkipped);
    op->batch_done.assign(static_cast<size_t>(op->num_batches()), 0);
    op->batches_left = op->num_batches();
    s.filling_pages += pages;
    s.counters.prefetch_requested_tokens += op->tokens;
    h->prefetch = op;
    s.tracker.Add(op);
    work.storage.push_back(op);
    out.state = PrefetchState::kRunning;
    out.requested_tokens = op->tokens;
  }
  s.RunWork(work);
  return out;
}

Result<PrefetchResult> HierarchicalCache::PollPrefetch(MatchHandle handle) {
  Impl& s = *impl_;
  Impl::Lock lk(s);
  KVTIER_ASSIGN_OR_RETURN(Impl::Handle * h, s.FindHandle(handle));
  return s.Progress(*h);
}

Result<PrefetchResult> HierarchicalCache::FinishPrefetch(MatchHandle handle) {
  Impl& s = *impl_;
  Impl::Work work(&s);
  PrefetchResult out;
  {
    Impl::Lock lk(s);
    KVTIER_ASSIGN_OR_RETURN(Impl::Handle * h, s.FindHandle(handle));
    if (!h->prefetch) return s.Progress(*h);
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
      if (h->prefetch != op) return s.Progress(*h);  // another call ended it meanwhile
    }
    out = s.Conclude(*h, /*cancelled=*/false, &work);
  }
  s.RunWork(work);
  return out;
}

Result<LoadBackResult> HierarchicalCache::LoadBack(MatchHandle handle, CudaStream stream) {
  Impl& s = *impl_;
  LoadBackResult out;
  {
    Impl::Lock lk(s);
    KVTIER_ASSIGN_OR_RETURN(Impl::Handle * h, s.FindHandle(handle));
    const bool prefetching = h->prefetch != nullptr;
    lk.unlock();
    if (prefetching) {
      KVTIER_ASSIGN_OR_RETURN(out.prefetch, FinishPrefetch(handle));
    }
  }
  Impl::Work work(&s);
  Impl::Lock lk(s);
  const auto start = Clock::now();
  Impl::Handle* h = nullptr;
  std::vector<RadixNode*> host_nodes;
  std::vector<int64_t> alloc;
  int64_t tokens = 0;
  for (int attempt = 0;; ++attempt) {
    KVTIER_RETURN_IF_ERROR(s.CheckHealth());
    s.Reap(&work);
    KVTIER_ASSIGN_OR_RETURN(h, s.FindHandle(handle));
    // The host part: nodes after the device part that are in host memory.
    auto host_part = [&](std::vector<RadixNode*>* nodes) {
      int64_t t = 0;
      for (RadixNode* n : Impl::Path(h->last)) {
        if (n->on_device()) continue;
        if (!n->on_host()) break;
        if (nodes != nullptr) nodes->push_back(n);
        t += n->num_tokens();
      }
      return t;
    };
    tokens = host_part(nullptr);
    if (tokens == 0 || tokens < s.config.load_back_min_tokens) {
      out.skipped_tokens = tokens;
      s.counters.load_back_skipped_tokens += tokens;
      out.device_slots = s.DeviceSlotsOf(Impl::Path(h->last));
      lk.unlock();
      s.RunWork(work);
      return out;
    }
    const int64_t pages = tokens / s.P;
    if (pages > s.ledger->num_pages()) {
      return Status::OutOfMemory(fmt::format("LoadBack of {} tokens exceeds the device pool of {}",
                                             tokens, s.ledger->num_slots()));
    }
    Result<std::vector<int64_t>> got =
        s.AllocateDevice(lk, pages, false, DevicePageLedger::kCopy,
                         fmt::format("LoadBack of {} tokens", tokens), &work);
    if (!got.ok()) {
      lk.unlock();
      s.RunWork(work);
      return got.status();
    }
    // The lock may have been dropped while allocating: the host part may have changed.
    KVTIER_ASSIGN_OR_RETURN(h, s.FindHandle(handle));
    host_nodes.clear();
    if (host_part(&host_nodes) == tokens) {
      alloc = std::move(*got);
      break;
    }
    s.FreeDevice(*got);
    if (attempt >= 3) {
      return Status::Unavailable("LoadBack: the match kept changing under concurrent loads");
    }
  }
  auto op = std::make_shared<CopyOp>();
  op->kind = CopyOp::Kind::kLoad;
  op->gpu = s.gpu;
  op->tokens = tokens;
  op->start = start;
  op->pages = alloc;
  op->free_on_completion = alloc;
  op->dst = PageSlots(alloc, s.P);
  for (RadixNode* n : host_nodes) {
    s.AppendSlots(n->host_pages(), &op->src);
    s.MarkBusy(*op, n);  // its host pages stay put while they are read
  }
  s.tracker.Add(op);
  std::vector<std::shared_ptr<CudaEventHandle>> fences;
  if (s.gpu) fences = s.ledger->write_fences();
  lk.unlock();
  s.RunWork(work);

  Status st;
  if (s.gpu) {
    Result<LayerEvents> events =
        LayerEvents::Create(static_cast<int>(s.device.geometry.num_layers), s.device.device);
    if (events.ok()) {
      op->layer_events = std::make_unique<LayerEvents>(std::move(*events));
      s.SubmitGpu(*op, stream, fences);
    } else {
      s.tracker.Complete(*op, events.status());
    }
  } else {
    s.tracker.Complete(*op, s.RunCopy(*op, nullptr));
  }
  {
    std::vector<PageStatus> unused_pages;
    std::vector<uint8_t> unused_batches;
    s.tracker.Snapshot(*op, &unused_pages, &unused_batches, &st);
  }

  lk.lock();
  if (!st.ok()) {
    // The copy may still write its pages (GPU): they stay with the op until it has completed.
    s.Reap(&work);
    lk.unlock();
    s.RunWork(work);
    return st.WithContext("LoadBack");
  }
  // Publish: each node that is still off the device takes its pages; pages of nodes that came
  // onto the device meanwhile stay with the op and are freed when it completes. Nodes split
  // meanwhile are all in op->nodes (the split hook), whose host pages in order are the sources.
  std::vector<RadixNode*> nodes = op->nodes;
  std::sort(nodes.begin(), nodes.end(), [](const RadixNode* a, const RadixNode* b) {
    return a->prefix_tokens() < b->prefix_tokens();
  });
  size_t off = 0;
  std::vector<int64_t> published;
  for (RadixNode* n : nodes) {
    const size_t np = n->host_pages().size();
    std::vector<int64_t> slice(alloc.begin() + static_cast<ptrdiff_t>(off),
                               alloc.begin() + static_cast<ptrdiff_t>(off + np));
    off += np;
    const bool parent_ok = n->parent()->is_root() || n->parent()->on_device();
    if (!n->on_device() && parent_ok) {
      published.insert(published.end(), slice.begin(), slice.end());
      s.tree.SetDevicePages(n, std::move(slice));
    }
  }
  s.ledger->Transfer(published, DevicePageLedger::kTree);
  std::erase_if(op->free_on_completion, [&](int64_t p) {
    return std::find(published.begin(), published.end(), p) != published.end();
  });
  KVTIER_ASSIGN_OR_RETURN(h, s.FindHandle(handle));
  if (s.gpu) h->load = op;
  s.Reap(&work);  // cpu: the copy has completed; frees what was not published
  out.loaded_tokens = static_cast<int64_t>(published.size()) * s.P;
  out.device_slots = s.DeviceSlotsOf(Impl::Path(h->last));
  ++s.counters.load_back_calls;
  s.counters.load_back_tokens += out.loaded_tokens;
  if (!s.gpu) {  // synchronous: done now (a GPU copy counts its time when reaped, ReapLoad)
    const double seconds = SecondsSince(start);
    s.counters.load_back_seconds += seconds;
    s.counters.load_back_duration.Observe(seconds);
  }
  lk.unlock();
  s.RunWork(work);
  return out;
}

Status HierarchicalCache::WaitLayer(MatchHandle handle, int64_t layer, CudaStream consumer) {
  Impl& s = *impl_;
  std::vector<std::shared_ptr<CopyOp>> loads;
  {
    Impl::Lock lk(s);
    KVTIER_ASSIGN_OR_RETURN(Impl::Handle * h, s.FindHandle(handle));
    if (layer < 0 || layer >= s.device.geometry.num_layers) {
      return Status::InvalidArgument(
          fmt::format("layer = {} is out of range [0, {})", layer, s.device.geometry.num_layers));
    }
    // The handle's own load-back, and any other load-back still filling slots of this match.
    if (h->load && h->load->layer_events) loads.push_back(h->load);
    const std::vector<RadixNode*> path = Impl::Path(h->last);
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
  Impl::Work work(&s);
  {
    Impl::Lock lk(s);
    KVTIER_ASSIGN_OR_RETURN(Impl::Handle * h, s.FindHandle(handle));
    if (h->prefetch) s.Conclude(*h, /*cancelled=*/true, &work);
    if (h->last != nullptr) s.tree.DecRef(h->last);
    s.handles.erase(handle.id);
    s.Reap(&work);
    s.TrimStorage(&work);
  }
  s.RunWork(work);
  return Status::OK();
}

Result<std::vector<int64_t>> HierarchicalCache::AllocateDeviceSlots(
    int64_t num_tokens, const AllocateOptions& options) {
  Impl& s = *impl_;
  Impl::Work work(&s);
  std::vector<int64_t> slots;
  {
    Impl::Lock lk(s);
    KVTIER_RETURN_IF_ERROR(s.CheckHealth());
    if (num_tokens < 0) {
      return Status::InvalidArgument(
          fmt::format("num_tokens = {} must not be negative", num_tokens));
    }
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
      s.RunWork(work);
      return alloc.status();
    }
    slots = PageSlots(*alloc, s.P);
  }
  s.RunWork(work);
  return slots;
}

Status HierarchicalCache::FreeDeviceSlots(std::span<const int64_t> slots) {
  Impl& s = *impl_;
  Impl::Lock lk(s);
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
  if ((s.storage || (s.host && s.host->shared())) && !tokens.empty()) {
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

  Impl::Work work(&s);
  InsertResult out;
  {
    Impl::Lock lk(s);
    KVTIER_RETURN_IF_ERROR(s.CheckHealth());
    s.Reap(&work);
    std::vector<int64_t> pages;
    KVTIER_RETURN_IF_ERROR(s.ledger->CheckPages(device_slots, "device_slots", &pages));
    // Pages of the cached device prefix may be the tree's own (as Match returned them).
    RadixTree::MatchResult peek = s.tree.Peek(ns, tokens);
    std::vector<int64_t> cached;
    if (peek.last != nullptr && peek.device_tokens > 0) {
      cached = s.DeviceSlotsOf(Impl::Path(peek.last));
      cached.resize(static_cast<size_t>(peek.device_tokens));
    }
    std::vector<bool> own(pages.size(), false);
    for (size_t i = 0; i < pages.size(); ++i) {
      own[i] = i * static_cast<size_t>(s.P) < cached.size() &&
               cached[i * static_cast<size_t>(s.P)] == pages[i];
    }
    KVTIER_RETURN_IF_ERROR(s.ledger->CheckEngineHeld(pages, "Insert", &own));

    std::vector<RadixTree::InsertSegment> segments;
    s.tree.Insert(ns, tokens, pages, keys, &segments);
    std::vector<int64_t> duplicates, taken;
    for (const auto& seg : segments) {
      const int64_t len = seg.end - seg.begin;
      switch (seg.kind) {
        case RadixTree::SegmentKind::kOnDevice:
          out.cached_tokens += len;
          for (int64_t k = seg.begin; k < seg.end; k += s.P) {
            const int64_t mine =
                seg.node->device_pages()[static_cast<size_t>((k - seg.begin) / s.P)];
            if (device_slots[static_cast<size_t>(k)] != mine) {
              duplicates.push_back(device_slots[static_cast<size_t>(k)]);
            }
          }
          s.tree.Touch(seg.node, 1);
          break;
        case RadixTree::SegmentKind::kRevived:
        case RadixTree::SegmentKind::kNew:
          (seg.kind == RadixTree::SegmentKind::kNew ? out.new_tokens : out.revived_tokens) += len;
          for (int64_t k = seg.begin; k < seg.end; k += s.P) {
            taken.push_back(device_slots[static_cast<size_t>(k)]);
          }
          s.tree.Touch(seg.node, seg.kind == RadixTree::SegmentKind::kNew ? 0 : 1);
          break;
      }
      s.tree.RaisePriority(seg.node, options.priority);
    }
    s.ledger->Transfer(taken, DevicePageLedger::kTree);
    s.Fail(s.ledger->Free(duplicates), "freeing duplicates");
    out.duplicate_tokens = static_cast<int64_t>(duplicates.size()) * s.P;
    s.counters.inserted_tokens += out.new_tokens + out.revived_tokens;
    s.counters.duplicate_tokens += out.duplicate_tokens;
    if (fence) s.ledger->AddWriteFence(std::move(fence));
    if (options.pin) {
      Impl::Handle h;
      h.ns = std::string(ns);
      if (!segments.empty()) {
        h.last = segments.back().node;
        s.tree.IncRef(h.last);
      }
      h.prefetch_policy = s.config.storage.prefetch_policy;
      out.handle = s.NewHandle(std::move(h));
    }
    if (!segments.empty()) s.MaybeBackup(Impl::Path(segments.back().node), &work);
  }
  s.RunWork(work);
  return out;
}

Result<int64_t> HierarchicalCache::EvictDevice(int64_t num_tokens) {
  Impl& s = *impl_;
  if (num_tokens < 0) {
    return Status::InvalidArgument(fmt::format("num_tokens = {} must not be negative", num_tokens));
  }
  Impl::Work work(&s);
  int64_t freed = 0;
  Status health;
  {
    Impl::Lock lk(s);
    KVTIER_RETURN_IF_ERROR(s.CheckHealth());
    const int64_t need = std::min(PagesFor(num_tokens, s.P), s.ledger->num_pages());
    // write_back: victims are copied to host memory first; wait for those copies (outside the
    // lock) and evict again, a bounded number of times.
    for (int round = 0; round < 4 && health.ok(); ++round) {
      s.Reap(&work);
      freed += s.EvictDevice(need - freed, &work);
      health = s.CheckHealth();
      std::vector<std::shared_ptr<CopyOp>> waits;
      for (const auto& op : s.tracker.ops()) {
        if (op->kind == CopyOp::Kind::kBackup && op->write_back) waits.push_back(op);
      }
      if (freed >= need || waits.empty()) break;
      lk.unlock();
      s.RunWork(work);
      for (auto& op : waits) s.tracker.Wait(*op);
      lk.lock();
    }
  }
  s.RunWork(work);
  KVTIER_RETURN_IF_ERROR(health);
  return freed * s.P;
}

Result<int64_t> HierarchicalCache::EvictHost(int64_t num_tokens) {
  Impl& s = *impl_;
  if (num_tokens < 0) {
    return Status::InvalidArgument(fmt::format("num_tokens = {} must not be negative", num_tokens));
  }
  Impl::Work work(&s);
  int64_t freed = 0;
  {
    Impl::Lock lk(s);
    KVTIER_RETURN_IF_ERROR(s.CheckHealth());
    s.Reap(&work);
    const int64_t host_pages = s.host ? s.host->num_pages() : 0;
    freed = s.EvictHost(std::min(PagesFor(num_tokens, s.P), host_pages), &work) * s.P;
    s.TrimStorage(&work);
  }
  s.RunWork(work);
  return freed;
}

Status HierarchicalCache::WaitForBackups() {
  Impl& s = *impl_;
  Impl::Work work(&s);
  Status failure;
  {
    Impl::Lock lk(s);
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
  Impl::Work work(&s);
  CacheStats c;
  {
    Impl::Lock lk(s);
    s.Reap(&work);
    c = s.counters;
    c.page_size = s.P;
    c.device_total_tokens = s.ledger->num_slots();
    c.device_used_tokens = s.ledger->used_pages() * s.P;
    c.device_cached_tokens = s.tree.device_tokens();
    c.device_engine_tokens = s.ledger->pages_of(DevicePageLedger::kEngine) * s.P;
    if (s.host) {
      c.host_total_tokens = s.host->num_pages() * s.P;
      c.host_used_tokens = s.host->held_pages() * s.P;
      c.host_total_bytes = s.host->capacity_bytes();
    }
    c.host_filling_tokens = s.filling_pages * s.P;
    c.storage_known_tokens = s.tree.stored_tokens();
    c.storage_only_tokens = s.tree.storage_only_tokens();
    c.nodes = s.tree.num_nodes();
    c.namespaces = s.tree.num_namespaces();
    c.live_handles = static_cast<int64_t>(s.handles.size());
    c.prefetch_inflight_tokens = s.filling_pages * s.P;
  }
  s.RunWork(work);
  return c;
}

Status HierarchicalCache::CheckConsistency() const {
  const Impl& s = *impl_;
  Impl::Lock lk(s);
  KVTIER_RETURN_IF_ERROR(s.tree.CheckInvariants());
  const int64_t P = s.P;
  std::vector<uint8_t> dev_seen(static_cast<size_t>(s.ledger->num_pages()), 0);
  const HostTier* host = s.host.get();  // null without a host tier: the tree has no host pages
  std::vector<uint8_t> host_seen(
      static_cast<size_t>(host ? host->region().geometry.num_pages() : 0), 0);
  std::unordered_map<const RadixNode*, int64_t> expected_refs, expected_busy;
  for (const auto& [id, h] : s.handles) {
    for (const RadixNode* n = h.last; n != nullptr && !n->is_root(); n = n->parent()) {
      ++expected_refs[n];
    }
  }
  int64_t copy_pages = 0, filling = 0;
  for (const auto& op : s.tracker.ops()) {
    if (op->kind != CopyOp::Kind::kStore) {
      for (const RadixNode* n : op->nodes) ++expected_busy[n];
    }
    if (op->kind == CopyOp::Kind::kLoad) {
      copy_pages += static_cast<int64_t>(op->free_on_completion.size());
    }
    if (op->kind == CopyOp::Kind::kPrefetch) {
      const int64_t held = op->concluded ? static_cast<int64_t>(op->free_on_completion.size())
                                         : static_cast<int64_t>(op->pages.size());
      filling += held;
      const auto& pages = op->concluded ? op->free_on_completion : op->pages;
      for (int64_t p : pages) {
        if (host_seen[static_cast<size_t>(p / P)]++) {
          return Status::Internal(fmt::format("host page at slot {} held twice by prefetches", p));
        }
      }
    }
  }
  if (filling != s.filling_pages) {
    return Status::Internal(fmt::format("filling host pages: prefetches hold {}, recorded {}",
                                        filling, s.filling_pages));
  }
  Status st;
  int64_t tree_pages = 0, host_pages = 0;
  s.tree.ForEachNode([&](const RadixNode& n) {
    if (!st.ok()) return;
    for (int64_t start : n.device_pages()) {
      const size_t p = static_cast<size_t>(start / P);
      if (s.ledger->owner(start) != DevicePageLedger::kTree || dev_seen[p] ||
          !s.ledger->IsAllocated(start)) {
        st = Status::Internal(fmt::format(
            "node {}: device page at slot {} has owner {}, seen {}, allocated {}", n.id(), start,
            static_cast<int>(s.ledger->owner(start)), dev_seen[p], s.ledger->IsAllocated(start)));
        return;
      }
      dev_seen[p] = 1;
      ++tree_pages;
    }
    for (int64_t start : n.host_pages()) {
      const size_t p = static_cast<size_t>(start / P);
      if (host == nullptr) {
        st = Status::Internal(fmt::format(
            "node {}: host page at slot {} but the cache has no host tier", n.id(), start));
        return;
      }
      if (host_seen[p] || !host->Holds(start)) {
        st = Status::Internal(fmt::format("node {}: host page at slot {} seen {}, held {}", n.id(),
                                          start, host_seen[p], host->Holds(start)));
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
    auto b = expected_busy.find(&n);
    const int64_t busy = b == expected_busy.end() ? 0 : b->second;
    if (n.busy() != busy) {
      st = Status::Internal(
          fmt::format("node {}: busy {} but {} operations list it", n.id(), n.busy(), busy));
      return;
    }
  });
  KVTIER_RETURN_IF_ERROR(st);
  const int64_t owner_tree = s.ledger->pages_of(DevicePageLedger::kTree);
  const int64_t owner_copy = s.ledger->pages_of(DevicePageLedger::kCopy);
  const int64_t owner_engine = s.ledger->pages_of(DevicePageLedger::kEngine);
  if (owner_tree != tree_pages || owner_copy != copy_pages ||
      s.ledger->used_pages() != tree_pages + owner_engine + owner_copy) {
    return Status::Internal(fmt::format(
        "device pages: tree {} (ledger {}), load-backs {} (ledger {}), engine {}, allocator used "
        "{}",
        tree_pages, owner_tree, copy_pages, owner_copy, owner_engine, s.ledger->used_pages()));
  }
  const int64_t host_held = host ? host->held_pages() : 0;
  if (host_held != host_pages + filling) {
    return Status::Internal(fmt::format("host pages: tree {} + filling {}, host tier holds {}",
                                        host_pages, filling, host_held));
  }
  return Status::OK();
}

bool HierarchicalCache::MutexHeldByCurrentThread() const {
  return impl_->owner.load(std::memory_order_relaxed) == std::this_thread::get_id();
}

const KvRegion& HierarchicalCache::device_region() const { return impl_->device; }
const KvRegion& HierarchicalCache::host_region() const {
  return impl_->host ? impl_->host->region() : impl_->no_host_region;
}
int64_t HierarchicalCache::page_size() const { return impl_->P; }
TransferBackend HierarchicalCache::backend() const { return impl_->engine->backend(); }
StorageBackend* HierarchicalCache::storage() const { return impl_->storage.get(); }

}  // namespace kvtier
