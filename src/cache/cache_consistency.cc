// The cache's invariants, checked (see cache/cache_core.h).
#include <fmt/format.h>

#include <span>
#include <unordered_map>

#include "cache/cache_parts.h"

namespace kvtier {

namespace {

// What the handles and the operations in flight say the tree and the tiers must hold.
struct Expected {
  std::unordered_map<const RadixNode*, int64_t> refs;  // per node: handles pinning it
  std::unordered_map<const RadixNode*, int64_t> busy;  // per node: operations listing it
  int64_t copy_pages = 0;                              // load-backs' unpublished device pages
  int64_t filling = 0;                                 // prefetches' host pages
};

// Fills `e` and marks the prefetches' host pages in `host_seen` (Internal: one held twice, or the
// filling count differs from the recorded one).
Status ExpectFromHandlesAndOps(const CacheParts& s, Expected* e, std::vector<uint8_t>* host_seen)
    KVTIER_REQUIRES(kCacheLock) {
  for (const auto& [id, h] : s.handles) {
    for (const RadixNode* n = h.last; n != nullptr && !n->is_root(); n = n->parent()) {
      ++e->refs[n];
    }
  }
  for (const auto& op : s.tracker.ops()) {
    if (op->kind != CopyOp::Kind::kStore) {
      for (const RadixNode* n : op->nodes) ++e->busy[n];
    }
    if (op->kind == CopyOp::Kind::kLoad) {
      e->copy_pages += static_cast<int64_t>(op->free_on_completion.size());
    }
    if (op->kind == CopyOp::Kind::kPrefetch) {
      // Unconcluded: its pages after those handed to the tree already (a streamed LoadBack).
      const std::span<const int64_t> pages =
          op->concluded
              ? std::span<const int64_t>(op->free_on_completion)
              : std::span<const int64_t>(op->pages).subspan(static_cast<size_t>(op->handed_pages));
      e->filling += static_cast<int64_t>(pages.size());
      for (int64_t p : pages) {
        if ((*host_seen)[static_cast<size_t>(p / s.P)]++) {
          return Status::Internal(fmt::format("host page at slot {} held twice by prefetches", p));
        }
      }
    }
  }
  if (e->filling != s.prefetcher.filling_pages()) {
    return Status::Internal(fmt::format("filling host pages: prefetches hold {}, recorded {}",
                                        e->filling, s.prefetcher.filling_pages()));
  }
  return Status::OK();
}

// Storage writes of one key never overlap: `removing` counts exactly the keys of the removals
// in flight, no store that may be submitted names one of them, and every held store does.
Status CheckStorageWriteOrder(const CacheParts& s) KVTIER_REQUIRES(kCacheLock) {
  std::unordered_map<PageKey, int64_t, PageKeyHash> removals;
  s.tracker.ForEachOp([&](const std::shared_ptr<CopyOp>& op) {
    if (op->kind != CopyOp::Kind::kRemove) return;
    for (const PageKey& key : op->keys) ++removals[key];
  });
  if (removals != s.planner.removing()) {
    return Status::Internal(fmt::format("removals in flight name {} keys, {} recorded",
                                        removals.size(), s.planner.removing().size()));
  }
  Status st;
  s.tracker.ForEachOp([&](const std::shared_ptr<CopyOp>& op) KVTIER_REQUIRES(kCacheLock) {
    if (!st.ok()) return;
    if (op->held && op->kind != CopyOp::Kind::kStore) {
      st = Status::Internal("a held operation that is not a store");
    } else if (op->backlogged && (op->kind != CopyOp::Kind::kStore || op->held)) {
      st = Status::Internal("a backlogged operation that is not a store waiting for the queue");
    } else if (op->kind == CopyOp::Kind::kStore && !op->backlogged && !op->backlog_dropped &&
               op->held != s.planner.RemovalPending(op->keys)) {
      st = Status::Internal(
          op->held ? "a store is held though no removal of its keys is in flight"
                   : "a store may be submitted while a removal of one of its keys is in flight");
    }
  });
  return st;
}

}  // namespace

Status CheckCacheConsistency(const CacheParts& s) {
  KVTIER_RETURN_IF_ERROR(s.tree.CheckInvariants());
  KVTIER_RETURN_IF_ERROR(CheckStorageWriteOrder(s));
  if (s.events && s.events->nodes_without_keys() > 0) {  // they would be missing from the events
    return Status::Internal(fmt::format("kv events: {} tier changes of nodes without page keys",
                                        s.events->nodes_without_keys()));
  }
  const int64_t P = s.P;
  std::vector<uint8_t> dev_seen(static_cast<size_t>(s.ledger->num_pages()), 0);
  const HostTier* host = s.host.get();  // null without a host tier: the tree has no host pages
  std::vector<uint8_t> host_seen(
      static_cast<size_t>(host ? host->region().geometry.num_pages() : 0), 0);
  Expected e;
  KVTIER_RETURN_IF_ERROR(ExpectFromHandlesAndOps(s, &e, &host_seen));
  std::unordered_map<const RadixNode*, int64_t>& expected_refs = e.refs;
  std::unordered_map<const RadixNode*, int64_t>& expected_busy = e.busy;
  const int64_t copy_pages = e.copy_pages;
  const int64_t filling = e.filling;
  Status st;
  int64_t tree_pages = 0, host_pages = 0;
  s.tree.ForEachNode([&](const RadixNode& n) KVTIER_REQUIRES(kCacheLock) {
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

}  // namespace kvtier
