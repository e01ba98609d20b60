// HierarchicalCache::Impl: the orchestrator's private state (cache/cache_parts.h) and the
// multi-step operations the public calls share — device allocation with waits, and the prefetch
// runs. Private to src/cache: hierarchical_cache.cc (the public calls) and
// hierarchical_cache_pin.cc (Pin / Unpin) include it.
#pragma once

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <optional>
#include <vector>

#include "cache/cache_parts.h"
#include "kvtier/hierarchical_cache.h"

namespace kvtier {

struct HierarchicalCache::Impl : CacheParts {
  using CacheParts::CacheParts;

  // ---- device allocation --------------------------------------------------------------------

  // Runs TryAllocateDevice, waiting outside the lock for copies whose completion makes more
  // evictable (write_back copies, busy nodes), and retrying a bounded number of times.
  Result<std::vector<int64_t>> AllocateDevice(CacheLock& lk, int64_t pages, bool allow_fewer,
                                              DevicePageLedger::Owner owner, std::string_view what,
                                              CacheWork* work) KVTIER_REQUIRES(kCacheLock) {
    constexpr int kMaxWaits = 4;
    for (int attempt = 0;; ++attempt) {
      std::vector<std::shared_ptr<CopyOp>> waits;
      Result<std::vector<int64_t>> r =
          evictor.TryAllocateDevice(pages, allow_fewer, owner, what, work, &waits);
      if (r.ok() || waits.empty()) return r;
      if (attempt >= kMaxWaits) {
        if (allow_fewer) return ledger->Allocate(ledger->free_pages(), owner);
        return r;
      }
      lk.Release();
      executor.Run(*work);
      for (auto& op : waits) tracker.Wait(*op);
      lk.Reacquire();
      KVTIER_RETURN_IF_ERROR(CheckHealth());
      Reap(work);
    }
  }

  // ---- insert -------------------------------------------------------------------------------
  // The pages of `device_slots` (whole pages, each held by the engine — or, for the cached device
  // prefix of `tokens`, the tree's own as Match returned them) to `pages`.
  Status CheckInsertPages(std::span<const Token> tokens, std::span<const int64_t> device_slots,
                          std::string_view ns, std::vector<int64_t>* pages)
      KVTIER_REQUIRES(kCacheLock) {
    KVTIER_RETURN_IF_ERROR(ledger->CheckPages(device_slots, "device_slots", pages));
    RadixTree::MatchResult peek = tree.Peek(ns, tokens);
    std::vector<int64_t> cached;
    if (peek.last != nullptr && peek.device_tokens > 0) {
      cached = DeviceSlotsOf(CacheCore::Path(peek.last));
      cached.resize(static_cast<size_t>(peek.device_tokens));
    }
    std::vector<bool> own(pages->size(), false);
    for (size_t i = 0; i < pages->size(); ++i) {
      own[i] = i * static_cast<size_t>(P) < cached.size() &&
               cached[i * static_cast<size_t>(P)] == (*pages)[i];
    }
    return ledger->CheckEngineHeld(*pages, "Insert", &own);
  }

  // Counts what the tree's insert made of each segment into `out`: pages of segments the tree
  // already had on the device are `duplicates` (unless they are the tree's own), pages of new or
  // revived segments are `taken` by the tree. Touches and raises the priority of each node.
  void ApplySegments(const std::vector<RadixTree::InsertSegment>& segments,
                     std::span<const int64_t> device_slots, int32_t priority, InsertResult* out,
                     std::vector<int64_t>* duplicates, std::vector<int64_t>* taken)
      KVTIER_REQUIRES(kCacheLock) {
    for (const auto& seg : segments) {
      const int64_t len = seg.end - seg.begin;
      switch (seg.kind) {
        case RadixTree::SegmentKind::kOnDevice:
          out->cached_tokens += len;
          for (int64_t k = seg.begin; k < seg.end; k += P) {
            const int64_t mine = seg.node->device_pages()[static_cast<size_t>((k - seg.begin) / P)];
            if (device_slots[static_cast<size_t>(k)] != mine) {
              duplicates->push_back(device_slots[static_cast<size_t>(k)]);
            }
          }
          tree.Touch(seg.node, 1);
          break;
        case RadixTree::SegmentKind::kRevived:
        case RadixTree::SegmentKind::kNew:
          (seg.kind == RadixTree::SegmentKind::kNew ? out->new_tokens : out->revived_tokens) += len;
          for (int64_t k = seg.begin; k < seg.end; k += P) {
            taken->push_back(device_slots[static_cast<size_t>(k)]);
          }
          tree.Touch(seg.node, seg.kind == RadixTree::SegmentKind::kNew ? 0 : 1);
          break;
      }
      tree.RaisePriority(seg.node, priority);
    }
  }

  // ---- load-back ----------------------------------------------------------------------------
  // What a LoadBack copies: the host part of a handle's match (after its device part) and the
  // device pages (kCopy) it goes to. tokens == 0: nothing to copy (skipped_tokens below
  // load_back_min_tokens).
  struct LoadPlan {
    std::vector<RadixNode*> host_nodes;
    std::vector<int64_t> alloc;
    int64_t tokens = 0;
    int64_t skipped_tokens = 0;
  };

  // Tokens of the host part of `h`'s match after its device part; its nodes go to `nodes`.
  int64_t HostPart(const HandleState& h, std::vector<RadixNode*>* nodes) const
      KVTIER_REQUIRES(kCacheLock) {
    int64_t t = 0;
    for (RadixNode* n : CacheCore::Path(h.last)) {
      if (n->on_device()) continue;
      if (!n->on_host()) break;
      if (nodes != nullptr) nodes->push_back(n);
      t += n->num_tokens();
    }
    return t;
  }

  // Device pages for the host part of `handle`'s match (none when it is shorter than
  // `min_tokens`). The lock may be dropped while allocating (waits for copies): the part is taken
  // again after, and the allocation retried while it keeps changing (Unavailable after a few
  // tries).
  Status PlanLoad(CacheLock& lk, MatchHandle handle, int64_t min_tokens, CacheWork* work,
                  LoadPlan* plan) KVTIER_REQUIRES(kCacheLock) {
    for (int attempt = 0;; ++attempt) {
      KVTIER_RETURN_IF_ERROR(CheckHealth());
      Reap(work);
      KVTIER_ASSIGN_OR_RETURN(HandleState * h, FindHandle(handle));
      const int64_t tokens = HostPart(*h, nullptr);
      if (tokens == 0 || tokens < min_tokens) {
        plan->skipped_tokens = tokens;
        return Status::OK();
      }
      const int64_t pages = tokens / P;
      if (pages > ledger->num_pages()) {
        return Status::OutOfMemory(fmt::format(
            "LoadBack of {} tokens exceeds the device pool of {}", tokens, ledger->num_slots()));
      }
      KVTIER_ASSIGN_OR_RETURN(std::vector<int64_t> got,
                              AllocateDevice(lk, pages, false, DevicePageLedger::kCopy,
                                             fmt::format("LoadBack of {} tokens", tokens), work));
      KVTIER_ASSIGN_OR_RETURN(h, FindHandle(handle));
      plan->host_nodes.clear();
      if (HostPart(*h, &plan->host_nodes) == tokens) {
        plan->alloc = std::move(got);
        plan->tokens = tokens;
        return Status::OK();
      }
      FreeDevice(got);
      if (attempt >= 3) {
        return Status::Unavailable("LoadBack: the match kept changing under concurrent loads");
      }
    }
  }

  // What a LoadBack did so far (one copy, or several when it streams a prefetch).
  struct LoadRun {
    LoadBackResult out;
    int copies = 0;
  };

  // One load-back copy: the host part of `handle`'s match (after its device part), unless shorter
  // than `min_tokens`, to freshly allocated device slots, published once submitted (GPU) or done
  // (cpu). The lock is dropped while the copy is submitted; held again on return. A copy that
  // fails returns its error; its device pages stay with it until it is known to have finished.
  Status LoadHostPart(CacheLock& lk, MatchHandle handle, CudaStream stream, int64_t min_tokens,
                      CacheWork* work, LoadRun* run) KVTIER_REQUIRES(kCacheLock) {
    const auto start = CacheClock::now();
    LoadPlan plan;
    KVTIER_RETURN_IF_ERROR(PlanLoad(lk, handle, min_tokens, work, &plan));
    if (plan.tokens == 0) {  // nothing to load (or below min_tokens)
      run->out.skipped_tokens += plan.skipped_tokens;
      counters.load_back_skipped_tokens += plan.skipped_tokens;
      return Status::OK();
    }
    std::shared_ptr<CopyOp> op = executor.MakeLoad(plan.host_nodes, plan.alloc, plan.tokens, start);
    std::vector<std::shared_ptr<CudaEventHandle>> fences;
    if (gpu) fences = ledger->write_fences();
    lk.Release();
    executor.Run(*work);
    const Status st = executor.RunLoad(*op, stream, fences);
    lk.Reacquire();
    if (!st.ok()) {
      op->unpublished = false;  // reapable: nothing is published
      // The copy may still write its pages (GPU): they stay with the op until it has completed.
      Reap(work);
      return st.WithContext("LoadBack");
    }
    run->out.loaded_tokens += executor.PublishLoad(*op, plan.alloc) * P;
    ++run->copies;
    KVTIER_ASSIGN_OR_RETURN(HandleState * h, FindHandle(handle));
    if (gpu) h->loads.push_back(op);
    Reap(work);  // cpu: the copy has completed; frees what was not published
    if (!gpu) {  // synchronous: done now (a GPU copy counts its time when reaped, ReapLoad)
      const double seconds = SecondsSince(start);
      counters.load_back_seconds += seconds;
      counters.load_back_duration.Observe(seconds);
    }
    return Status::OK();
  }

  // Whether LoadBack streams `h`'s prefetch: stream_load_back, a prefetch running under a policy
  // that waits for it, and the expected load (host part and the storage tokens requested) not
  // below load_back_min_tokens.
  bool StreamsPrefetch(const HandleState& h) const KVTIER_REQUIRES(kCacheLock) {
    return h.prefetch && config.storage.stream_load_back &&
           h.prefetch_policy != PrefetchPolicy::kBestEffort &&
           HostPart(h, nullptr) + h.prefetch->tokens >= config.load_back_min_tokens;
  }

  // A streamed LoadBack of `op`, the handle's running prefetch: the host part is copied at once,
  // then each further piece of the prefetch's prefix as it arrives — handed to the tree
  // (Prefetcher::HandOverArrived), then loaded as host pages — while the rest is still read.
  // Pieces that arrive out of order wait for the pages before them (the arrived prefix only
  // grows in order). When the arrival is final (every page read, or the first page that did not
  // arrive known) or the timeout policy's deadline passed, the prefetch is concluded as
  // FinishPrefetch would (run->out.prefetch); the caller's last copy takes what that handed over.
  // Returns with the lock held; errors as LoadHostPart (the prefetch keeps running then).
  Status StreamLoad(CacheLock& lk, MatchHandle handle, const std::shared_ptr<CopyOp>& op,
                    CudaStream stream, CacheWork* work, LoadRun* run) KVTIER_REQUIRES(kCacheLock) {
    for (;;) {
      KVTIER_ASSIGN_OR_RETURN(HandleState * h, FindHandle(handle));
      if (h->prefetch != op) return Status::OK();  // another call ended it meanwhile
      const auto deadline = h->prefetch_policy == PrefetchPolicy::kTimeout
                                ? op->deadline
                                : CacheClock::time_point::max();
      const int64_t arrived = tracker.ArrivedPages(*op);
      prefetcher.HandOverArrived(*h, arrived);
      KVTIER_RETURN_IF_ERROR(LoadHostPart(lk, handle, stream, 0, work, run));
      lk.Release();
      executor.Run(*work);
      const CopyTracker::Arrival next = tracker.WaitArrival(*op, arrived, deadline);
      lk.Reacquire();
      KVTIER_RETURN_IF_ERROR(CheckHealth());
      Reap(work);
      if (next.final || CacheClock::now() >= deadline) break;
    }
    KVTIER_ASSIGN_OR_RETURN(HandleState * h, FindHandle(handle));
    if (h->prefetch == op) run->out.prefetch = prefetcher.Conclude(*h, /*cancelled=*/false, work);
    return Status::OK();
  }
};

}  // namespace kvtier
