// The prefetcher (see cache/prefetcher.h).
#include "cache/prefetcher.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "cache/backup_planner.h"
#include "cache/tier_evictor.h"

namespace kvtier {

Prefetcher::Snapshot Prefetcher::TakeSnapshot(CopyOp& op) {
  Snapshot s;
  core_.tracker.Snapshot(op, &s.statuses, &s.batches, &s.status);
  s.batch_pages = op.batch_pages;
  s.total = static_cast<int64_t>(s.statuses.size());
  while (s.arrived < s.total && s.BatchDone(s.arrived) &&
         s.statuses[static_cast<size_t>(s.arrived)] == PageStatus::kOk) {
    ++s.arrived;
  }
  if (s.arrived < s.total && s.BatchDone(s.arrived)) {
    const PageStatus first = s.statuses[static_cast<size_t>(s.arrived)];
    if (first == PageStatus::kAbsent || first == PageStatus::kCorrupt ||
        first == PageStatus::kWrongNamespace) {
      s.gone_from = s.arrived;
    }
  }
  return s;
}

int64_t Prefetcher::HandOver(CopyOp& op, Snapshot& s, std::vector<int64_t>* to_free) {
  std::vector<RadixNode*> nodes = op.nodes;
  SortTopDown(&nodes);
  core_.ClearBusy(op);
  for (RadixNode* n : nodes) core_.tree.SetPrefetching(n, false);
  int64_t pos = op.handed_pages;  // page index into op.pages (those before: streamed already)
  int64_t used = 0;
  for (RadixNode* n : nodes) {
    if (pos >= s.total) break;
    const int64_t np = n->num_tokens() / core_.P;
    const int64_t have = std::clamp<int64_t>(s.arrived - pos, 0, np);
    if (s.gone_from >= pos && s.gone_from < pos + np) {
      // From this node's page (gone_from - pos) on, storage no longer has the prefix.
      const int64_t keep = s.gone_from - pos;
      if (keep > 0) core_.tree.SplitAfter(n, keep);  // n keeps its identity as the lower part
      MarkGone(n);
      if (keep > 0) n = n->parent();
    }
    if (have > 0) {
      RadixNode* target = n;
      if (have < n->num_tokens() / core_.P) target = core_.tree.SplitAfter(n, have)->parent();
      const bool parent_ok = target->parent()->is_root() || target->parent()->on_host();
      std::vector<int64_t> slice(op.pages.begin() + pos, op.pages.begin() + pos + have);
      if (!target->on_host() && parent_ok) {
        core_.tree.SetHostPages(target, std::move(slice));
        used += have;
      } else {
        to_free->insert(to_free->end(), slice.begin(), slice.end());
        s.arrived = pos;  // the prefix ends here
      }
    }
    pos += np;
    if (have < np) break;
  }
  return used;
}

int64_t Prefetcher::HandOverArrived(HandleState& h, int64_t arrived) {
  CopyOp& op = *h.prefetch;
  std::vector<RadixNode*> nodes = op.nodes;
  SortTopDown(&nodes);
  int64_t pos = op.handed_pages;
  for (RadixNode* n : nodes) {
    if (pos >= arrived) break;
    const bool parent_ok = n->parent()->is_root() || n->parent()->on_host();
    if (n->on_host() || !parent_ok) break;  // Conclude sorts it out (the prefix ends there)
    const int64_t np = n->num_tokens() / core_.P;
    const int64_t have = std::min(arrived - pos, np);
    // A split lists the new upper part in op.nodes with n's busy mark (the split hook).
    RadixNode* target = have < np ? core_.tree.SplitAfter(n, have)->parent() : n;
    core_.tree.RemoveBusy(target);
    std::erase(op.nodes, target);
    core_.tree.SetPrefetching(target, false);
    core_.tree.SetHostPages(
        target, std::vector<int64_t>(op.pages.begin() + pos, op.pages.begin() + pos + have));
    pos += have;
  }
  const int64_t handed = pos - op.handed_pages;
  op.handed_pages = pos;
  filling_pages_ -= handed;
  return handed;
}

void Prefetcher::ReleaseUnused(CopyOp& op, const Snapshot& s, int64_t used,
                               std::vector<int64_t> to_free) {
  for (int64_t i = op.handed_pages + used; i < s.total; ++i) {
    const int64_t page = op.pages[static_cast<size_t>(i)];
    if (std::find(to_free.begin(), to_free.end(), page) != to_free.end()) continue;
    if (s.BatchDone(i)) {
      to_free.push_back(page);
    } else {
      op.free_on_completion.push_back(page);
    }
  }
  core_.FreeHost(to_free);
  filling_pages_ -= s.total - op.handed_pages - static_cast<int64_t>(op.free_on_completion.size());
}

PrefetchState Prefetcher::CountConclusion(const CopyOp& op, const Snapshot& s, int64_t used,
                                          PrefetchPolicy policy, bool cancelled) {
  // The snapshot: batches may still complete.
  core_.CountStorageFaults(StorageIo::kRead, s.statuses, s.status);
  core_.counters.prefetched_tokens += used * core_.P;
  core_.counters.prefetch_bytes += used * core_.PageBytes();
  const double seconds = SecondsSince(op.start);
  core_.counters.prefetch_seconds += seconds;
  if (used > 0 && seconds > 0) {
    core_.counters.prefetch_bandwidth.Observe(static_cast<double>(used * core_.PageBytes()) /
                                              seconds / 1e9);
  }
  if (cancelled) ++core_.counters.prefetch_cancelled;
  const bool past_deadline = CacheClock::now() >= op.deadline;
  if (used == s.total) {
    ++core_.counters.prefetch_complete;
    return PrefetchState::kComplete;
  }
  if (policy == PrefetchPolicy::kTimeout && past_deadline && !cancelled && s.gone_from < 0) {
    ++core_.counters.prefetch_timed_out;
    ++core_.counters.storage_read_timeouts;
    return PrefetchState::kTimedOut;
  }
  ++core_.counters.prefetch_partial;
  return PrefetchState::kPartial;
}

PrefetchResult Prefetcher::Conclude(HandleState& h, bool cancelled, CacheWork* work) {
  std::shared_ptr<CopyOp> op = std::move(h.prefetch);
  h.prefetch.reset();
  PrefetchResult out;
  out.policy = h.prefetch_policy;
  out.requested_tokens = op->tokens;
  Snapshot s = TakeSnapshot(*op);
  // Arrived pages go to their nodes, top-down, while the host prefix stays contiguous.
  std::vector<int64_t> to_free;
  const int64_t used = HandOver(*op, s, &to_free);
  ReleaseUnused(*op, s, used, std::move(to_free));
  op->concluded = true;
  core_.tracker.Abandon(*op);  // a streamed LoadBack waiting for more pages stops waiting
  const int64_t arrived = op->handed_pages + used;
  out.arrived_tokens = arrived * core_.P;
  out.state = CountConclusion(*op, s, arrived, h.prefetch_policy, cancelled);
  out.host_tokens = HostTokensOf(h);
  RemoveCorrupt(*op, s, work);
  evictor_.TrimStorage(work);
  return out;
}

void Prefetcher::RemoveCorrupt(const CopyOp& op, const Snapshot& s, CacheWork* work) {
  std::vector<PageKey> corrupt;
  for (int64_t i = 0; i < s.total; ++i) {
    if (s.BatchDone(i) && s.statuses[static_cast<size_t>(i)] == PageStatus::kCorrupt) {
      corrupt.push_back(op.keys[static_cast<size_t>(i)]);
    }
  }
  planner_.RemoveFromStorage(corrupt, work);
}

void Prefetcher::MarkGone(RadixNode* node) {
  std::vector<RadixNode*> stack = {node};
  while (!stack.empty()) {
    RadixNode* n = stack.back();
    stack.pop_back();
    core_.tree.SetStored(n, false);
    n->ForEachChild([&](RadixNode* c) {
      if (!c->on_device() && !c->on_host()) stack.push_back(c);
    });
  }
}

int64_t Prefetcher::HostTokensOf(const HandleState& h) const {
  int64_t t = 0;
  for (RadixNode* n : CacheCore::Path(h.last)) {
    if (n->on_device()) continue;
    if (!n->on_host()) break;
    t += n->num_tokens();
  }
  return t;
}

PrefetchResult Prefetcher::Progress(HandleState& h) {
  PrefetchResult out;
  out.policy = h.prefetch_policy;
  out.host_tokens = HostTokensOf(h);
  if (!h.prefetch) return out;
  out.state = PrefetchState::kRunning;
  out.requested_tokens = h.prefetch->tokens;
  out.arrived_tokens = core_.tracker.ArrivedPages(*h.prefetch) * core_.P;
  return out;
}

int64_t Prefetcher::StoragePart(const HandleState& h, std::vector<RadixNode*>* part) const {
  int64_t tokens = 0;
  for (RadixNode* n : CacheCore::Path(h.last)) {
    if (n->on_device() || n->on_host()) {
      if (!part->empty()) break;
      continue;
    }
    if (!n->stored() || n->prefetching() || n->keys().empty()) break;
    part->push_back(n);
    tokens += n->num_tokens();
  }
  return tokens;
}

int64_t Prefetcher::HostPagesFor(int64_t tokens, CacheWork* work) {
  const int64_t cap =
      static_cast<int64_t>(std::floor(core_.config.storage.max_prefetch_host_fraction *
                                      static_cast<double>(core_.host->num_pages())));
  int64_t pages = std::min(tokens / core_.P, cap - filling_pages_);
  if (pages > 0 && !evictor_.EnsureHostPages(pages, work)) {
    pages = std::min(pages, core_.host->free_pages());
  }
  return pages;
}

std::shared_ptr<CopyOp> Prefetcher::MakePrefetch(const std::vector<RadixNode*>& part,
                                                 std::vector<int64_t> host_pages, bool streamed) {
  const int64_t pages = static_cast<int64_t>(host_pages.size());
  const StorageTierConfig& sc = core_.config.storage;
  auto op = std::make_shared<CopyOp>();
  op->kind = CopyOp::Kind::kPrefetch;
  op->tokens = pages * core_.P;
  op->start = CacheClock::now();
  const double budget =
      std::min(sc.prefetch_timeout_max_s,
               sc.prefetch_timeout_base_s +
                   sc.prefetch_timeout_per_1k_tokens_s * static_cast<double>(op->tokens) / 1024.0);
  op->deadline = op->start + std::chrono::duration_cast<CacheClock::duration>(
                                 std::chrono::duration<double>(budget));
  op->pages = std::move(host_pages);
  op->batch_pages = std::min(sc.max_prefetch_batch_pages, core_.storage->options().max_batch_pages);
  if (streamed) {
    // Pages arrive a batch at a time: a streamed load overlaps all but the last batch's copy
    // with the reads, so the read is cut into at least kStreamBatches batches (of at least
    // kMinStreamBatchPages pages: one storage call each).
    constexpr int64_t kStreamBatches = 8;
    constexpr int64_t kMinStreamBatchPages = 4;
    op->batch_pages =
        std::min(op->batch_pages, std::max(kMinStreamBatchPages, PagesFor(pages, kStreamBatches)));
  }
  int64_t left = pages;
  for (RadixNode* n : part) {
    if (left <= 0) break;
    const int64_t np = n->num_tokens() / core_.P;
    const int64_t take = std::min(np, left);
    for (int64_t i = 0; i < take; ++i) {
      op->keys.push_back(n->keys()[static_cast<size_t>(i)]);
    }
    core_.tree.SetPrefetching(n, true);
    core_.MarkBusy(*op, n);
    left -= take;
  }
  op->page_status.assign(static_cast<size_t>(pages), PageStatus::kSkipped);
  op->batch_done.assign(static_cast<size_t>(op->num_batches()), 0);
  op->batches_left = op->num_batches();
  return op;
}

Result<PrefetchResult> Prefetcher::Start(HandleState& h, PrefetchPolicy policy, CacheWork* work) {
  PrefetchResult out;
  h.prefetch_policy = policy;
  out.policy = policy;
  out.host_tokens = HostTokensOf(h);
  if (!core_.storage) return out;
  std::vector<RadixNode*> part;
  const int64_t tokens = StoragePart(h, &part);
  if (tokens == 0) return out;
  ++core_.counters.prefetch_calls;
  if (!part.front()->parent()->is_root() && !part.front()->parent()->on_host()) {
    // Host copies form a prefix: pages after a device-only node have nowhere to go.
    core_.counters.prefetch_no_room_tokens += tokens;
    return out;
  }
  const int64_t threshold = core_.config.storage.prefetch_threshold_tokens;
  if (tokens < threshold) {
    core_.counters.prefetch_below_threshold_tokens += tokens;
    return out;
  }
  // Never slower than recomputing: the tokens after the cut are left to the engine's prefill.
  out.cut = core_.CutFor(tokens);
  if (out.cut.tokens >= tokens) return out;
  const int64_t pages = HostPagesFor(tokens - out.cut.tokens, work);
  if (pages <= 0 || pages * core_.P < std::min(tokens, threshold)) {
    core_.counters.prefetch_no_room_tokens += tokens;
    return out;
  }
  // The local tier (a shared one has no storage tier below it): every page is kWrite.
  KVTIER_ASSIGN_OR_RETURN(std::vector<HostTier::Page> acquired, core_.host->Acquire(pages, {}));
  std::vector<int64_t> host_pages;
  host_pages.reserve(acquired.size());
  for (const HostTier::Page& pg : acquired) host_pages.push_back(pg.start);
  const bool streamed =
      core_.config.storage.stream_load_back && policy != PrefetchPolicy::kBestEffort;
  std::shared_ptr<CopyOp> op = MakePrefetch(part, std::move(host_pages), streamed);
  filling_pages_ += pages;
  core_.counters.prefetch_requested_tokens += op->tokens;
  h.prefetch = op;
  core_.tracker.Add(op);
  work->storage.push_back(op);
  out.state = PrefetchState::kRunning;
  out.requested_tokens = op->tokens;
  return out;
}

void Prefetcher::ReapPrefetch(const std::shared_ptr<CopyOp>& op) {
  if (!op->concluded) {
    core_.tracker.Add(op);  // its handle takes the result; it stays accounted until then
    return;
  }
  core_.FreeHost(op->free_on_completion);
  filling_pages_ -= static_cast<int64_t>(op->free_on_completion.size());
  op->free_on_completion.clear();
}

}  // namespace kvtier
