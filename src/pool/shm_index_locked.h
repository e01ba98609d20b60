// Internal: the page index with its lock held (PageIndex::Locked), shared by the index's runtime
// operations (shm_page_index.cc) and its whole-segment passes — initialisation, repair after a
// process died holding the lock, the invariant check and inspection (shm_index_check.cc).
//
// The invariants the helpers keep are written once, in shm_index_check.cc, next to the check that
// tests every one of them.
//
// Thread safety: a Locked exists only while its maker holds the index lock; it is not shared.
#pragma once

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include "kvtier/status.h"
#include "pool/shm_layout.h"
#include "pool/shm_page_index.h"

namespace kvtier::shm {

inline constexpr int kLockTimeoutSeconds = 10;
inline constexpr uint32_t kMaxRefsPerProcess = 0xFFFF;

// Calls the in-lock test hook (SetInLockHook) when one is set.
void InLockPoint(const char* where);

// The hash bucket (before masking) of (namespace hash, page key).
inline uint64_t KeyHash(uint64_t namespace_hash, const uint8_t* key) {
  uint64_t k = 0;
  std::memcpy(&k, key, sizeof(k));
  return k ^ (namespace_hash * 0x9E3779B97F4A7C15ULL);
}

// The index with its lock held. Made by Acquire, which repairs the index first when the
// previous holder died; unlocks on destruction.
class PageIndex::Locked {
 public:
  // Locks within kLockTimeoutSeconds (Unavailable otherwise); on EOWNERDEAD repairs first.
  static Result<Locked> Acquire(PageIndex* index);

  Locked(Locked&& other) noexcept : ix_(std::exchange(other.ix_, nullptr)) {}
  Locked& operator=(Locked&&) = delete;
  Locked(const Locked&) = delete;
  Locked& operator=(const Locked&) = delete;
  ~Locked() {
    if (ix_ != nullptr) pthread_mutex_unlock(&ix_->header_->lock);
  }

  SegmentHeader& h() { return *ix_->header_; }
  PageRecord& page(int64_t p) { return ix_->pages_[p]; }
  ProcessRecord& process(int s) { return ix_->processes_[s]; }
  uint16_t& refs(int64_t p, int s) { return ix_->refs_[p * ix_->max_processes_ + s]; }
  int64_t num_pages() const { return ix_->num_pages_; }
  int max_processes() const { return ix_->max_processes_; }
  PageState state(int64_t p) { return static_cast<PageState>(page(p).state); }
  uint64_t Tick() { return ++h().clock; }

  // OK when record `s` is still the caller's (it is released when the process is taken for dead,
  // which happens to a live one only across pid namespaces).
  Status CheckOwner(int s) {
    if (SlotAttached(s) && process(s).pid == ix_->owner_pid_ &&
        process(s).start_time == ix_->owner_start_time_) {
      return Status::OK();
    }
    return Status::FailedPrecondition(fmt::format(
        "shared host pool: this process's record {} was released as if it had died (do the "
        "attached processes share one pid namespace?); attach again",
        s));
  }

  bool SlotAttached(int s) {
    return s >= 0 && s < max_processes() &&
           process(s).state == static_cast<uint32_t>(ProcessState::kAttached);
  }

  // ---- hash chains ----
  int32_t& Bucket(uint64_t namespace_hash, const uint8_t* key) {
    return ix_->buckets_[KeyHash(namespace_hash, key) & ix_->bucket_mask_];
  }
  // The head of the child chain that holds the pages naming (namespace hash, key) as parent.
  int32_t& ChildBucket(uint64_t namespace_hash, const uint8_t* key) {
    return ix_->child_buckets_[KeyHash(namespace_hash, key) & ix_->bucket_mask_];
  }
  int64_t Find(uint64_t namespace_hash, const uint8_t* key) {
    int64_t steps = 0;
    for (int32_t p = Bucket(namespace_hash, key); p != kNone && steps <= num_pages();
         p = page(p).hash_next, ++steps) {
      if (p < 0 || p >= num_pages()) return kNone;  // only after corruption; CheckInvariants
      const PageRecord& r = page(p);
      if (r.state != static_cast<uint32_t>(PageState::kEmpty) &&
          r.namespace_hash == namespace_hash && std::memcmp(r.key, key, 32) == 0) {
        return p;
      }
    }
    return kNone;
  }
  void HashInsert(int32_t p) {
    int32_t& head = Bucket(page(p).namespace_hash, page(p).key);
    page(p).hash_next = head;
    head = p;
  }
  void HashRemove(int32_t p) {
    int32_t* link = &Bucket(page(p).namespace_hash, page(p).key);
    for (int64_t steps = 0; *link != kNone && steps <= num_pages(); ++steps) {
      if (*link < 0 || *link >= num_pages()) return;  // only after corruption; CheckInvariants
      if (*link == p) {
        *link = page(p).hash_next;
        page(p).hash_next = kNone;
        return;
      }
      link = &page(*link).hash_next;
    }
  }

  // ---- free list ----
  void FreePush(int32_t p) {
    page(p).free_next = h().free_head;
    h().free_head = p;
    ++h().free_count;
  }
  int32_t FreePop() {
    const int32_t p = h().free_head;
    if (p == kNone) return kNone;
    h().free_head = page(p).free_next;
    page(p).free_next = kNone;
    --h().free_count;
    return p;
  }

  // ---- LRU list (READY pages; head = least recently used) ----
  void LruAppend(int32_t p) {
    hint_.valid = false;
    page(p).lru_prev = h().lru_tail;
    page(p).lru_next = kNone;
    if (h().lru_tail != kNone) {
      page(h().lru_tail).lru_next = p;
    } else {
      h().lru_head = p;
    }
    h().lru_tail = p;
  }
  void LruRemove(int32_t p) {
    hint_.valid = false;
    PageRecord& r = page(p);
    if (r.lru_prev != kNone) {
      page(r.lru_prev).lru_next = r.lru_next;
    } else {
      h().lru_head = r.lru_next;
    }
    if (r.lru_next != kNone) {
      page(r.lru_next).lru_prev = r.lru_prev;
    } else {
      h().lru_tail = r.lru_prev;
    }
    r.lru_prev = r.lru_next = kNone;
  }

  // One more reference of process `s` on READY page `p`, which becomes the most recently used.
  // False (nothing changes) when `s` holds the most references a page can count.
  bool Pin(int64_t p, int s) {
    if (refs(p, s) >= kMaxRefsPerProcess) return false;
    ++refs(p, s);
    InLockPoint("pin:counted");
    ++page(p).readers;
    page(p).last_use = Tick();
    LruRemove(static_cast<int32_t>(p));
    LruAppend(static_cast<int32_t>(p));
    return true;
  }

  // ---- parent links (shm_page_index.cc) ----
  // The resident (READY or WRITING) page that `p` names as its parent; kNone when it names none,
  // that page is not resident, or it names itself.
  int64_t ParentOf(int64_t p);
  // How many pages in the child chains name resident page `p` as their parent.
  uint32_t CountChildren(int64_t p);
  // `p` became resident: into the child chain of its parent's key (when it names one), counted
  // by its parent when that is resident; its own children counted.
  void LinkResident(int32_t p);
  // `p` stops being resident: out of its child chain, no longer counted by its parent.
  void UnlinkResident(int32_t p);
  // Whether `p` is READY, unpinned and no resident page names it as parent.
  bool EvictableLeaf(int64_t p) {
    return state(p) == PageState::kReady && page(p).readers == 0 && page(p).children == 0;
  }

  // ---- eviction (shm_page_index.cc) ----
  // READY -> EMPTY. REQUIRES: state READY, no readers.
  void EvictPage(int32_t p);
  // Evicts one page: the least recently used evictable leaf other than `parent` (the resident
  // parent of a page about to be reserved, or kNone). When there is no such leaf: kNone if
  // `parent` is itself an evictable leaf (the new page is the tail of a chain longer than the
  // room: the tail is refused, its prefix stays), else the least recently used unpinned READY
  // page other than `parent` (every leaf is pinned or being written, or the links form a cycle).
  // Returns the page evicted, or kNone.
  int32_t EvictOne(int32_t parent);

  // WRITING -> EMPTY.
  void DropWriting(int32_t p) {
    UnlinkResident(p);
    HashRemove(p);
    page(p).state = static_cast<uint32_t>(PageState::kEmpty);
    page(p).writer = kNone;
    FreePush(p);
  }

  // Something other than an eviction may have made a page an evictable leaf (a reference
  // dropped, a child gone): the next eviction scans the LRU list from its head.
  void ForgetEvictionScan() { hint_.valid = false; }

  // Releases everything slot `s` holds and frees its record. `dead`: counts it as reaped.
  void ReleaseProcess(int s, bool dead);
  // Releases the records of attached processes that are not alive; how many.
  int64_t ReapDead();

  // After a holder of the lock died: sanitise the truth, rebuild everything derived from it
  // (shm_index_check.cc).
  void Repair();
  // Corruption naming the first broken invariant (shm_index_check.cc).
  Status CheckInvariants();
  // Whether `p` (READY) is reachable by a lookup: it names no parent, or its parent is resident
  // and reachable. `memo` (one per page: 0 unknown, 1 reachable, 2 not) is filled on the way.
  bool Reachable(int64_t p, std::vector<uint8_t>* memo);

 private:
  // The parts of CheckInvariants: per-page fields (and the counts of each state), the free and
  // LRU lists, the hash chains, the child chains and child counts.
  Status CheckPageRecords(int64_t* empty, int64_t* writing, int64_t* ready);
  Status CheckLists(int64_t empty, int64_t ready);
  Status CheckHashChains(int64_t resident);
  Status CheckChildChains();

  // Where the last eviction of this lock hold left the LRU list: no READY page before `scan_from`
  // (kNone: the list's end) is an evictable leaf, except perhaps `parent`, the last victim's
  // parent. Consecutive evictions (a chain taken tail first) then cost O(1) each instead of a
  // scan from the head. Any other change to the list, a reference count or a child count clears
  // `valid`.
  struct EvictionScan {
    bool valid = false;
    int32_t scan_from = kNone;
    int32_t parent = kNone;
  };

  explicit Locked(PageIndex* index) : ix_(index) {}
  PageIndex* ix_;
  EvictionScan hint_;
};

}  // namespace kvtier::shm
