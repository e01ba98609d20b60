// kvtier/storage_backend.h — the storage interface: the StorageBackend every store implements,
// its page buffers, results, options and statistics.
//
// A `StorageBackend` stores whole pages under their `PageKey` (page_key.h), inside one deployment
// `StorageNamespace`. Every backend writes the same value: a header (magic, format version,
// namespace hash, key, payload length, XXH3-64 of the payload, a checksum of the header) followed
// by the payload. A value that does not check out — corrupt, truncated, another key's, another
// namespace's, an older format — is a miss, never bytes handed to the caller.
//
// The implementations and OpenStorage, which picks one by URL, are the storage module's
// (storage.h); this header is the module below them (storage_api in src/CMakeLists.txt), so
// a store outside src/storage (the shared host tier's shm://, pool) implements it without
// depending on the backends.
//
// Shape (CacheLib navy's Device): the public methods are non-virtual and do the argument checks,
// counters and timing; a backend implements the protected Do* hooks. Every call validates its
// arguments, puts the batch on a bounded queue and returns at once; the batch runs on the
// backend's own I/O threads, which call the hook and then complete the call's future (or run its
// callback). A full queue rejects the call with Unavailable; a call never blocks its caller.
// Reads never wait behind a backlog of writes: Exists and Get have a queue of their own, taken
// first by every I/O thread that comes free (at worst a read waits for one running batch), except
// that a read naming a key of a write submitted before it waits for that write (a Get after a Set
// of the same page sees it).
//
// Page buffers are caller memory. A page's payload is the concatenation of its buffer's segments
// (K then V of a page_first / page_first_direct host page, each one contiguous range, so the
// pool's memory is read and written with zero copies; one segment for MLA or a staging buffer).
// CONTRACT: the caller keeps the buffers alive and untouched until the call has completed; a call
// always completes, within `StorageOptions::timeout` of being dequeued (pages not done by then are
// kTimedOut), and after completion the backend never touches the buffers again.
//
// Thread safety: every public method may be called from any thread.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <future>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kvtier/config_schema.h"
#include "kvtier/page_key.h"
#include "kvtier/status.h"

namespace kvtier {

// One page's bytes in caller memory: the payload is segments[0] ‖ ... ‖ segments[n-1].
struct PageBuffer {
  static constexpr int kMaxSegments = 2;
  std::array<std::span<std::byte>, kMaxSegments> segments{};
  int num_segments = 0;

  static PageBuffer Of(std::span<std::byte> whole) { return PageBuffer{{whole, {}}, 1}; }
  static PageBuffer Of(std::span<std::byte> first, std::span<std::byte> second) {
    return PageBuffer{{first, second}, 2};
  }
  int64_t bytes() const {
    int64_t n = 0;
    for (int i = 0; i < num_segments; ++i) n += static_cast<int64_t>(segments[i].size());
    return n;
  }
};

// What happened to one page of a batch.
enum class PageStatus : uint8_t {
  kOk = 0,              // Get: hit, bytes in the buffer; Set / Remove: done
  kAbsent = 1,          // Get: no such object (a miss)
  kCorrupt = 2,         // Get: bad header, checksum, length or key (a miss)
  kWrongNamespace = 3,  // Get: the object belongs to another deployment (a miss)
  kTimedOut = 4,        // not done within the timeout (a miss / a failed set)
  kFailed = 5,          // I/O or server error, no space, rejected (a miss / a failed set)
  kSkipped = 6,         // not attempted: the batch was rejected, or an earlier page cut it
  // Set: not stored for want of room — the page alone is larger than the store's capacity, the
  // file system is full (ENOSPC, EDQUOT), or a Redis server is at its maxmemory (an OOM reply).
  // A store evicting older pages to make room is no such case (that Set is kOk).
  kNoSpace = 7,
};
const char* PageStatusName(PageStatus status);

// The outcome of one batch: `status` is OK when the batch ran (each page then has its own
// outcome), or the reason it did not run at all (InvalidArgument, Unavailable when the queue was
// full or the backend is closing); then every page is kSkipped.
struct BatchResult {
  Status status;
  std::vector<PageStatus> pages;
  // A batch of `num_pages` that did not run: `status` says why, every page is kSkipped.
  static BatchResult Failed(Status status, size_t num_pages);
  // Pages with kOk from the first page on (a prefix is usable only up to its first miss).
  int64_t leading_ok() const;
  int64_t count(PageStatus s) const;
};

// The outcome of Exists: the number of leading keys present (SGLang's batch_exists), or why the
// batch did not run / failed as a whole (then `leading` is 0: nothing is known to be there).
struct ExistsResult {
  Status status;
  int64_t leading = 0;
};

// Bounds and help of every field: StorageOptionsSchema.
struct StorageOptions {
  // The backend's I/O threads, or 0 (the default): from the machine, min(cores, 16) and at
  // least 4 (DefaultIoThreads). A backend's options() show the number used. Reads keep all of
  // them: writes run on up to io_threads threads beyond them (writers_while_reading while reads
  // wait or run), so the backend runs twice io_threads threads (one for io_threads = 1).
  int io_threads = 0;
  // How many threads may run write work while reads wait or run (the writers' share then; alone
  // they may have io_threads), or 0 (the default): a quarter of io_threads, at least 1. More than
  // io_threads counts as io_threads. Fewer leaves the reads more of the machine's cores and
  // memory bandwidth beside a backlog of writes, at the writes' cost (docs/perf-notes/
  // storage-writes.md: reads under writes).
  int writers_while_reading = 0;
  int max_queued_batches = 256;             // reads (and, apart, writes) waiting; more are rejected
  std::chrono::milliseconds timeout{2000};  // per call, from when an I/O thread takes it
  int64_t max_batch_pages = 4096;           // InvalidArgument beyond this
  // A file store's free-space floor (like nginx proxy_cache's min_free): when the free space of
  // the store's file system (statvfs f_bavail) falls under it, whoever fills the disk, the store
  // writes nothing more and evicts its own oldest pages until the free space is back above it.
  // -1 (the default): the larger of 5 % of the file system and min(1 GiB, 20 % of it)
  // (DefaultMinFreeBytes); 0: no floor. Other backends ignore it.
  int64_t min_free_bytes = -1;
  // Every field within its bounds (StorageOptionsSchema); InvalidArgument naming the field
  // (through `name_of`, when given; else "storage options: <field>") and its value.
  Status Validate(const FieldNamer& name_of = nullptr) const;
};

// Every field of StorageOptions: name, bounds and help, declared once (kvtier/config_schema.h);
// the defaults are the member initializers above (`timeout` is the field "timeout_ms", its
// count). StorageOptions::Validate, the cache's storage_* fields (HierarchicalCacheConfigSchema:
// its Validate, the `kvtier replay` flags and the Python keyword arguments) and `kvtier bench
// --storage-threads` are read from it.
const ConfigSchema<StorageOptions>& StorageOptionsSchema();

// What min_free_bytes = -1 means on a file system of `fs_bytes` bytes: the larger of 5 % of it and
// min(1 GiB, 20 % of it) (a 64 GB disk: 3.2 GB; a 4 GiB one: 819 MiB; a 64 MiB tmpfs: 12.8 MiB).
int64_t DefaultMinFreeBytes(int64_t fs_bytes);

// What io_threads = 0 means on this machine: std::thread::hardware_concurrency() capped at 16,
// at least 4 (reads of a page-cached store scale with threads up to about the core count; 4
// keeps a small machine's reads overlapped with its writes).
int DefaultIoThreads();

// Counters (monotonic) and gauges of one backend.
struct StorageStats {
  int64_t exists_calls = 0, get_calls = 0, set_calls = 0, remove_calls = 0;
  int64_t rejected_calls = 0;  // queue full or closing
  int64_t get_hit_pages = 0, get_absent_pages = 0, get_corrupt_pages = 0,
          get_wrong_namespace_pages = 0, get_timed_out_pages = 0, get_failed_pages = 0;
  int64_t set_ok_pages = 0, set_failed_pages = 0, set_timed_out_pages = 0;
  int64_t set_no_space_pages = 0;  // kNoSpace (not in set_failed_pages)
  // Of set_no_space_pages, those the server refused (Redis: OOM at its maxmemory with a policy
  // that does not evict, as noeviction; said in a warning too). 0 for other backends.
  int64_t set_refused_pages = 0;
  int64_t removed_pages = 0;
  int64_t bytes_read = 0, bytes_written = 0;  // payload bytes of hits / successful sets
  double get_seconds = 0, set_seconds = 0;    // I/O-thread time inside the hooks
  // Where Get and Set calls' time went before and inside the hooks, summed over calls (seconds):
  // *_queue_seconds from when a call was accepted (a held read: released) until an I/O thread
  // took it; get_held_seconds a read held behind an earlier write of one of its keys
  // (read-your-writes), counted in get_held_calls; *_page_seconds the I/O threads' time inside
  // the calls' pages, all threads summed (pages a hook runs through ParallelFor; a hook that does
  // not counts its own time once), so get_page_seconds / get_seconds is the mean number of threads
  // a Get had.
  double get_queue_seconds = 0, get_held_seconds = 0, get_page_seconds = 0;
  double set_queue_seconds = 0, set_page_seconds = 0;
  int64_t get_held_calls = 0;
  // Where the Set pages' time inside the hook went, summed over pages and threads (seconds), for
  // backends that profile their writes (file://; elsewhere set_profiled_pages stays 0): creating
  // the page's file, copying into a bounce buffer (direct=1), the checksum, the write calls (the
  // kernel's copy and any wait it imposes for the writeback), fdatasync (fsync=1), publishing
  // (mtime stamp and rename; the directory's fsync with fsync=1), the index (its lock, and the
  // evictions a write makes) and unlinking the evicted pages' files. set_open_dir_seconds is the
  // part of set_open_seconds spent opening the page's directory (file://: its shard directory,
  // walked beneath the store's root), the rest creating the page's temporary file in it.
  int64_t set_profiled_pages = 0;
  double set_open_seconds = 0, set_copy_seconds = 0, set_hash_seconds = 0, set_write_seconds = 0,
         set_sync_seconds = 0, set_publish_seconds = 0, set_index_seconds = 0,
         set_unlink_seconds = 0;
  double set_open_dir_seconds = 0;
  // Get pages the backend read from the page cache and from the disk (file://: a page that
  // needed any read from the disk is a disk page; direct=1 reads are all disk); -1 where the
  // backend cannot tell (memory://, redis://, file:// io_uring reads).
  int64_t get_cached_pages = -1, get_disk_pages = -1;
  // Get pages whose time the backend profiled (file://: one page in 8 of each I/O thread, on the
  // thread path; 0 elsewhere) and that time, summed over pages (seconds): in all, on a core (the
  // threads' CPU time) and runnable with no core free (the scheduler's run delay; -1 where the
  // kernel does not say): whether reads beside writes wait for a core (CPU contention) or run
  // slower on one (memory bandwidth, the kernel's locks).
  int64_t get_profiled_pages = 0;
  double get_profiled_seconds = 0, get_profiled_cpu_seconds = 0,
         get_profiled_core_wait_seconds = -1;
  int64_t queued_batches = 0;                                         // gauge: waiting now
  int64_t stored_pages = -1, stored_bytes = -1, capacity_bytes = -1;  // -1: unknown
  int64_t evicted_pages = 0;  // by the backend's own capacity policy
  // file://: of evicted_pages, those evicted to keep the free space above the floor or because
  // the file system was full; Sets refused (kNoSpace) under the floor with nothing left to
  // evict; writes retried after the file system said it was full (ENOSPC, EDQUOT); the floor in
  // bytes (0: none). 0 for other backends.
  int64_t floor_evicted_pages = 0, floor_refused_pages = 0, disk_full_retries = 0;
  int64_t min_free_bytes = 0;
};

class StorageBackend {
 public:
  virtual ~StorageBackend();  // a backend's destructor calls Close() first
  StorageBackend(const StorageBackend&) = delete;
  StorageBackend& operator=(const StorageBackend&) = delete;

  // ---- asynchronous calls; each returns at once ------------------------------------------
  // `done` runs on an I/O thread when the batch completes (or at once, in the calling thread,
  // when the call is rejected); it must not block for long. The future forms wrap these.
  void ExistsAsync(std::vector<PageKey> keys, std::function<void(ExistsResult)> done);
  // Reads each page into its buffer. REQUIRES: buffers.size() == keys.size(), each buffer's
  // bytes() == ns().page_bytes(). A page that is not kOk leaves its buffer's contents undefined.
  void GetAsync(std::vector<PageKey> keys, std::vector<PageBuffer> buffers,
                std::function<void(BatchResult)> done);
  // Writes each page (atomically: a reader sees the old object, the new one or none).
  void SetAsync(std::vector<PageKey> keys, std::vector<PageBuffer> buffers,
                std::function<void(BatchResult)> done);
  // SetAsync that also tells the store each page's parent: parents[i] is the key of the page
  // before keys[i] in its prompt (nullopt for a prompt's first page, or unknown). A store that
  // evicts by itself (file://, memory://) then takes a chain's tail before its head, so its
  // eviction never leaves a stored page whose prefix page is gone (a page no lookup reaches).
  // InvalidArgument unless parents.size() == keys.size(). Backends that keep no such order
  // (redis: docs/storage.md says which maxmemory policy to use) write the pages as SetAsync does.
  void SetAsync(std::vector<PageKey> keys, std::vector<PageBuffer> buffers,
                std::vector<std::optional<PageKey>> parents, std::function<void(BatchResult)> done);
  void RemoveAsync(std::vector<PageKey> keys, std::function<void(BatchResult)> done);

  std::future<ExistsResult> Exists(std::vector<PageKey> keys);
  std::future<BatchResult> Get(std::vector<PageKey> keys, std::vector<PageBuffer> buffers);
  std::future<BatchResult> Set(std::vector<PageKey> keys, std::vector<PageBuffer> buffers);
  std::future<BatchResult> Set(std::vector<PageKey> keys, std::vector<PageBuffer> buffers,
                               std::vector<std::optional<PageKey>> parents);
  std::future<BatchResult> Remove(std::vector<PageKey> keys);

  // Stops taking calls (later calls are rejected with Unavailable), lets queued and running
  // batches finish (each within its timeout), and joins the I/O threads. Idempotent.
  // REQUIRES: not called from one of this backend's `done` callbacks (it would wait for itself).
  void Close();

  // ---- retention (synchronous, in memory; HierarchicalCache::Pin) -------------------------
  // Keeps `keys` out of the backend's own eviction for `ttl` (nanoseconds::max(): until
  // UnpinPages) — pages stored now and pages stored later alike — and returns the pin's id.
  // Expired pins are dropped lazily, by the eviction that meets them. Pins live in this backend
  // object's store, in this process: other processes sharing a file store's directory do not see
  // them. A store whose room is all pinned refuses (or drops at once) a new page rather than
  // evict a pinned one. FailedPrecondition from a backend whose eviction kvtier does not control
  // (Redis: its maxmemory policy decides; see docs/architecture.md); InvalidArgument for
  // ttl <= 0. The keys are copied (the caller bounds how many: the cache's pin budget).
  Result<uint64_t> PinPages(std::span<const PageKey> keys, std::chrono::nanoseconds ttl);
  // Ends a pin now. InvalidArgument for an unknown or expired pin id.
  Status UnpinPages(uint64_t pin);

  // ---- listing (synchronous, on the caller's thread; PageStore.clear) ---------------------
  // The keys of this namespace's pages the store holds now: file:// scans the namespace's
  // directory (pages other processes wrote included; no payload is read), memory:// walks its
  // map. A page written or evicted meanwhile may or may not be listed. FailedPrecondition from a
  // store that cannot list one namespace's pages (Redis: its keys are not indexed by namespace).
  Result<std::vector<PageKey>> StoredKeys();

  // ---- pages the store evicted by itself (KV events: HierarchicalCache) --------------------
  // A store that evicts on its own (file:// by its capacity and free-space floor, memory:// by its
  // capacity) records the keys it evicted while tracking is on (off by default: nothing is kept
  // when nobody takes them), up to kMaxTrackedEvictions (then the oldest are dropped and
  // counted). TakeEvictions returns them, oldest first, and forgets them; `dropped` (when given)
  // gets how many were dropped since the last call. Wrappers pass both on to the store they wrap.
  // Stores whose eviction kvtier cannot see (Redis: its maxmemory) record nothing; the cache
  // learns of those from a lookup's or a read's miss.
  static constexpr size_t kMaxTrackedEvictions = size_t{1} << 20;
  virtual void TrackEvictions(bool on);
  virtual std::vector<PageKey> TakeEvictions(int64_t* dropped = nullptr);

  StorageStats Stats() const;
  const StorageNamespace& ns() const { return ns_; }
  const StorageOptions& options() const { return options_; }
  // "file:///dir", "redis://host:port", ... without credentials.
  const std::string& url() const { return url_; }

 protected:
  StorageBackend(std::string url, StorageNamespace ns, StorageOptions options);

  // Starts the I/O threads. A backend calls it at the end of its own setup.
  Status Start();

  // For hooks: runs fn(0) ... fn(n - 1), in parallel on this backend's idle I/O threads (read
  // work before write work; a write's pages within the writes' share of the threads) and on the
  // calling one, and returns when all have returned. Called from any other thread, or with
  // io_threads = 1, it runs them in order on the caller. `fn` must not throw.
  void ParallelFor(int64_t n, const std::function<void(int64_t)>& fn);

  // For hooks: whether a Set or Remove naming `key` is queued or running (the calling hook's own
  // batch included). A store that drops a page whose parent is gone asks it first: a parent still
  // being written is not gone.
  bool WritePending(const PageKey& key) const;

  // Hooks, called on an I/O thread with validated arguments; they must return by `deadline`
  // (pages not done then are kTimedOut) and never throw. `out` has one entry per key,
  // pre-filled with kSkipped.
  virtual ExistsResult DoExists(std::span<const PageKey> keys,
                                std::chrono::steady_clock::time_point deadline) = 0;
  virtual void DoGet(std::span<const PageKey> keys, std::span<const PageBuffer> buffers,
                     std::span<PageStatus> out, std::chrono::steady_clock::time_point deadline) = 0;
  virtual void DoSet(std::span<const PageKey> keys, std::span<const PageBuffer> buffers,
                     std::span<PageStatus> out, std::chrono::steady_clock::time_point deadline) = 0;
  // A Set with the pages' parents (one per key). The default writes them with DoSet; a backend
  // with its own eviction order records the parents (chain_lru.h), a wrapper passes them on.
  virtual void DoSetChained(std::span<const PageKey> keys, std::span<const PageBuffer> buffers,
                            std::span<const std::optional<PageKey>> parents,
                            std::span<PageStatus> out,
                            std::chrono::steady_clock::time_point deadline) {
    (void)parents;
    DoSet(keys, buffers, out, deadline);
  }
  virtual void DoRemove(std::span<const PageKey> keys, std::span<PageStatus> out,
                        std::chrono::steady_clock::time_point deadline) = 0;
  // PinPages / UnpinPages with checked arguments, on the caller's thread. The defaults refuse
  // (FailedPrecondition): the backend cannot keep pages from being evicted.
  virtual Result<uint64_t> DoPinPages(std::span<const PageKey> keys, std::chrono::nanoseconds ttl);
  virtual Status DoUnpinPages(uint64_t pin);
  // StoredKeys. The default refuses (FailedPrecondition).
  virtual Result<std::vector<PageKey>> DoStoredKeys();
  // Called by Close after the I/O threads have stopped (on Close's thread, under its lock; on
  // every Close call, so it must be idempotent): a backend finishes its own background work
  // here (the file store writes its pending hit stamps). The default does nothing.
  virtual void DoClose() {}
  // For backends: records keys this store just evicted by itself (TrackEvictions); any thread.
  void NoteEvicted(std::span<const PageKey> keys);
  // Backend-specific gauges (stored_pages, stored_bytes, capacity_bytes, evicted_pages,
  // get_cached_pages, get_disk_pages).
  virtual void FillStats(StorageStats& /*stats*/) const {}
  // Called on the caller's thread by every Exists / Get / Set / Remove call (async and future
  // forms) before anything else. A non-OK status rejects the call with it (`done` runs at once,
  // in the calling thread, as for a full queue). The default accepts every call; test wrappers
  // use it to check the caller's state (e.g. that it holds no cache mutex).
  virtual Status CheckCaller(std::string_view /*call*/) const { return Status::OK(); }

 private:
  struct Queue;      // the bounded queue and the I/O threads (storage_backend.cc)
  struct Evictions;  // the tracked self-evictions (storage_evictions.cc)
  const std::string url_;
  const StorageNamespace ns_;
  const StorageOptions options_;
  std::unique_ptr<Queue> queue_;
  // Made by the first TrackEvictions(true); read and set through std::atomic_load / store.
  std::shared_ptr<Evictions> evictions_;
};

}  // namespace kvtier
