// Internal: the file store's index — which pages one process knows to be stored in a namespace
// directory, their LRU order and byte count against the capacity, the stamps that carry that
// order across restarts, and the restart scan that rebuilds it. No page I/O here: the file
// backend (file_backend.cc, through file_page_io.h) reads and writes the pages and tells the
// index what it found.
//
// Eviction takes a chain's tail before its head (chain_lru.h): a page written with its parent's
// key is evicted only after every stored page naming it as parent, so eviction never leaves a
// stored page whose prefix page is gone. Each page file's header names its parent too (page
// format version 2, page_format.h), so the restart scan rebuilds the chains. Roots (plain LRU
// among the leaves): pages written without a parent, and pages of format version 1 (an older
// kvtier) or whose header does not check out found at a restart or by a lookup. A page another
// process wrote into the same directory, found by a lookup (AddFound from Exists, Touch from Get),
// is added with the parent its header names, so this process evicts it after its children too.
//
// Stamps: nanoseconds since the epoch, stored as each page file's mtime. Every stamp handed out
// is strictly greater than every stamp handed out before or loaded at start. A write's stamp is
// stored with the file, before its rename. A hit's (Touch) is needed on disk only when the file's
// mtime is older than it by more than the backend's granularity (kStampGranularityNs in
// file_backend.cc, 1 s), so a page read over and over costs one inode write a second, not one
// per read; and it is not written on the read path: the backend keeps it pending (a bounded map,
// HitStamper in file_backend.cc) and its stamper thread writes it behind the reads, within about
// 0.5 s, and every pending one at Close (within 2 s), each only onto the file that was hit and
// only when that file's mtime is older (never over a page written after the hit). The order in
// this index is exact (a hit queued behind a writer included: "Deferred touches" below). The order
// a restart recovers by sorting the files by mtime is exact to within the granularity, once the
// pending stamps are written: of two pages last used further apart the later is the more recent
// after the restart, while a page hit again within the granularity of its stamp keeps its earlier
// place. Approximations beyond that: a crash (or a Close past its budget) loses the pending stamps,
// so a restart orders pages hit in the last ~0.5 s by their earlier stamps; and when more hits are
// pending than the bound (64 Ki pages) the oldest pending is dropped (counted), its page keeping
// its earlier stamp on disk.
//
// Invariants (under `mu_`): `pages_` holds the known pages, their parents and recency; its bytes
// are the sum of their sizes and, after Put or Load returns, at most `capacity` (except a lone page
// larger than the capacity, which Put never admits: the backend refuses such a Set before writing;
// and pinned pages filling it: eviction skips pages `pinned` names, and a page Put finds no
// unpinned room for is evicted itself).
//
// Deferred touches (issue 23): `remove` runs under the index's mutex (so a victim's file goes
// before another thread can add the same key again), and an unlink under heavy writes can take
// milliseconds, so a read must not wait for that mutex to record its hit. Touch only tries it:
// when another thread holds it, the touch is queued (its key, bytes, parent and the mtime the
// read saw) in a bounded buffer under its own mutex, never held across I/O nor while taking
// `mu_`, and Touch returns at once. Every other method that takes `mu_` and reads or changes the
// order or the set of pages (Load, Put and its eviction, Touch, AddFound, DropOrphan,
// Erase, LruOrder, ParentOf, ApplyPendingTouches) first applies the queued touches, in the order
// they were queued, each then getting its stamp; a queued touch of a key no longer stored (evicted
// or erased meanwhile; or a page another process wrote, not yet known here) is skipped, so no
// touch brings back a page whose file may be gone. So every eviction decision sees every hit
// recorded before it: the order stays exact. (Contains, Gone, pages(), bytes(), evicted() do
// not apply them: a queued touch of a stored page changes neither the set nor, a page's size
// being its namespace's, the bytes.) Past the bound (kPendingTouchLimit) the oldest queued touch is
// dropped and counted: its page keeps its earlier place.
//
// Stamps of hits: a touch's stamp is assigned when it is applied (at once, or later by the next
// method above), and handed with the page's key and the mtime the read saw to `on_touched`, called
// under `mu_` (it must not call back into the index; the backend adds the stamp to its stamper,
// which takes only its own mutex, when the mtime is older than the stamp by more than its
// granularity). The backend applies what is queued at Close, before its stamper's last writes.
//
// Thread safety: every method may be called from any thread; `remove`, `pinned` and
// `on_touched` run under the index's mutex and must not call back into the index. Lock order:
// `mu_` before `pending_mu_`.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <optional>
#include <vector>

#include "kvtier/page_key.h"
#include "kvtier/status.h"
#include "storage/chain_lru.h"
#include "util/mutex.h"
#include "util/thread_annotations.h"

namespace kvtier::storage {

class FileIndex {
 public:
  // A page found on disk at start.
  struct Found {
    Found() = default;
    Found(const PageKey& key, int64_t bytes, int64_t stamp,
          std::optional<PageKey> parent = std::nullopt, uint16_t version = 0)
        : key(key), bytes(bytes), stamp(stamp), parent(parent), version(version) {}

    PageKey key;
    int64_t bytes = 0;
    int64_t stamp = 0;
    std::optional<PageKey> parent;  // what its header names (nullopt: none, or unknown)
    // Its header's format version; 0 when the header does not check out (the page is a miss when
    // read: kept in the index until then, as before the scan read headers).
    uint16_t version = 0;
  };

  // What a touch hands to `on_touched`: the page, the stamp it got, the mtime the read saw.
  using OnTouched = std::function<void(const PageKey& key, int64_t stamp, int64_t mtime_ns)>;

  // Touches recorded at once, queued behind another thread holding the index, and dropped from
  // a full queue (oldest first) since construction.
  struct TouchCounts {
    int64_t at_once = 0;
    int64_t deferred = 0;
    int64_t dropped = 0;
  };

  // The most touches queued (deferred touches above); more drop the oldest.
  static constexpr size_t kPendingTouchLimit = size_t{64} << 10;

  // `capacity` > 0: the most bytes of pages kept; `remove` deletes an evicted page's file;
  // `pinned` (null: none) names pages eviction must skip (storage/page_pins.h); `on_touched`
  // (null: none) gets each applied touch's stamp ("Stamps of hits" above). All three are called
  // under the index's mutex.
  FileIndex(int64_t capacity, std::function<void(const PageKey&)> remove,
            std::function<bool(const PageKey&)> pinned = nullptr, OnTouched on_touched = nullptr);

  // Loads the pages found at start (any order) with their parents: oldest stamp least recently
  // used. Later stamps are greater than all of theirs. Evicts down to the capacity (it may have
  // shrunk since), a chain's tail first.
  void Load(std::vector<Found> found) KVTIER_EXCLUDES(mu_);

  // A stamp for a page about to be written or just hit (strictly increasing).
  int64_t NextStamp() KVTIER_EXCLUDES(mu_);

  // A page just written (or replaced) with `stamp`: most recently used, its parent recorded when
  // given (nullopt: unknown, or the one recorded before); then evicts until the bytes fit, each
  // victim the least recently used page no stored page names as parent (the page itself last:
  // when it is the only such page, the tail of a chain longer than the room).
  void Put(const PageKey& key, int64_t bytes, int64_t stamp,
           const std::optional<PageKey>& parent = std::nullopt) KVTIER_EXCLUDES(mu_);
  // A page just read and checked (`mtime_ns`: its file's mtime the read saw): most recently used,
  // with a new stamp, handed to `on_touched` and returned, when the index's mutex is free; when
  // another thread holds it, queued and applied before the next use of the order (deferred
  // touches above), nullopt returned at once. `parent`: what its header names (nullopt keeps the
  // parent recorded; an unknown key, one another process wrote, is then a root when touched at
  // once, skipped when queued).
  std::optional<int64_t> Touch(const PageKey& key, int64_t bytes,
                               const std::optional<PageKey>& parent = std::nullopt,
                               int64_t mtime_ns = 0) KVTIER_EXCLUDES(mu_, pending_mu_);
  // Applies the queued touches now (the backend's Close, before its stamper's last writes).
  void ApplyPendingTouches() KVTIER_EXCLUDES(mu_, pending_mu_);
  TouchCounts touch_counts() const KVTIER_EXCLUDES(mu_, pending_mu_);
  // Sets the queue's bound (tests: a tiny one); > 0.
  void set_pending_touch_limit(size_t limit) KVTIER_EXCLUDES(pending_mu_);
  // A page another process wrote, found by a lookup, with the parent its header names (nullopt:
  // none, or a header of version 1 or that does not check out: a root): least recently used
  // (nobody here used it), unless already known. No eviction (its bytes are another process's
  // count too). Whether it was added.
  bool AddFound(const PageKey& key, int64_t bytes, int64_t stamp,
                const std::optional<PageKey>& parent = std::nullopt)
      KVTIER_EXCLUDES(mu_, pending_mu_);
  // Evicts `key` (its file removed) when `parent` is not stored and either `parent_in_batch` (a
  // page of the same Set) or evicted by this index: a page written after its parent went
  // (DropOrphans in chain_lru.h). Whether it did.
  bool DropOrphan(const PageKey& key, const PageKey& parent, bool parent_in_batch)
      KVTIER_EXCLUDES(mu_, pending_mu_);
  // Evicts pages in eviction order (a chain's tail first, pinned pages skipped) until their bytes
  // reach `bytes` or none is left to evict: the free-space floor (disk_space.h) or a full disk.
  // The pages evicted.
  int64_t EvictOldest(int64_t bytes) KVTIER_EXCLUDES(mu_, pending_mu_);
  // Whether `key` is not stored and was evicted here (OrphansToSkip in chain_lru.h).
  bool Gone(const PageKey& key) const KVTIER_EXCLUDES(mu_);
  // Forgets a page (removed, found absent or corrupt). No effect for an unknown key.
  void Erase(const PageKey& key) KVTIER_EXCLUDES(mu_, pending_mu_);

  bool Contains(const PageKey& key) const KVTIER_EXCLUDES(mu_);
  int64_t capacity() const { return capacity_; }
  int64_t pages() const KVTIER_EXCLUDES(mu_);
  int64_t bytes() const KVTIER_EXCLUDES(mu_);
  int64_t evicted() const KVTIER_EXCLUDES(mu_);
  // Keys from most to least recently used (tests; queued touches applied first).
  std::vector<PageKey> LruOrder() KVTIER_EXCLUDES(mu_, pending_mu_);
  // The parent recorded for `key` (tests; nullopt: none or unknown key; queued touches applied
  // first).
  std::optional<PageKey> ParentOf(const PageKey& key) KVTIER_EXCLUDES(mu_, pending_mu_);

 private:
  struct PendingTouch {
    PageKey key;
    int64_t bytes = 0;
    std::optional<PageKey> parent;
    int64_t mtime_ns = 0;
  };

  // Under `mu_`: the queued touches, oldest first; each of a key still stored gets its stamp.
  void ApplyPendingLocked() KVTIER_REQUIRES(mu_) KVTIER_EXCLUDES(pending_mu_);
  // Under `mu_`: `key` most recently used with a new stamp, handed to `on_touched_`.
  int64_t TouchLocked(const PageKey& key, int64_t bytes, const std::optional<PageKey>& parent,
                      int64_t mtime_ns) KVTIER_REQUIRES(mu_);
  int64_t NextStampLocked() KVTIER_REQUIRES(mu_);
  void EvictLocked(const PageKey* keep) KVTIER_REQUIRES(mu_);

  const int64_t capacity_;
  const std::function<void(const PageKey&)> remove_;
  const std::function<bool(const PageKey&)> pinned_;
  const OnTouched on_touched_;
  mutable util::Mutex mu_;
  ChainLru<PageKey, PageKeyHash> pages_ KVTIER_GUARDED_BY(mu_);
  int64_t evicted_ KVTIER_GUARDED_BY(mu_) = 0;
  int64_t last_stamp_ KVTIER_GUARDED_BY(mu_) = 0;
  int64_t touched_at_once_ KVTIER_GUARDED_BY(mu_) = 0;

  // The queued touches (taken without `mu_`; `mu_` before it when both are held).
  mutable util::Mutex pending_mu_;
  std::deque<PendingTouch> pending_ KVTIER_GUARDED_BY(pending_mu_);
  size_t pending_limit_ KVTIER_GUARDED_BY(pending_mu_) = kPendingTouchLimit;
  int64_t deferred_ KVTIER_GUARDED_BY(pending_mu_) = 0;
  int64_t dropped_ KVTIER_GUARDED_BY(pending_mu_) = 0;
  // Whether `pending_` may be non-empty: lets the methods above skip `pending_mu_` when nothing
  // is queued (set under `pending_mu_` by a queueing Touch, cleared under both mutexes).
  std::atomic<bool> has_pending_{false};
};

// The restart scan of a namespace directory (held open as `ns_dirfd`) of the namespace whose hash
// is `namespace_hash`: every regular file named by the hex of a key inside the shard directory of
// its first two digits, with its size, mtime and the parent its header names (one open and one
// read of the header's bytes per page; the payload is not read, its checks wait for the Get),
// in no particular order. Shards are scanned by 16 threads at once (joined before it returns).
// Temporary files (".tmp.<pid>.<n>.<hex>") whose writer process is gone are removed; anything
// else (other names, symlinks, a shard directory that is a symlink) is left alone and not indexed.
// IOError when a shard directory exists but cannot be read.
Result<std::vector<FileIndex::Found>> ScanPages(int ns_dirfd, uint64_t namespace_hash);

// Fills `f.parent` and `f.version` from the header of the page file open as `fd` (`f.key` and
// `f.bytes`, its size, already set) when it checks out; leaves them unset otherwise (a file
// shorter than a page's header block, a read error or short read, a header that does not check
// out). One pread of kMaxPageHeaderBytes at offset 0; the payload is not read.
void ReadFoundHeader(int fd, uint64_t namespace_hash, FileIndex::Found& f);

// The name prefix of a page file being written.
inline constexpr std::string_view kTempPrefix = ".tmp.";

}  // namespace kvtier::storage
