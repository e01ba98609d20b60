// kvtier/shared_host_pool.h — a host (L2) KV tier shared by several engine processes: a POSIX
// shared-memory segment holding the KV pages and a cross-process page index, safe against a
// process killed at any instant.
//
// One process creates a segment by name (`Create`); others attach to it (`Attach`), or each
// calls `CreateOrAttach`. The segment records its layout version and geometry; attaching with an
// expected geometry that differs is an InvalidArgument naming the field. The page bytes are one
// region (K and V, or the MLA buffer) in any host layout; host page p is slots
// [p * page_size, (p + 1) * page_size) of `region()`. Every process that has a GPU registers the
// mapping with CUDA (pinned, device-addressable), so the kernel and dma backends copy straight
// between the GPU and the shared pages.
//
// The page index maps (namespace hash, 32-byte page key) to a host page. A page is
//   EMPTY    on the free list;
//   WRITING  reserved by one process, which is writing its bytes; invisible to lookups;
//   READY    its bytes are complete; readers pin it (per-process reference counts) while they
//            copy from it; only unpinned READY pages are evicted, least recently used first (one
//            LRU clock for all processes), a chain's tail before its head when pages are
//            reserved with their parents (Reserve).
// Publishing: `Reserve` (EMPTY -> WRITING, evicting as needed) -> write the bytes -> `Commit`
// (WRITING -> READY) or `Abort` (-> EMPTY). Reading: `PinPrefix` -> copy -> `Unpin`.
//
// Crash safety: the index is guarded by one robust process-shared mutex. A process killed while
// holding it leaves the next locker EOWNERDEAD; that locker rebuilds every derived structure
// (hash chains, free list, LRU list, counts) from the per-page records before going on. Every
// attached process is recorded in the segment by pid and start time; a dead one (found on
// attach, when space runs out, when a lookup meets its unfinished page, or by
// `ReapDeadProcesses`) has its WRITING pages returned to EMPTY (never READY with half the
// bytes) and its reader references dropped. Processes must share one pid namespace.
//
// Thread safety: every method may be called from several threads of a process at once. The bytes
// of a WRITING page belong to the process that reserved it until Commit/Abort; the bytes of a
// pinned READY page are read-only until the last Unpin. A SharedHostPool must not be used by a
// child of fork() (attach again there; calls from another pid return FailedPrecondition).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kvtier/layout.h"
#include "kvtier/page_key.h"
#include "kvtier/status.h"
#include "kvtier/storage_backend.h"
#include "kvtier/transfer.h"

namespace kvtier {

struct SharedHostPoolConfig {
  // Segment name: 1-200 of [A-Za-z0-9._-], not starting with '.'. The segment is the POSIX
  // shared-memory object "/kvtier.<name>" (/dev/shm/kvtier.<name>), or a file of that name on a
  // hugetlbfs mount when huge pages are used.
  std::string name;

  // Geometry of the page bytes. geometry.num_slots: the pool's size in slots (a multiple of
  // page_size), or 0 to derive it from capacity_bytes.
  KvGeometry geometry;
  bool mla = false;            // one buffer instead of K and V
  int64_t capacity_bytes = 0;  // page bytes of all buffers, rounded down to whole pages

  // Try a hugetlbfs mount (reserved huge pages); fall back to /dev/shm with a message.
  bool huge_pages = false;
  bool register_with_cuda = true;  // cudaHostRegister when built with CUDA and a GPU is present
  // Access: 0600 for the creating user, or 0660 with this group id (-1 = none).
  int64_t group_id = -1;
  // Processes that can be attached at once (each costs 2 bytes per page of reference counts).
  int max_processes = 64;

  // InvalidArgument naming the bad field and its value.
  Status Validate() const;
};

struct SharedHostPoolAttachOptions {
  // When set, the segment's geometry must equal it (num_slots 0 = any) and its MLA flag `mla`;
  // otherwise InvalidArgument naming the field, the segment's value and the expected one.
  std::optional<KvGeometry> expected_geometry;
  bool mla = false;
  bool register_with_cuda = true;
  // How long to wait for a segment that another process is still initialising.
  int init_timeout_ms = 2000;
};

// What Reserve did for one key.
enum class ReserveOutcome : uint8_t {
  kReserved = 0,      // a page is WRITING for this process: write it, then Commit or Abort
  kAlreadyReady = 1,  // the page is published already: nothing to write
  kBeingWritten = 2,  // another live process is writing it
  kNoSpace = 3,       // no EMPTY page and every READY page is pinned
  kNoParent = 4,      // its parent (Reserve's `parents`) is not in the segment: it would be
                      // unreachable; publish the parent first
};
const char* ReserveOutcomeName(ReserveOutcome outcome);

struct PageReservation {
  ReserveOutcome outcome = ReserveOutcome::kNoSpace;
  int64_t page = -1;  // the host page for kReserved and kAlreadyReady; -1 otherwise
};

// A snapshot of the segment, for tools and tests.
struct SharedHostPoolInfo {
  struct Process {
    int slot = 0;
    int64_t pid = 0;
    uint64_t start_time = 0;  // clock ticks after boot (/proc/<pid>/stat field 22)
    bool alive = false;
    bool is_caller = false;
    int64_t pinned_refs = 0;    // reader references it holds (sum over pages)
    int64_t pinned_pages = 0;   // pages it holds at least one reference on
    int64_t writing_pages = 0;  // WRITING pages it reserved
  };

  std::string name;
  std::string path;  // the file backing the segment
  KvGeometry geometry;
  bool mla = false;
  int64_t num_pages = 0;
  int64_t page_bytes = 0;     // bytes of one page over all buffers
  int64_t segment_bytes = 0;  // the whole segment (header, index and pages)
  bool huge_pages = false;
  bool cuda_registered = false;  // in the calling process
  int max_processes = 0;
  int64_t empty_pages = 0, writing_pages = 0, ready_pages = 0;
  int64_t pinned_pages = 0;  // READY pages with at least one reader
  // READY pages no lookup reaches: a page on the way from its prompt's first page (following the
  // parents the pages were reserved with) is not in the segment. 0 unless pages were reserved
  // while their parent was being written and that write was aborted, or the segment evicted a
  // page with a resident child for want of a leaf (see Reserve).
  int64_t unreachable_pages = 0;
  uint64_t clock = 0;  // the shared LRU clock
  // Since creation: robust-lock recoveries (a process died holding the index lock), dead
  // processes reaped, their WRITING pages returned to EMPTY, their reader references dropped,
  // pages evicted, and of those the pages a resident page named as parent (evicted for want of
  // an unpinned leaf: each leaves its descendants unreachable).
  int64_t lock_recoveries = 0, reaped_processes = 0, reclaimed_writing_pages = 0;
  int64_t dropped_refs = 0, evictions = 0, evictions_with_children = 0;
  std::vector<Process> processes;  // attached ones
};

class SharedHostPool {
 public:
  // Creates the segment (exclusively: FailedPrecondition when it exists), sizes, maps and
  // initialises it, registers it with CUDA when a GPU is present. Permissions 0600 (or 0660 and
  // the group). OutOfMemory when the memory cannot be had; CudaError when registration fails
  // (the segment is removed again then).
  static Result<std::unique_ptr<SharedHostPool>> Create(const SharedHostPoolConfig& config);
  // Attaches to an existing segment. NotFound when there is none; InvalidArgument when its
  // header is not a kvtier segment of this version or its geometry differs from the expected.
  static Result<std::unique_ptr<SharedHostPool>> Attach(
      std::string_view name, const SharedHostPoolAttachOptions& options = {});
  // Create, or Attach with config's geometry when the segment exists already.
  static Result<std::unique_ptr<SharedHostPool>> CreateOrAttach(const SharedHostPoolConfig& config);
  // Removes the segment's name (shm_unlink / unlink). Processes attached keep their mapping; new
  // attaches fail. NotFound when there is none.
  static Status Destroy(std::string_view name);

  SharedHostPool(const SharedHostPool&) = delete;
  SharedHostPool& operator=(const SharedHostPool&) = delete;
  // Detaches: aborts this process's WRITING pages, drops its references, frees its process
  // record, unregisters from CUDA, unmaps. The segment stays.
  ~SharedHostPool();

  const std::string& name() const;
  // memory = kHost, the segment's geometry, base pointers into the mapping.
  const KvRegion& region() const;
  const KvGeometry& geometry() const { return region().geometry; }
  int64_t num_pages() const { return geometry().num_pages(); }
  int64_t page_size() const { return geometry().page_size; }
  bool huge_pages() const;
  bool cuda_registered() const;
  // The slots of host page `page`: page * page_size, ..., page * page_size + page_size - 1.
  std::vector<int64_t> PageSlots(std::span<const int64_t> pages) const;

  // For each key, in order: kAlreadyReady when (namespace_hash, key) is READY (the page is not
  // pinned: pin it with PinPrefix to read it), kBeingWritten when another live process has it
  // WRITING, kNoParent when parents[i] names a page that is not READY or WRITING in the segment,
  // else an EMPTY page (evicting one if there is none, see below) turned WRITING for this
  // process: kReserved; kNoSpace when none can be had. A key given twice is reserved once (the
  // second is kBeingWritten).
  //
  // `parents`: empty, or one per key: the key of the page before keys[i] in its prompt (nullopt
  // for a prompt's first page, or unknown; keys[i - 1] for a chain given in order). A reserved
  // page records it (a page already in the segment keeps the parent it was reserved with).
  // Eviction takes a chain's tail before its head: the victim is the least recently used
  // unpinned READY page that no READY or WRITING page names as its parent (a leaf), never the
  // new page's own parent: when that parent is the only such leaf the new page is kNoSpace (the
  // tail of a chain longer than the room is refused; its prefix stays). Only when no unpinned
  // leaf exists (every leaf pinned or being written, or the links form a cycle) the least
  // recently used unpinned page goes. Pages reserved without parents are leaves, evicted in
  // plain LRU order. InvalidArgument when parents is neither empty nor keys.size() long.
  Result<std::vector<PageReservation>> Reserve(
      uint64_t namespace_hash, std::span<const PageKey> keys,
      std::span<const std::optional<PageKey>> parents = {});
  // Reserve, except that each kAlreadyReady page is also pinned for this process (one reference,
  // as PinPrefix takes), in the same step: it cannot be evicted before the caller uses it. A
  // READY page this process holds 65,535 references on is kNoSpace (not pinned).
  Result<std::vector<PageReservation>> ReserveOrPin(
      uint64_t namespace_hash, std::span<const PageKey> keys,
      std::span<const std::optional<PageKey>> parents = {});
  // WRITING -> READY. REQUIRES: every byte of the pages written (and visible to the CPU: a GPU
  // copy into them synchronised). FailedPrecondition when a page is not WRITING for this process
  // (nothing changes then).
  Status Commit(std::span<const int64_t> pages);
  // Commit, each page also pinned for this process (one reference) in the same step, so no
  // other process can evict it between the commit and a PinPrefix.
  Status CommitPinned(std::span<const int64_t> pages);
  // WRITING -> EMPTY, for a write that failed. Same checks as Commit.
  Status Abort(std::span<const int64_t> pages);

  // Pins the READY pages of the longest prefix of `keys` (stops at the first key that is not
  // READY) for reading, marks them used, and returns their host pages in order.
  // FailedPrecondition when a page would hold more than 65,535 references of this process
  // (nothing is pinned then).
  Result<std::vector<int64_t>> PinPrefix(uint64_t namespace_hash, std::span<const PageKey> keys);
  // Drops one of this process's references on each page. FailedPrecondition when this process
  // holds none on a page (nothing changes then).
  Status Unpin(std::span<const int64_t> pages);

  // Evicts up to `max_pages` unpinned READY pages in Reserve's order (least recently used leaves
  // first); returns how many.
  Result<int64_t> Evict(int64_t max_pages);
  // Finds attached processes that have died and releases what they held; returns how many.
  Result<int64_t> ReapDeadProcesses();

  Result<SharedHostPoolInfo> Inspect();
  // Checks every invariant of the index (states, hash chains, free and LRU lists, counts,
  // references of live processes only); Corruption naming the first broken one.
  Status CheckInvariants();

 private:
  struct State;  // segment, index and CUDA registration (shared_host_pool.cc)
  explicit SharedHostPool(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

// The shared host tier as a StorageBackend ("shm://<name>"), for HierarchicalCacheConfig's
// storage tier: Exists counts the leading READY pages of (ns.Hash(), key), Get copies pinned pages
// out, Set publishes pages (one already READY is not copied again; one another process is writing
// or no space is kFailed; a Set with parents records them, so the segment evicts a chain's tail
// before its head, and a page whose parent is not in the segment is kFailed), Remove is not
// offered (kFailed: the tier evicts by its own order). So
// caches in different processes share what any of them backed up, and find it by key after their
// own tree match (QueryStorage). The payload of a page is its bytes in the segment, buffer by
// buffer. InvalidArgument unless the pool keeps pages contiguous (not layer_first) and `ns`
// describes its pages (layout, mla, num_layers, slot_bytes, page_size, head_num).
Result<std::unique_ptr<StorageBackend>> OpenSharedHostStorage(std::shared_ptr<SharedHostPool> pool,
                                                              const StorageNamespace& ns,
                                                              const StorageOptions& options = {});

}  // namespace kvtier
