// Internal: the cross-process page index of a shared host pool (see shm_page_index.h).
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
#include <new>
#include <string>
#include <unordered_map>

#include "util/log.h"

namespace kvtier::shm {

namespace {

constexpr int kLockTimeoutSeconds = 10;
constexpr uint32_t kMaxRefsPerProcess = 0xFFFF;

std::atomic<InLockHook> g_in_lock_hook{nullptr};

void Hook(const char* where) {
  InLockHook hook = g_in_lock_hook.load(std::memory_order_relaxed);
  if (hook != nullptr) hook(where);
}

// Reads /proc/<pid>/stat: the state letter (field 3) and the start time (field 22).
bool ReadProcStat(int64_t pid, char* state, uint64_t* start_time) {
  char path[64];
  std::snprintf(path, sizeof(path), "/proc/%lld/stat", static_cast<long long>(pid));
  std::FILE* f = std::fopen(path, "r");
  if (f == nullptr) return false;
  char buf[1024];
  const size_t n = std::fread(buf, 1, sizeof(buf) - 1, f);
  std::fclose(f);
  buf[n] = '\0';
  // The command name (field 2) is in parentheses and may hold spaces or ')': skip to the last.
  const char* p = std::strrchr(buf, ')');
  if (p == nullptr) return false;
  ++p;
  // p -> " S ppid pgrp ..." ; field 3 is the state, field 22 the start time.
  char st = 0;
  if (std::sscanf(p, " %c", &st) != 1) return false;
  int field = 2;
  const char* q = p;
  while (*q != '\0' && field < 21) {
    while (*q == ' ') ++q;
    while (*q != ' ' && *q != '\0') ++q;
    ++field;
  }
  unsigned long long start = 0;
  if (std::sscanf(q, " %llu", &start) != 1) return false;
  *state = st;
  *start_time = start;
  return true;
}

uint64_t KeyHash(uint64_t namespace_hash, const uint8_t* key) {
  uint64_t k = 0;
  std::memcpy(&k, key, sizeof(k));
  return k ^ (namespace_hash * 0x9E3779B97F4A7C15ULL);
}

}  // namespace

uint64_t ProcessStartTime(int64_t pid) {
  char state = 0;
  uint64_t start = 0;
  return ReadProcStat(pid, &state, &start) ? start : 0;
}

bool ProcessAlive(int64_t pid, uint64_t start_time) {
  if (pid <= 0) return false;
  if (kill(static_cast<pid_t>(pid), 0) != 0 && errno != EPERM) return false;
  char state = 0;
  uint64_t start = 0;
  // Without /proc the pid's existence is all there is to go on.
  if (!ReadProcStat(pid, &state, &start)) return true;
  if (state == 'Z' || state == 'X' || state == 'x') return false;  // dead, not yet reaped
  return start_time == 0 || start == start_time;
}

void SetInLockHook(InLockHook hook) { g_in_lock_hook.store(hook, std::memory_order_relaxed); }

// The index with its lock held. Made by Acquire, which repairs the index first when the
// previous holder died; unlocks on destruction.
class PageIndex::Locked {
 public:
  static Result<Locked> Acquire(PageIndex* index) {
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
    Hook("pin:counted");
    ++page(p).readers;
    page(p).last_use = Tick();
    LruRemove(static_cast<int32_t>(p));
    LruAppend(static_cast<int32_t>(p));
    return true;
  }

  // READY -> EMPTY. REQUIRES: state READY, no readers.
  void EvictPage(int32_t p) {
    LruRemove(p);
    --h().ready_count;
    Hook("evict:unlinked");
    HashRemove(p);
    page(p).state = static_cast<uint32_t>(PageState::kEmpty);
    FreePush(p);
    ++h().evictions;
  }
  // The least recently used unpinned READY page, evicted; kNone when every READY page is pinned.
  int32_t EvictOne() {
    for (int32_t p = h().lru_head; p != kNone; p = page(p).lru_next) {
      if (page(p).readers == 0) {
        EvictPage(p);
        return p;
      }
    }
    return kNone;
  }

  // WRITING -> EMPTY.
  void DropWriting(int32_t p) {
    HashRemove(p);
    page(p).state = static_cast<uint32_t>(PageState::kEmpty);
    page(p).writer = kNone;
    FreePush(p);
  }

  // Releases everything slot `s` holds and frees its record. `dead`: counts it as reaped.
  void ReleaseProcess(int s, bool dead) {
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

  int64_t ReapDead() {
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

  // After a holder of the lock died: sanitise the truth, rebuild everything derived from it.
  void Repair() {
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
      r.hash_next = r.free_next = r.lru_prev = r.lru_next = kNone;
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

  Status CheckInvariants() {
    const SegmentHeader& hd = h();
    int64_t empty = 0, writing = 0, ready = 0;
    for (int64_t p = 0; p < num_pages(); ++p) {
      const PageRecord& r = page(p);
      if (r.state > static_cast<uint32_t>(PageState::kReady)) {
        return Status::Corruption(fmt::format("page {} has state {}", p, r.state));
      }
      if (state(p) == PageState::kWriting) {
        ++writing;
        if (!SlotAttached(r.writer)) {
          return Status::Corruption(fmt::format(
              "page {} is WRITING for process record {}, which is not attached", p, r.writer));
        }
      } else if (r.writer != kNone) {
        return Status::Corruption(
            fmt::format("page {} is not WRITING but names writer {}", p, r.writer));
      }
      if (state(p) == PageState::kEmpty) ++empty;
      if (state(p) == PageState::kReady) ++ready;
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
        return Status::Corruption(
            fmt::format("page {} counts {} readers but its per-process references sum to {}", p,
                        r.readers, sum));
      }
      if (sum != 0 && state(p) != PageState::kReady) {
        return Status::Corruption(fmt::format("page {} has readers but is not READY", p));
      }
      if (r.last_use > hd.clock) {
        return Status::Corruption(
            fmt::format("page {} was used at {}, after the clock {}", p, r.last_use, hd.clock));
      }
    }
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
    // Hash chains.
    std::fill(seen.begin(), seen.end(), 0);
    n = 0;
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
    if (n != ready + writing) {
      return Status::Corruption(
          fmt::format("hash chains hold {} pages but {} are READY or WRITING", n, ready + writing));
    }
    return Status::OK();
  }

 private:
  explicit Locked(PageIndex* index) : ix_(index) {}
  PageIndex* ix_;
};

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
    r->writer = r->hash_next = r->lru_prev = r->lru_next = kNone;
    r->free_next = p + 1 < layout.num_pages ? static_cast<int32_t>(p + 1) : kNone;
  }
  auto* buckets = reinterpret_cast<int32_t*>(base + layout.bucket_offset);
  std::fill(buckets, buckets + layout.num_buckets, kNone);
  h->free_head = 0;
  h->free_count = layout.num_pages;
  h->lru_head = h->lru_tail = kNone;
  return Status::OK();
}

PageIndex::PageIndex(std::byte* base)
    : header_(reinterpret_cast<SegmentHeader*>(base)),
      processes_(reinterpret_cast<ProcessRecord*>(base + header_->process_offset)),
      pages_(reinterpret_cast<PageRecord*>(base + header_->page_offset)),
      refs_(reinterpret_cast<uint16_t*>(base + header_->refs_offset)),
      buckets_(reinterpret_cast<int32_t*>(base + header_->bucket_offset)),
      num_pages_(header_->num_pages),
      max_processes_(header_->max_processes),
      bucket_mask_(header_->num_buckets - 1) {}

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

Result<std::vector<PageReservation>> PageIndex::Reserve(int slot, uint64_t namespace_hash,
                                                        std::span<const PageKey> keys,
                                                        bool pin_ready) {
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
    int32_t p = ix.FreePop();
    if (p == kNone && ix.EvictOne() != kNone) p = ix.FreePop();
    if (p == kNone && !reaped) {
      reaped = true;
      if (ix.ReapDead() > 0) p = ix.FreePop();
    }
    if (p == kNone) {
      out[i] = {ReserveOutcome::kNoSpace, -1};
      continue;
    }
    Hook("reserve:popped");
    PageRecord& r = ix.page(p);
    std::memcpy(r.key, key, 32);
    r.namespace_hash = namespace_hash;
    r.writer = slot;
    r.last_use = ix.Tick();
    r.state = static_cast<uint32_t>(PageState::kWriting);  // the commit point of a reservation
    Hook("reserve:writing");
    ix.HashInsert(p);
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
    Hook("commit:ready");
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
  while (evicted < max_pages && ix.EvictOne() != kNone) ++evicted;
  return evicted;
}

Result<int64_t> PageIndex::ReapDeadProcesses() {
  KVTIER_ASSIGN_OR_RETURN(Locked ix, Locked::Acquire(this));
  return ix.ReapDead();
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
  info->empty_pages = info->writing_pages = info->ready_pages = info->pinned_pages = 0;
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
