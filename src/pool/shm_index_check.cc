// Internal: the whole-segment passes of a shared host pool's page index (see shm_page_index.h):
// laying out an empty index, repairing it after a process died holding its lock, checking every
// invariant (`kvtier shm inspect --check`) and counting it for Inspect.
//
// Invariants (with the lock held and no repair pending; CheckInvariants tests every one):
//   - a page is EMPTY, WRITING or READY; WRITING pages name an attached writer, others none;
//   - readers(page) = sum over processes of refs[page][process]; only READY pages have any, and
//     only attached processes hold any;
//   - the free list holds exactly the EMPTY pages, free_count of them;
//   - the LRU list holds exactly the READY pages, ready_count of them, in non-decreasing
//     last_use order; clock >= every last_use;
//   - every READY or WRITING page is in the chain of its bucket exactly once, chains hold
//     nothing else, and no two such pages share (namespace hash, key).
//
// Thread safety: see shm_page_index.h.
#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <new>
#include <vector>

#include "pool/shm_index_locked.h"
#include "pool/shm_page_index.h"
#include "util/log.h"

namespace kvtier::shm {

Status PageIndex::Initialize(std::byte* base, const SegmentLayout& layout,
                             const KvGeometry& geometry, bool mla, bool huge_pages) {
  auto* h = new (base) SegmentHeader{};
  h->version = kSegmentVersion;
  h->header_bytes = sizeof(SegmentHeader);
  h->segment_bytes = layout.segment_bytes;
  h->layout = static_cast<uint32_t>(geometry.layout);
  h->mla = mla ? 1 : 0;
  h->num_layers = geometry.num_layers;
  h->num_slots = geometry.num_slots;
  h->slot_bytes = geometry.slot_bytes;
  h->page_size = geometry.page_size;
  h->head_num = geometry.head_num;
  h->num_pages = layout.num_pages;
  h->max_processes = layout.max_processes;
  h->huge_pages = huge_pages ? 1 : 0;
  h->process_offset = layout.process_offset;
  h->page_offset = layout.page_offset;
  h->refs_offset = layout.refs_offset;
  h->bucket_offset = layout.bucket_offset;
  h->num_buckets = layout.num_buckets;
  h->child_bucket_offset = layout.child_bucket_offset;
  h->data_offset = layout.data_offset;
  h->buffer_bytes = static_cast<uint64_t>(layout.buffer_bytes);
  h->buffer_stride = static_cast<uint64_t>(layout.buffer_stride);

  pthread_mutexattr_t attr;
  pthread_mutexattr_init(&attr);
  int rc = pthread_mutexattr_setpshared(&attr, PTHREAD_PROCESS_SHARED);
  if (rc == 0) rc = pthread_mutexattr_setrobust(&attr, PTHREAD_MUTEX_ROBUST);
  if (rc == 0) rc = pthread_mutex_init(&h->lock, &attr);
  pthread_mutexattr_destroy(&attr);
  if (rc != 0) {
    return Status::Internal(
        fmt::format("shared host pool: a robust process-shared mutex could not be made: {}",
                    std::strerror(rc)));
  }

  auto* processes = reinterpret_cast<ProcessRecord*>(base + layout.process_offset);
  for (int s = 0; s < layout.max_processes; ++s) new (&processes[s]) ProcessRecord{};
  auto* pages = reinterpret_cast<PageRecord*>(base + layout.page_offset);
  for (int64_t p = 0; p < layout.num_pages; ++p) {
    PageRecord* r = new (&pages[p]) PageRecord{};
    r->state = static_cast<uint32_t>(PageState::kEmpty);
    r->writer = r->hash_next = r->child_next = r->lru_prev = r->lru_next = kNone;
    r->free_next = p + 1 < layout.num_pages ? static_cast<int32_t>(p + 1) : kNone;
  }
  auto* buckets = reinterpret_cast<int32_t*>(base + layout.bucket_offset);
  std::fill(buckets, buckets + layout.num_buckets, kNone);
  auto* child_buckets = reinterpret_cast<int32_t*>(base + layout.child_bucket_offset);
  std::fill(child_buckets, child_buckets + layout.num_buckets, kNone);
  h->free_head = 0;
  h->free_count = layout.num_pages;
  h->lru_head = h->lru_tail = kNone;
  return Status::OK();
}

void PageIndex::Locked::Repair() {
  SegmentHeader& hd = h();
  ++hd.lock_recoveries;
  for (int s = 0; s < max_processes(); ++s) {
    if (process(s).state > static_cast<uint32_t>(ProcessState::kAttached)) {
      process(s).state = static_cast<uint32_t>(ProcessState::kFree);
    }
  }
  uint64_t max_use = hd.clock;
  for (int64_t p = 0; p < num_pages(); ++p) {
    PageRecord& r = page(p);
    if (r.state > static_cast<uint32_t>(PageState::kReady)) {
      r.state = static_cast<uint32_t>(PageState::kEmpty);
    }
    if (state(p) == PageState::kWriting && !SlotAttached(r.writer)) {
      r.state = static_cast<uint32_t>(PageState::kEmpty);
    }
    if (state(p) != PageState::kWriting) r.writer = kNone;
    uint32_t readers = 0;
    for (int s = 0; s < max_processes(); ++s) {
      if (state(p) != PageState::kReady || !SlotAttached(s)) refs(p, s) = 0;
      readers += refs(p, s);
    }
    r.readers = readers;
    if (r.has_parent > 1) r.has_parent = 0;
    r.children = 0;
    r.hash_next = r.child_next = r.free_next = r.lru_prev = r.lru_next = kNone;
    max_use = std::max(max_use, r.last_use);
  }
  hd.clock = max_use;
  // Hash chains, dropping an unreferenced duplicate (only a corrupted segment has one).
  for (uint64_t b = 0; b <= ix_->bucket_mask_; ++b) ix_->buckets_[b] = kNone;
  for (int64_t p = 0; p < num_pages(); ++p) {
    PageRecord& r = page(p);
    if (state(p) == PageState::kEmpty) continue;
    if (Find(r.namespace_hash, r.key) != kNone && r.readers == 0) {
      r.state = static_cast<uint32_t>(PageState::kEmpty);
      r.writer = kNone;
      continue;
    }
    HashInsert(static_cast<int32_t>(p));
  }
  // Child chains and counts: every resident page naming a parent, counted by that parent when
  // it is resident.
  for (uint64_t b = 0; b <= ix_->bucket_mask_; ++b) ix_->child_buckets_[b] = kNone;
  for (int64_t p = 0; p < num_pages(); ++p) {
    PageRecord& r = page(p);
    if (state(p) == PageState::kEmpty || r.has_parent != 1) continue;
    int32_t& head = ChildBucket(r.namespace_hash, r.parent);
    r.child_next = head;
    head = static_cast<int32_t>(p);
    const int64_t parent = ParentOf(p);
    if (parent != kNone) ++page(parent).children;
  }
  // Free list (lowest page first) and LRU list (by last use).
  hd.free_head = kNone;
  hd.free_count = 0;
  for (int64_t p = num_pages() - 1; p >= 0; --p) {
    if (state(p) == PageState::kEmpty) FreePush(static_cast<int32_t>(p));
  }
  std::vector<int32_t> ready;
  for (int64_t p = 0; p < num_pages(); ++p) {
    if (state(p) == PageState::kReady) ready.push_back(static_cast<int32_t>(p));
  }
  std::stable_sort(ready.begin(), ready.end(),
                   [&](int32_t a, int32_t b) { return page(a).last_use < page(b).last_use; });
  hd.lru_head = hd.lru_tail = kNone;
  for (int32_t p : ready) LruAppend(p);
  hd.ready_count = static_cast<int64_t>(ready.size());
  ReapDead();
}

Status PageIndex::Locked::CheckPageRecords(int64_t* empty, int64_t* writing, int64_t* ready) {
  const SegmentHeader& hd = h();
  for (int64_t p = 0; p < num_pages(); ++p) {
    const PageRecord& r = page(p);
    if (r.state > static_cast<uint32_t>(PageState::kReady)) {
      return Status::Corruption(fmt::format("page {} has state {}", p, r.state));
    }
    if (state(p) == PageState::kWriting) {
      ++*writing;
      if (!SlotAttached(r.writer)) {
        return Status::Corruption(fmt::format(
            "page {} is WRITING for process record {}, which is not attached", p, r.writer));
      }
    } else if (r.writer != kNone) {
      return Status::Corruption(
          fmt::format("page {} is not WRITING but names writer {}", p, r.writer));
    }
    if (state(p) == PageState::kEmpty) ++*empty;
    if (state(p) == PageState::kReady) ++*ready;
    uint64_t sum = 0;
    for (int s = 0; s < max_processes(); ++s) {
      const uint16_t n = refs(p, s);
      if (n != 0 && !SlotAttached(s)) {
        return Status::Corruption(fmt::format(
            "page {} has {} reference(s) of process record {}, which is not attached", p, n, s));
      }
      sum += n;
    }
    if (sum != r.readers) {
      return Status::Corruption(fmt::format(
          "page {} counts {} readers but its per-process references sum to {}", p, r.readers, sum));
    }
    if (sum != 0 && state(p) != PageState::kReady) {
      return Status::Corruption(fmt::format("page {} has readers but is not READY", p));
    }
    if (r.last_use > hd.clock) {
      return Status::Corruption(
          fmt::format("page {} was used at {}, after the clock {}", p, r.last_use, hd.clock));
    }
    if (r.has_parent > 1) {
      return Status::Corruption(fmt::format("page {} has has_parent = {}", p, r.has_parent));
    }
    if (state(p) == PageState::kEmpty && r.children != 0) {
      return Status::Corruption(fmt::format("EMPTY page {} counts {} children", p, r.children));
    }
  }
  return Status::OK();
}

Status PageIndex::Locked::CheckLists(int64_t empty, int64_t ready) {
  const SegmentHeader& hd = h();
  // Free list.
  std::vector<uint8_t> seen(static_cast<size_t>(num_pages()), 0);
  int64_t n = 0;
  for (int32_t p = hd.free_head; p != kNone; p = page(p).free_next) {
    if (p < 0 || p >= num_pages() || seen[p] != 0 || state(p) != PageState::kEmpty) {
      return Status::Corruption(fmt::format(
          "free list: entry {} after {} entries is out of range, repeated or not EMPTY", p, n));
    }
    seen[p] = 1;
    ++n;
  }
  if (n != empty || hd.free_count != empty) {
    return Status::Corruption(
        fmt::format("free list holds {} pages, free_count says {}, {} pages are EMPTY", n,
                    hd.free_count, empty));
  }
  // LRU list.
  std::fill(seen.begin(), seen.end(), 0);
  n = 0;
  int32_t prev = kNone;
  uint64_t last = 0;
  for (int32_t p = hd.lru_head; p != kNone; prev = p, p = page(p).lru_next) {
    if (p < 0 || p >= num_pages() || seen[p] != 0 || state(p) != PageState::kReady ||
        page(p).lru_prev != prev || page(p).last_use < last) {
      return Status::Corruption(fmt::format(
          "LRU list: entry {} after {} entries is out of range, repeated, not READY, badly "
          "linked or out of order",
          p, n));
    }
    seen[p] = 1;
    last = page(p).last_use;
    ++n;
  }
  if (hd.lru_tail != prev || n != ready || hd.ready_count != ready) {
    return Status::Corruption(fmt::format(
        "LRU list holds {} pages (tail {}, expected {}), ready_count says {}, {} pages are "
        "READY",
        n, hd.lru_tail, prev, hd.ready_count, ready));
  }
  return Status::OK();
}

Status PageIndex::Locked::CheckHashChains(int64_t resident) {
  std::vector<uint8_t> seen(static_cast<size_t>(num_pages()), 0);
  int64_t n = 0;
  for (uint64_t b = 0; b <= ix_->bucket_mask_; ++b) {
    for (int32_t p = ix_->buckets_[b]; p != kNone; p = page(p).hash_next) {
      if (p < 0 || p >= num_pages() || seen[p] != 0 || state(p) == PageState::kEmpty ||
          (KeyHash(page(p).namespace_hash, page(p).key) & ix_->bucket_mask_) != b) {
        return Status::Corruption(fmt::format(
            "hash bucket {}: page {} is out of range, repeated, EMPTY or in the wrong bucket", b,
            p));
      }
      seen[p] = 1;
      ++n;
      if (Find(page(p).namespace_hash, page(p).key) != p) {
        return Status::Corruption(fmt::format("page {} shares its namespace and key with page {}",
                                              p, Find(page(p).namespace_hash, page(p).key)));
      }
    }
  }
  if (n != resident) {
    return Status::Corruption(
        fmt::format("hash chains hold {} pages but {} are READY or WRITING", n, resident));
  }
  return Status::OK();
}

Status PageIndex::Locked::CheckChildChains() {
  // Each resident page naming a parent is in the child chain of its parent's key, once; the
  // chains hold nothing else.
  std::vector<uint8_t> seen(static_cast<size_t>(num_pages()), 0);
  int64_t n = 0, linked = 0;
  for (uint64_t b = 0; b <= ix_->bucket_mask_; ++b) {
    for (int32_t p = ix_->child_buckets_[b]; p != kNone; p = page(p).child_next) {
      if (p < 0 || p >= num_pages() || seen[p] != 0 || state(p) == PageState::kEmpty ||
          page(p).has_parent != 1 ||
          (KeyHash(page(p).namespace_hash, page(p).parent) & ix_->bucket_mask_) != b) {
        return Status::Corruption(fmt::format(
            "child bucket {}: page {} is out of range, repeated, EMPTY, names no parent or is in "
            "the wrong bucket",
            b, p));
      }
      seen[p] = 1;
      ++n;
    }
  }
  for (int64_t p = 0; p < num_pages(); ++p) {
    if (state(p) == PageState::kEmpty) continue;
    if (page(p).has_parent == 1) ++linked;
    const uint32_t children = CountChildren(p);
    if (page(p).children != children) {
      return Status::Corruption(
          fmt::format("page {} counts {} children but {} resident pages name it as parent", p,
                      page(p).children, children));
    }
  }
  if (n != linked) {
    return Status::Corruption(
        fmt::format("child chains hold {} pages but {} resident pages name a parent", n, linked));
  }
  return Status::OK();
}

Status PageIndex::Locked::CheckInvariants() {
  int64_t empty = 0, writing = 0, ready = 0;
  KVTIER_RETURN_IF_ERROR(CheckPageRecords(&empty, &writing, &ready));
  KVTIER_RETURN_IF_ERROR(CheckLists(empty, ready));
  KVTIER_RETURN_IF_ERROR(CheckHashChains(ready + writing));
  return CheckChildChains();
}

bool PageIndex::Locked::Reachable(int64_t p, std::vector<uint8_t>* memo) {
  enum : uint8_t { kUnknown = 0, kYes = 1, kNo = 2, kOnPath = 3 };
  std::vector<int64_t> path;
  uint8_t result = kNo;
  for (int64_t q = p;;) {
    const uint8_t known = (*memo)[static_cast<size_t>(q)];
    if (known == kYes || known == kNo) {
      result = known;
      break;
    }
    if (known == kOnPath) break;  // a cycle of links: no first page leads here
    (*memo)[static_cast<size_t>(q)] = kOnPath;
    path.push_back(q);
    if (page(q).has_parent != 1) {
      result = kYes;  // a first page (or one whose parent is not known)
      break;
    }
    const int64_t parent = ParentOf(q);
    if (parent == kNone) break;  // its parent is not resident
    q = parent;
  }
  for (int64_t q : path) (*memo)[static_cast<size_t>(q)] = result;
  return result == kYes;
}

Status PageIndex::Inspect(int caller_slot, SharedHostPoolInfo* info) {
  KVTIER_ASSIGN_OR_RETURN(Locked ix, Locked::Acquire(this));
  const SegmentHeader& hd = ix.h();
  info->num_pages = num_pages_;
  info->max_processes = max_processes_;
  info->clock = hd.clock;
  info->lock_recoveries = hd.lock_recoveries;
  info->reaped_processes = hd.reaped_processes;
  info->reclaimed_writing_pages = hd.reclaimed_writing_pages;
  info->dropped_refs = hd.dropped_refs;
  info->evictions = hd.evictions;
  info->evictions_with_children = hd.evictions_with_children;
  info->empty_pages = info->writing_pages = info->ready_pages = info->pinned_pages = 0;
  info->unreachable_pages = 0;
  std::vector<uint8_t> reachable(static_cast<size_t>(num_pages_), 0);
  info->processes.clear();
  std::vector<SharedHostPoolInfo::Process> procs(static_cast<size_t>(max_processes_));
  for (int64_t p = 0; p < num_pages_; ++p) {
    const PageRecord& r = ix.page(p);
    switch (ix.state(p)) {
      case PageState::kEmpty:
        ++info->empty_pages;
        break;
      case PageState::kWriting:
        ++info->writing_pages;
        if (r.writer >= 0 && r.writer < max_processes_) ++procs[r.writer].writing_pages;
        break;
      case PageState::kReady:
      default:
        ++info->ready_pages;
        if (!ix.Reachable(p, &reachable)) ++info->unreachable_pages;
        break;
    }
    if (r.readers > 0) ++info->pinned_pages;
    for (int s = 0; s < max_processes_; ++s) {
      const uint16_t n = ix.refs(p, s);
      if (n == 0) continue;
      procs[s].pinned_refs += n;
      ++procs[s].pinned_pages;
    }
  }
  for (int s = 0; s < max_processes_; ++s) {
    if (!ix.SlotAttached(s)) continue;
    SharedHostPoolInfo::Process proc = procs[s];
    proc.slot = s;
    proc.pid = ix.process(s).pid;
    proc.start_time = ix.process(s).start_time;
    proc.alive = ProcessAlive(proc.pid, proc.start_time);
    proc.is_caller = s == caller_slot;
    info->processes.push_back(proc);
  }
  return Status::OK();
}

Status PageIndex::CheckInvariants() {
  KVTIER_ASSIGN_OR_RETURN(Locked ix, Locked::Acquire(this));
  return ix.CheckInvariants();
}

}  // namespace kvtier::shm
