// Internal: the cross-process page index of a shared host pool, living in the segment
// (shm_layout.h): (namespace hash, page key) -> host page, page states, per-process reader
// references, the shared LRU clock, the free list, attached processes, and the robust lock that
// guards all of it.
//
// Eviction takes a chain's tail before its head: a page records its parent's key (the page before
// it in its prompt), and the victim is the least recently used unpinned READY page that no resident
// page names as parent (a leaf); only when there is none (every leaf pinned or being written, or a
// cycle of links) the least recently used unpinned page. So a lookup, which walks a prompt's pages
// from the first, never meets a resident page whose prefix was evicted.
//
// Every operation takes the index lock (a robust, process-shared pthread mutex) for bookkeeping
// only; page bytes are never touched here. When the lock comes back EOWNERDEAD (its holder died
// inside an operation), the new holder repairs the index before doing anything else — the
// truth (per-page state, key, parent, writer, last use, per-process references; the process
// table) is sanitised and every derived structure (hash and child chains, child counts, free list,
// LRU list, counts) is rebuilt from it — then marks the mutex consistent and reaps dead processes.
//
// A crash leaves the truth consistent because each operation changes a page's state with one
// store after writing the fields that the new state makes meaningful (a reservation writes key,
// parent, namespace and writer, then state = WRITING; a commit stores state = READY), and reaping
// turns every WRITING page of a dead process back to EMPTY, whatever else it had done.
//
// Thread safety: a PageIndex may be used from any number of threads and processes at once; the
// lock serialises them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "kvtier/page_key.h"
#include "kvtier/shared_host_pool.h"
#include "kvtier/status.h"
#include "pool/shm_layout.h"
#include "pool/shm_process.h"

namespace kvtier::shm {

// Test seam: when set, called with the lock held at points inside operations where the index is
// half-updated ("reserve:popped", "reserve:writing", "evict:unlinked", "pin:counted",
// "commit:ready"), so a test can kill the process right there. Null in production.
using InLockHook = void (*)(const char* where);
void SetInLockHook(InLockHook hook);

class PageIndex {
 public:
  // Lays out an empty index in a zero-filled segment and initialises the lock. Writes the header
  // (except `magic`, which the caller stores last).
  static Status Initialize(std::byte* base, const SegmentLayout& layout, const KvGeometry& geometry,
                           bool mla, bool huge_pages);

  // REQUIRES: `base` is an initialised segment whose header was checked (see
  // CheckSegmentHeader in shared_host_pool.cc).
  explicit PageIndex(std::byte* base);

  SegmentHeader* header() const { return header_; }
  int64_t num_pages() const { return num_pages_; }

  // Claims a process record for (pid, start time) after reaping dead processes. Unavailable
  // when every record is held by a live process. Called once per PageIndex; the calls below
  // taking `slot` answer FailedPrecondition once that record no longer belongs to this process.
  Result<int> AttachProcess(int64_t pid, uint64_t start_time);
  // Aborts the slot's WRITING pages, drops its references and frees the record.
  Status DetachProcess(int slot);

  // pin_ready: a kAlreadyReady page also gets one reference of `slot`. `parents`: empty (no
  // parent known) or one per key (SharedHostPool::Reserve says what they do).
  Result<std::vector<PageReservation>> Reserve(int slot, uint64_t namespace_hash,
                                               std::span<const PageKey> keys,
                                               std::span<const std::optional<PageKey>> parents,
                                               bool pin_ready = false);
  // pin: each page becomes READY with one reference of `slot`.
  Status Commit(int slot, std::span<const int64_t> pages, bool pin = false);
  Status Abort(int slot, std::span<const int64_t> pages);
  Result<std::vector<int64_t>> PinPrefix(int slot, uint64_t namespace_hash,
                                         std::span<const PageKey> keys);
  Status Unpin(int slot, std::span<const int64_t> pages);
  Result<int64_t> Evict(int64_t max_pages);
  Result<int64_t> ReapDeadProcesses();

  // Fills the counts and processes of `info` (not name, path, geometry, flags).
  Status Inspect(int caller_slot, SharedHostPoolInfo* info);
  Status CheckInvariants();

 private:
  class Locked;  // the lock held; every *Locked helper lives there (shm_page_index.cc)

  SegmentHeader* header_;
  ProcessRecord* processes_;
  PageRecord* pages_;
  uint16_t* refs_;  // [num_pages][max_processes]
  int32_t* buckets_;
  int32_t* child_buckets_;  // [num_buckets], by the hash of (namespace, parent key)
  int64_t num_pages_;
  int max_processes_;
  uint64_t bucket_mask_;
  // The process that AttachProcess recorded (the record's owner; checked by every call).
  int64_t owner_pid_ = 0;
  uint64_t owner_start_time_ = 0;
};

}  // namespace kvtier::shm
