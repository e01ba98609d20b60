// Internal: the cross-process page index of a shared host pool (see shm_page_index.h): its
// runtime operations — attaching processes, reserving, committing, pinning and evicting pages —
// each under the index lock (shm_index_locked.h). The invariants they keep, and the repair and
// check passes over the whole segment, are in shm_index_check.cc.
//
// Thread safety: see shm_page_index.h.
#include "pool/shm_page_index.h"

#include <fmt/format.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <optional>
#include <string>
#include <unordered_map>

#include "pool/shm_index_locked.h"
#include "util/log.h"

namespace kvtier::shm {

namespace {

std::atomic<InLockHook> g_in_lock_hook{nullptr};

}  // namespace

void SetInLockHook(InLockHook hook) { g_in_lock_hook.store(hook, std::memory_order_relaxed); }

void InLockPoint(const char* where) {
  InLockHook hook = g_in_lock_hook.load(std::memory_order_relaxed);
  if (hook != nullptr) hook(where);
}

Result<PageIndex::Locked> PageIndex::Locked::Acquire(PageIndex* index) {
  timespec deadline{};
  clock_gettime(CLOCK_REALTIME, &deadline);
  deadline.tv_sec += kLockTimeoutSeconds;
  const int rc = pthread_mutex_timedlock(&index->header_->lock, &deadline);
  if (rc == ETIMEDOUT) {
    return Status::Unavailable(fmt::format(
        "shared host pool: the index lock was not free within {} s (a live process holds it; "
        "`kvtier shm inspect` lists the attached processes)",
        kLockTimeoutSeconds));
  }
  if (rc == ENOTRECOVERABLE) {
    return Status::Internal(
        "shared host pool: the index lock is not recoverable; remove the segment "
        "(`kvtier shm destroy`) and create it again");
  }
  if (rc != 0 && rc != EOWNERDEAD) {
    return Status::Internal(
        fmt::format("shared host pool: locking the index failed: {}", std::strerror(rc)));
  }
  Locked locked(index);
  if (rc == EOWNERDEAD) {
    util::Log(util::LogLevel::kWarning,
              "shared host pool: a process died holding the index lock; repairing the index");
    locked.Repair();
    pthread_mutex_consistent(&index->header_->lock);
  }
  return locked;
}

void PageIndex::Locked::ReleaseProcess(int s, bool dead) {
  ForgetEvictionScan();  // its references go: pages may become evictable
  for (int64_t p = 0; p < num_pages(); ++p) {
    uint16_t& r = refs(p, s);
    if (r != 0) {
      page(p).readers -= std::min<uint32_t>(page(p).readers, r);
      if (dead) h().dropped_refs += r;
      r = 0;
    }
    if (state(p) == PageState::kWriting && page(p).writer == s) {
      DropWriting(static_cast<int32_t>(p));
      if (dead) ++h().reclaimed_writing_pages;
    }
  }
  process(s).state = static_cast<uint32_t>(ProcessState::kFree);
  process(s).pid = 0;
  if (dead) ++h().reaped_processes;
}

int64_t PageIndex::Locked::ReapDead() {
  int64_t reaped = 0;
  for (int s = 0; s < max_processes(); ++s) {
    if (SlotAttached(s) && !ProcessAlive(process(s).pid, process(s).start_time)) {
      util::Log(util::LogLevel::kWarning,
                "shared host pool: process {} (record {}) died attached; releasing its pages",
                process(s).pid, s);
      ReleaseProcess(s, /*dead=*/true);
      ++reaped;
    }
  }
  return reaped;
}

PageIndex::PageIndex(std::byte* base)
    : header_(reinterpret_cast<SegmentHeader*>(base)),
      processes_(reinterpret_cast<ProcessRecord*>(base + header_->process_offset)),
      pages_(reinterpret_cast<PageRecord*>(base + header_->page_offset)),
      refs_(reinterpret_cast<uint16_t*>(base + header_->refs_offset)),
      buckets_(reinterpret_cast<int32_t*>(base + header_->bucket_offset)),
      child_buckets_(reinterpret_cast<int32_t*>(base + header_->child_bucket_offset)),
      num_pages_(header_->num_pages),
      max_processes_(header_->max_processes),
      bucket_mask_(header_->num_buckets - 1) {}

int64_t PageIndex::Locked::ParentOf(int64_t p) {
  const PageRecord& r = page(p);
  if (r.has_parent != 1) return kNone;
  const int64_t q = Find(r.namespace_hash, r.parent);
  return q == p ? kNone : q;
}

uint32_t PageIndex::Locked::CountChildren(int64_t p) {
  const PageRecord& r = page(p);
  uint32_t n = 0;
  int64_t steps = 0;
  for (int32_t c = ChildBucket(r.namespace_hash, r.key); c != kNone && steps <= num_pages();
       c = page(c).child_next, ++steps) {
    if (c < 0 || c >= num_pages()) break;  // only after corruption; CheckInvariants
    const PageRecord& child = page(c);
    if (c != p && child.has_parent == 1 && child.namespace_hash == r.namespace_hash &&
        std::memcmp(child.parent, r.key, 32) == 0) {
      ++n;
    }
  }
  return n;
}

void PageIndex::Locked::LinkResident(int32_t p) {
  PageRecord& r = page(p);
  r.children = CountChildren(p);
  r.child_next = kNone;
  if (r.has_parent != 1) return;
  int32_t& head = ChildBucket(r.namespace_hash, r.parent);
  r.child_next = head;
  head = p;
  const int64_t parent = ParentOf(p);
  if (parent != kNone) ++page(parent).children;
}

void PageIndex::Locked::UnlinkResident(int32_t p) {
  hint_.valid = false;  // its parent may have become a leaf
  PageRecord& r = page(p);
  r.children = 0;
  if (r.has_parent != 1) return;
  const int64_t parent = ParentOf(p);
  if (parent != kNone && page(parent).children > 0) --page(parent).children;
  int32_t* link = &ChildBucket(r.namespace_hash, r.parent);
  for (int64_t steps = 0; *link != kNone && steps <= num_pages(); ++steps) {
    if (*link < 0 || *link >= num_pages()) return;  // only after corruption; CheckInvariants
    if (*link == p) {
      *link = r.child_next;
      break;
    }
    link = &page(*link).child_next;
  }
  r.child_next = kNone;
}

void PageIndex::Locked::EvictPage(int32_t p) {
  LruRemove(p);
  --h().ready_count;
  InLockPoint("evict:unlinked");
  UnlinkResident(p);
  HashRemove(p);
  page(p).state = static_cast<uint32_t>(PageState::kEmpty);
  FreePush(p);
  ++h().evictions;
}

int32_t PageIndex::Locked::EvictOne(int32_t parent) {
  // While `parent` is an evictable leaf it is skipped, so it is an exception to the scan's
  // "nothing evictable before scan_from" as well: the scan is not remembered. (Reserve links the
  // new page to it at once, so it would stop being a leaf anyway; this keeps the hint exact
  // without relying on that.)
  const bool guarding = parent != kNone && EvictableLeaf(parent);
  int32_t victim = kNone;
  int32_t scan_from = h().lru_head;
  if (hint_.valid) {
    scan_from = hint_.scan_from;
    const int32_t p = hint_.parent;
    if (p != kNone && p != parent && EvictableLeaf(p) &&
        (scan_from == kNone || page(p).last_use < page(scan_from).last_use)) {
      victim = p;  // older than every page from scan_from on
    }
  }
  int32_t next_from = scan_from;
  if (victim == kNone) {
    int64_t steps = 0;
    for (int32_t p = scan_from; p != kNone && steps <= num_pages(); p = page(p).lru_next, ++steps) {
      if (p < 0 || p >= num_pages()) break;  // only after corruption; CheckInvariants
      if (p != parent && EvictableLeaf(p)) {
        victim = p;
        break;
      }
    }
    next_from = victim == kNone ? kNone : page(victim).lru_next;
  }
  if (victim == kNone) {
    if (guarding) return kNone;
    int64_t steps = 0;
    for (int32_t p = h().lru_head; p != kNone && steps <= num_pages();
         p = page(p).lru_next, ++steps) {
      if (p < 0 || p >= num_pages()) break;
      if (p != parent && page(p).readers == 0) {
        victim = p;
        break;
      }
    }
    if (victim == kNone) return kNone;
  }
  const int64_t victim_parent = ParentOf(victim);
  if (page(victim).children > 0) ++h().evictions_with_children;
  EvictPage(victim);
  hint_.valid = !guarding;
  hint_.scan_from = next_from;
  hint_.parent = static_cast<int32_t>(victim_parent);
  return victim;
}

Result<int> PageIndex::AttachProcess(int64_t pid, uint64_t start_time) {
  KVTIER_ASSIGN_OR_RETURN(Locked ix, Locked::Acquire(this));
  ix.ReapDead();
  for (int s = 0; s < max_processes_; ++s) {
    ProcessRecord& rec = ix.process(s);
    if (rec.state != static_cast<uint32_t>(ProcessState::kFree)) continue;
    rec.pid = pid;
    rec.start_time = start_time;
    rec.attach_clock = ix.h().clock;
    rec.state = static_cast<uint32_t>(ProcessState::kAttached);
    owner_pid_ = pid;
    owner_start_time_ = start_time;
    return s;
  }
  return Status::Unavailable(fmt::format(
      "shared host pool: all {} process records are held by live processes (create the segment "
      "with a larger max_processes)",
      max_processes_));
}

Status PageIndex::DetachProcess(int slot) {
  KVTIER_ASSIGN_OR_RETURN(Locked ix, Locked::Acquire(this));
  if (ix.CheckOwner(slot).ok()) ix.ReleaseProcess(slot, /*dead=*/false);
  return Status::OK();
}

Result<std::vector<PageReservation>> PageIndex::Reserve(
    int slot, uint64_t namespace_hash, std::span<const PageKey> keys,
    std::span<const std::optional<PageKey>> parents, bool pin_ready) {
  if (!parents.empty() && parents.size() != keys.size()) {
    return Status::InvalidArgument(
        fmt::format("shared host pool Reserve: {} parents for {} keys (give none or one per key)",
                    parents.size(), keys.size()));
  }
  KVTIER_ASSIGN_OR_RETURN(Locked ix, Locked::Acquire(this));
  KVTIER_RETURN_IF_ERROR(ix.CheckOwner(slot));
  std::vector<PageReservation> out(keys.size());
  bool reaped = false;
  std::vector<uint8_t> writer_alive(static_cast<size_t>(max_processes_), 0);  // checked live
  for (size_t i = 0; i < keys.size(); ++i) {
    const uint8_t* key = keys[i].bytes.data();
    int64_t found = ix.Find(namespace_hash, key);
    if (found != kNone && ix.state(found) == PageState::kWriting) {
      const int writer = ix.page(found).writer;
      if (writer != slot && writer_alive[writer] == 0 &&
          !ProcessAlive(ix.process(writer).pid, ix.process(writer).start_time)) {
        ix.ReleaseProcess(writer, /*dead=*/true);  // its unfinished page goes back to EMPTY
        found = kNone;
      } else {
        writer_alive[writer] = 1;  // one liveness check per writer and call
      }
    }
    if (found != kNone) {
      const bool ready = ix.state(found) == PageState::kReady;
      if (ready && pin_ready && !ix.Pin(found, slot)) {
        out[i] = {ReserveOutcome::kNoSpace, -1};  // this process holds too many references on it
        continue;
      }
      out[i] = {ready ? ReserveOutcome::kAlreadyReady : ReserveOutcome::kBeingWritten,
                ready ? found : -1};
      continue;
    }
    // A page naming a parent that is not resident would be unreachable: refused.
    const PageKey* parent_key =
        i < parents.size() && parents[i] && !(*parents[i] == keys[i]) ? &*parents[i] : nullptr;
    const auto parent = [&] {
      return parent_key == nullptr ? int64_t{kNone}
                                   : ix.Find(namespace_hash, parent_key->bytes.data());
    };
    if (parent_key != nullptr && parent() == kNone) {
      out[i] = {ReserveOutcome::kNoParent, -1};
      continue;
    }
    int32_t p = ix.FreePop();
    if (p == kNone && ix.EvictOne(static_cast<int32_t>(parent())) != kNone) p = ix.FreePop();
    if (p == kNone && !reaped) {
      reaped = true;
      if (ix.ReapDead() > 0) p = ix.FreePop();
    }
    if (p == kNone) {
      out[i] = {ReserveOutcome::kNoSpace, -1};
      continue;
    }
    if (parent_key != nullptr && parent() == kNone) {  // a dead writer's parent page was reaped
      ix.FreePush(p);
      out[i] = {ReserveOutcome::kNoParent, -1};
      continue;
    }
    InLockPoint("reserve:popped");
    PageRecord& r = ix.page(p);
    std::memcpy(r.key, key, 32);
    r.has_parent = parent_key != nullptr ? 1 : 0;
    if (parent_key != nullptr) {
      std::memcpy(r.parent, parent_key->bytes.data(), 32);
    } else {
      std::memset(r.parent, 0, sizeof(r.parent));
    }
    r.namespace_hash = namespace_hash;
    r.writer = slot;
    r.last_use = ix.Tick();
    r.state = static_cast<uint32_t>(PageState::kWriting);  // the commit point of a reservation
    InLockPoint("reserve:writing");
    ix.HashInsert(p);
    ix.LinkResident(p);
    out[i] = {ReserveOutcome::kReserved, p};
  }
  return out;
}

namespace {

Status CheckPages(std::span<const int64_t> pages, int64_t num_pages, const char* what) {
  for (size_t i = 0; i < pages.size(); ++i) {
    if (pages[i] < 0 || pages[i] >= num_pages) {
      return Status::InvalidArgument(fmt::format(
          "shared host pool {}: pages[{}] = {} is not in [0, {})", what, i, pages[i], num_pages));
    }
  }
  return Status::OK();
}

}  // namespace

Status PageIndex::Commit(int slot, std::span<const int64_t> pages, bool pin) {
  KVTIER_RETURN_IF_ERROR(CheckPages(pages, num_pages_, "Commit"));
  KVTIER_ASSIGN_OR_RETURN(Locked ix, Locked::Acquire(this));
  KVTIER_RETURN_IF_ERROR(ix.CheckOwner(slot));
  for (size_t i = 0; i < pages.size(); ++i) {
    if (ix.state(pages[i]) != PageState::kWriting || ix.page(pages[i]).writer != slot) {
      return Status::FailedPrecondition(fmt::format(
          "shared host pool Commit: page {} (pages[{}]) is not WRITING for this process", pages[i],
          i));
    }
  }
  for (int64_t p : pages) {
    PageRecord& r = ix.page(p);
    r.last_use = ix.Tick();
    r.state = static_cast<uint32_t>(PageState::kReady);  // the commit point
    InLockPoint("commit:ready");
    r.writer = kNone;
    ++ix.h().ready_count;
    ix.LruAppend(static_cast<int32_t>(p));
    if (pin) ix.Pin(p, slot);  // a fresh READY page has no references: cannot fail
  }
  return Status::OK();
}

Status PageIndex::Abort(int slot, std::span<const int64_t> pages) {
  KVTIER_RETURN_IF_ERROR(CheckPages(pages, num_pages_, "Abort"));
  KVTIER_ASSIGN_OR_RETURN(Locked ix, Locked::Acquire(this));
  KVTIER_RETURN_IF_ERROR(ix.CheckOwner(slot));
  for (size_t i = 0; i < pages.size(); ++i) {
    if (ix.state(pages[i]) != PageState::kWriting || ix.page(pages[i]).writer != slot) {
      return Status::FailedPrecondition(
          fmt::format("shared host pool Abort: page {} (pages[{}]) is not WRITING for this process",
                      pages[i], i));
    }
  }
  for (int64_t p : pages) ix.DropWriting(static_cast<int32_t>(p));
  return Status::OK();
}

Result<std::vector<int64_t>> PageIndex::PinPrefix(int slot, uint64_t namespace_hash,
                                                  std::span<const PageKey> keys) {
  KVTIER_ASSIGN_OR_RETURN(Locked ix, Locked::Acquire(this));
  KVTIER_RETURN_IF_ERROR(ix.CheckOwner(slot));
  std::vector<int64_t> pages;
  for (const PageKey& key : keys) {
    const int64_t p = ix.Find(namespace_hash, key.bytes.data());
    if (p == kNone || ix.state(p) != PageState::kReady) break;
    pages.push_back(p);
  }
  for (size_t i = 0; i < pages.size(); ++i) {
    const int64_t p = pages[i];
    if (ix.refs(p, slot) >= kMaxRefsPerProcess) {
      for (size_t j = 0; j < i; ++j) {  // undo this call's pins: all or nothing
        --ix.refs(pages[j], slot);
        --ix.page(pages[j]).readers;
      }
      return Status::FailedPrecondition(fmt::format(
          "shared host pool PinPrefix: page {} would hold more than {} references of this "
          "process; nothing was pinned",
          p, kMaxRefsPerProcess));
    }
    ix.Pin(p, slot);
  }
  return pages;
}

Status PageIndex::Unpin(int slot, std::span<const int64_t> pages) {
  KVTIER_RETURN_IF_ERROR(CheckPages(pages, num_pages_, "Unpin"));
  KVTIER_ASSIGN_OR_RETURN(Locked ix, Locked::Acquire(this));
  KVTIER_RETURN_IF_ERROR(ix.CheckOwner(slot));
  std::unordered_map<int64_t, uint32_t> wanted;
  for (int64_t p : pages) ++wanted[p];
  for (const auto& [p, n] : wanted) {
    if (ix.refs(p, slot) < n) {
      return Status::FailedPrecondition(fmt::format(
          "shared host pool Unpin: page {} is unpinned {} time(s) but this process holds {} "
          "reference(s) on it",
          p, n, ix.refs(p, slot)));
    }
  }
  for (const auto& [p, n] : wanted) {
    ix.refs(p, slot) -= static_cast<uint16_t>(n);
    ix.page(p).readers -= n;
  }
  return Status::OK();
}

Result<int64_t> PageIndex::Evict(int64_t max_pages) {
  if (max_pages < 0) {
    return Status::InvalidArgument(
        fmt::format("shared host pool Evict: max_pages = {} must not be negative", max_pages));
  }
  KVTIER_ASSIGN_OR_RETURN(Locked ix, Locked::Acquire(this));
  int64_t evicted = 0;
  while (evicted < max_pages && ix.EvictOne(kNone) != kNone) ++evicted;
  return evicted;
}

Result<int64_t> PageIndex::ReapDeadProcesses() {
  KVTIER_ASSIGN_OR_RETURN(Locked ix, Locked::Acquire(this));
  return ix.ReapDead();
}

}  // namespace kvtier::shm
