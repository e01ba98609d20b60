// Internal: the byte layout of a shared host pool segment (one POSIX shared-memory object).
//
//   offset 0             SegmentHeader (magic, version, geometry, section offsets, the index
//                        lock and the index's scalar state)
//   process_offset       ProcessRecord[max_processes]       attached processes
//   page_offset          PageRecord[num_pages]              one per host page: key, state, links
//   refs_offset          uint16_t[num_pages][max_processes] reader references per process
//   bucket_offset        int32_t[num_buckets]               hash bucket heads (page or -1)
//   child_bucket_offset  int32_t[num_buckets]               child chain heads, by the hash of
//                                                           (namespace, parent key)
//   data_offset          buffer 0 (K or MLA) then buffer 1 (V): the page bytes, each buffer
//                        `buffer_bytes` long and aligned to kDataAlignment
//
// The creator writes everything, then stores `magic` last (release); an attacher that sees the
// magic (acquire) sees an initialised segment. All index fields are read and written only with
// the index lock held; `magic` and the immutable fields are read without it.
//
// Which fields are the truth and which are derived (rebuilt after a process died holding the
// lock, see shm_index_check.cc): per page `state`, `key`, `parent`, `has_parent`,
// `namespace_hash`, `writer`, `last_use` and the reference counts; per process `state`, `pid`,
// `start_time`; the header's `clock` and counters. Derived: hash chains and bucket heads, child
// chains and their heads, `children`, free list, LRU list, `readers`, `free_count`,
// `ready_count`.
//
// Thread safety: plain data; see shm_page_index.h for the locking.
#pragma once

#include <pthread.h>

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "kvtier/layout.h"
#include "kvtier/status.h"

namespace kvtier::shm {

inline constexpr uint64_t kSegmentMagic = 0x314d48535249544bULL;  // "KTIRSHM1" little-endian
// 2: page records carry the parent's key and a child chain (tail-first eviction); a segment of
// version 1 is refused (InvalidArgument: destroy and create it again).
inline constexpr uint32_t kSegmentVersion = 2;
inline constexpr int64_t kDataAlignment = int64_t{2} << 20;  // huge-page aligned page bytes
inline constexpr int kMaxProcessesLimit = 1024;
inline constexpr int32_t kNone = -1;

enum class PageState : uint32_t { kEmpty = 0, kWriting = 1, kReady = 2 };
enum class ProcessState : uint32_t { kFree = 0, kAttached = 1 };

struct PageRecord {
  uint8_t key[32];          // the page key (valid unless EMPTY)
  uint8_t parent[32];       // the key of the page before it in its prompt, when has_parent
  uint64_t namespace_hash;  // (valid unless EMPTY; a parent is in the same namespace)
  uint64_t last_use;        // the shared clock when it was last committed or pinned
  uint32_t state;           // PageState
  int32_t writer;           // process slot that holds it WRITING; kNone otherwise
  uint32_t has_parent;      // 1: `parent` is set; 0: a prompt's first page, or not known
  // Derived:
  uint32_t children;   // resident (READY or WRITING) pages whose parent is this page
  int32_t hash_next;   // next page in the bucket's chain (READY and WRITING pages)
  int32_t child_next;  // next page in the child chain of hash(namespace, parent) (resident
                       // pages with a parent)
  int32_t free_next;   // next EMPTY page on the free list
  int32_t lru_prev;    // READY pages, least recently used first
  int32_t lru_next;
  uint32_t readers;  // sum of the page's per-process reference counts
};
static_assert(sizeof(PageRecord) == 120);

struct ProcessRecord {
  uint32_t state;  // ProcessState
  int32_t reserved;
  int64_t pid;
  uint64_t start_time;    // /proc/<pid>/stat field 22; tells a reused pid apart
  uint64_t attach_clock;  // the clock when it attached
};

struct SegmentHeader {
  std::atomic<uint64_t> magic;  // kSegmentMagic once initialised
  uint32_t version;
  uint32_t header_bytes;  // sizeof(SegmentHeader) of the creator
  uint64_t segment_bytes;

  // Geometry (immutable).
  uint32_t layout;  // KvLayout
  uint32_t mla;
  int64_t num_layers;
  int64_t num_slots;
  int64_t slot_bytes;
  int64_t page_size;
  int64_t head_num;
  int64_t num_pages;
  int32_t max_processes;
  uint32_t huge_pages;  // backed by hugetlbfs

  // Sections (immutable).
  uint64_t process_offset;
  uint64_t page_offset;
  uint64_t refs_offset;
  uint64_t bucket_offset;
  uint64_t num_buckets;  // a power of two
  uint64_t child_bucket_offset;
  uint64_t data_offset;
  uint64_t buffer_bytes;  // bytes of each buffer (buffer 1 at data_offset + aligned buffer_bytes)
  uint64_t buffer_stride;

  // The index lock: robust and process-shared.
  alignas(64) pthread_mutex_t lock;

  // Index state (lock held).
  alignas(64) uint64_t clock;
  int32_t free_head;
  int32_t lru_head;
  int32_t lru_tail;
  int32_t reserved0;
  int64_t free_count;
  int64_t ready_count;
  int64_t lock_recoveries;
  int64_t reaped_processes;
  int64_t reclaimed_writing_pages;
  int64_t dropped_refs;
  int64_t evictions;
  int64_t evictions_with_children;  // of pages a resident page named as parent (no leaf to take)
};

// Where everything goes, computed identically by the creator (to lay out) and by the tools.
struct SegmentLayout {
  int64_t num_pages = 0;
  int64_t buffer_bytes = 0;
  int64_t buffer_stride = 0;
  int num_buffers = 0;
  int max_processes = 0;
  uint64_t num_buckets = 0;
  uint64_t process_offset = 0, page_offset = 0, refs_offset = 0, bucket_offset = 0;
  uint64_t child_bucket_offset = 0, data_offset = 0;
  uint64_t segment_bytes = 0;
};

// REQUIRES: a geometry that KvRegion::Validate accepts (num_slots > 0, a multiple of
// page_size); 1 <= max_processes <= kMaxProcessesLimit. InvalidArgument on overflow.
Result<SegmentLayout> ComputeSegmentLayout(const KvGeometry& geometry, bool mla, int max_processes);

}  // namespace kvtier::shm
